// Swizzled shared-memory tiles of 16-bit elements.
//
// A [kRows][kCols] tile is stored as column blocks of kAtom 16-byte chunks
// (8 elements each); inside a block, row r holds its kAtom chunks with the
// chunk index XOR-ed by a function of r. Eight consecutive rows at the same
// logical chunk then land in eight different 16-byte bank groups, so ldmatrix
// (8 row addresses per matrix) and the 16-byte row copies are conflict-free
// without padding.
//   kAtom = 8 (128-byte block rows, head dims 64/128/192/256): chunk ^ (r % 8)
//   kAtom = 4 (64-byte block rows, head dims 32/96): chunk ^ ((r / 2) % 4);
//     two rows share a 128-byte line, so 8 rows still cover 8 distinct groups.
#pragma once

#include <cstdint>

#include "cuda/common/mma.h"

namespace flashattn::cuda {

// A lane's part of a fragment address (see SwizzledTile::lane).
struct SwizzleLane {
  uint32_t row_bytes;
  int sw;
};

template <int Rows, int Cols>
struct SwizzledTile {
  static constexpr int kRows = Rows;
  static constexpr int kCols = Cols;
  static constexpr int kChunks = Cols / 8;  // 16-byte chunks per row
  static constexpr int kAtom = kChunks % 8 == 0 ? 8 : 4;
  static constexpr int kBytes = Rows * Cols * 2;
  static_assert(Cols % 32 == 0 && kChunks % kAtom == 0, "tile width must be a multiple of 32");
  static_assert(Rows % 8 == 0, "tile height must be a multiple of 8");

  __device__ __forceinline__ static int swizzle(int r) {
    return kAtom == 8 ? (r & 7) : ((r >> 1) & 3);
  }

  // Byte offset of chunk c (elements 8c..8c+7) of row r.
  __device__ __forceinline__ static uint32_t offset(int r, int c) {
    const int block = c / kAtom, cc = c % kAtom;
    return static_cast<uint32_t>(((block * Rows + r) * kAtom + (cc ^ swizzle(r))) * 16);
  }

  // Fragment addressing for ldmatrix: a lane reads row r_lane + R, chunk
  // c_lane + C, with R a multiple of 8 and C even (both compile-time in
  // unrolled loops), r_lane < 16, c_lane in {0, 1}. The lane's part of the
  // swizzle is computed once; each access is then one XOR and one add.
  using Lane = SwizzleLane;  // the same for every tile of this width
  __device__ __forceinline__ static Lane lane(int r_lane, int c_lane) {
    return {static_cast<uint32_t>(r_lane * kAtom * 16), c_lane ^ swizzle(r_lane)};
  }
  __device__ __forceinline__ static uint32_t at(const Lane& l, int R, int C) {
    return static_cast<uint32_t>(((C / kAtom) * Rows + R) * kAtom * 16) + l.row_bytes +
           static_cast<uint32_t>(((C % kAtom) ^ l.sw) << 4);
  }
};

}  // namespace flashattn::cuda
