// Where a 16-byte chunk of a K/V row sits in the decode kernel's shared-memory
// ring (common.cuh: Traits::ring_elem). Host and device arithmetic, tested on
// the CPU (tests/test_decode_split.cpp).
#pragma once

#include "attention/host_device.h"

namespace flashattn::cuda::decode {

// NOTES: rows are unpadded and chunk c of row r sits at c ^ (r % 8), for rows
// of any multiple of 8 chunks (head dims 64, 128, 256). Two properties the
// kernel relies on:
// - an ldmatrix reads chunk c of eight consecutive rows from a multiple of 8;
//   their positions c ^ 0 .. c ^ 7 differ in the low three bits, i.e. fall in
//   the eight 16-byte bank groups of shared memory: no conflict;
// - the chunks 2k and 2k + 1 of a row (one 32-byte sector of the global row)
//   land on 2k ^ x and 2k + 1 ^ x, one aligned 32-byte block: a copy then
//   costs one L2 request per sector (docs/performance.md 3.6).
FA_HOST_DEVICE constexpr int ring_chunk(int row, int chunk) { return chunk ^ (row % 8); }

}  // namespace flashattn::cuda::decode
