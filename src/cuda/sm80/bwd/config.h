// Tile shapes of the sm80 backward kernel: the one place its tuning lives.
//
// NOTES: The kernel keeps the dK and dV accumulators of its key tile in
// registers for the whole walk over query tiles, so the tile is sized by the
// register file first: (BN x D) f32 twice over 256 threads is 2*BN*D/256
// registers per thread, and S, dP (BM x BN) plus the dQ tile (BM x D) come on
// top. 255 is the hard limit and spilling is not allowed (ptxas -v is clean
// for sm_80 and sm_90a at every head dim), so:
//   D 64:       BM 128, BN 128: dK+dV 64 regs, S+dP 128. Twice the query rows
//               per barrier of BM 64, which amortizes the per-tile fixed costs
//               (barriers, P/dS stores, dQ reds): 0.72x -> 0.80x FA2 (H100,
//               quick bench, 2026-11-22).
//   D 32..128:  BM 64, BN 128: dK+dV <= 128 regs, S+dP 64. A 128-key tile
//               halves how often each Q/dO tile is read per key compared to
//               BN 64, and the dQ reds per key.
//   D > 128:    BM 64, BN 64: dK+dV <= 128 regs at D 256 (dQ in two halves).
// Warp layouts (warps along the M dimension of each product, the rest along N)
// favour tall-and-wide warp tiles: a warp tile of m x n loads m/16 A and n/16
// B ldmatrix.x4 per k-step for m*n/128 mma.sync, and shared-memory traffic,
// not the tensor cores, is what mma.sync kernels run out of on Hopper.
// Measured: D 128 with S/dP as 2 x 4 warps (32 x 32) instead of 4 x 2 in two
// column slices: +12% (231 -> 258 TFLOP/s at seqlen 4k); D 256 with dK/dV as
// 2 x 4 (32 x 64) instead of 4 x 2 (16 x 128): +3%.
//   S = Q K^T and dP = dO V^T (BM x BN): 2 x 4 warps for BN 128 (4 x 2 at D 64,
//                                         BM 128), 4 x 2 for BN 64.
//   dV, dK (BN x D):                      4 x 2 warps (2 x 4 at D 256).
//   dQ (BM x D):                          2 x 4 warps where D/4 is a multiple
//                                         of 16, else 4 x 2 (and at D 64).
// sm_80 code has no two-wide red, so its dQ adds take twice the instructions
// and registers: at D 128 it spilled, and there (only) S/dP and dQ are done in
// two column slices each. These fields are used by device code alone, so the
// host pass (no __CUDA_ARCH__) never sees them disagree with the kernel.
// Q/dO are double-buffered (cp.async of the next query tile overlaps the
// current one's math) when the device has the shared memory for it (H100:
// 227 KB per block; A100, 163 KB, runs D 64, 128, 192, 256 single-buffered).
#pragma once

namespace flashattn::cuda::bwd {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// kBlockSparse: the block-sparse walk's instantiation (query_walk.cuh,
// ListedQueries); the others are the same for both.
template <int D, bool kBlockSparse = false>
struct Config {
  static constexpr int kHeadDim = D;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr bool kSm80Tight = D == 128;
#else
  static constexpr bool kSm80Tight = false;
#endif
  static constexpr int kBlockM = D == 64 ? 128 : 64;
  static constexpr int kBlockN = D <= 128 ? 128 : 64;
  // Warps along M for each product (kWarps / that along N).
  static constexpr int kSdpWarpsM = D == 64 || kBlockN == 64 || kSm80Tight ? 4 : 2;
  static constexpr int kDkvWarpsM = D == 256 ? 2 : 4;
  static constexpr int kDqWarpsM = D != 64 && (D / 8) % 16 == 0 ? 2 : 4;
  // Column slices of the S/dP warp tile and of the dQ tile (each slice is
  // finished before the next): fewer live accumulators for more ldmatrix.
  static constexpr int kSdpSplits = kSm80Tight ? 2 : 1;
  // Block-sparse, D 256: dQ in four slices. The walk's state (its lists, the
  // slice's listed pairs, the deterministic predecessor) on top of the dense
  // kernel's 255 registers spilled 8-20 bytes in either build (sm_80, sm_90a)
  // however placed; four slices leave 253-254 registers and no spill.
  static constexpr int kDqSplits = kBlockSparse && D == 256 ? 4 : D == 256 || kSm80Tight ? 2 : 1;
  // Shared-memory rows are padded by one 16-byte chunk: a row of C chunks then
  // starts C+1 chunks after the previous one, and with C+1 odd the 8 rows an
  // ldmatrix reads land on 8 distinct bank groups (conflict-free) for every D.
  static constexpr int kRowStride = D + 8;        // Q, dO, K, V (elements)
  static constexpr int kPStride = kBlockN + 8;    // P, dS (elements)
};

}  // namespace flashattn::cuda::bwd
