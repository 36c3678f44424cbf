// Tile shapes of the sm80 backward kernel: the one place its tuning lives.
//
// NOTES: The kernel keeps the dK and dV accumulators of its key tile in
// registers for the whole walk over query tiles, so the tile is sized by the
// register file first: (BN x D) f32 twice over 256 threads is 2*BN*D/256
// registers per thread, and S, dP (BM x BN) plus the dQ tile (BM x D) come on
// top. 255 is the hard limit and spilling is not allowed, so:
//   D <= 128: BM 64, BN 128 -> dK+dV <= 128 regs, S+dP 64 regs.  A 128-key
//             tile halves how often each Q/dO tile is read per key compared
//             to BN 64, and the dQ atomics per key (BM*D per 128 keys).
//   D  > 128: BM 64, BN 64  -> dK+dV <= 128 regs at D 256 (dQ 64 regs).
// BM stays 64: the S/dP tiles and the P/dS shared buffers scale with BM*BN,
// and a smaller BM doubles the dK/dV-vs-dQ traffic ratio the wrong way.
// Warp layouts (warps along the M dimension of each product, the rest along N)
// favour tall-and-wide warp tiles: a warp tile of m x n loads m/16 A and n/16
// B ldmatrix.x4 per k-step for m*n/128 mma.sync, and shared-memory bandwidth,
// not the tensor cores, is what mma.sync kernels run out of on Hopper.
//   S = Q K^T and dP = dO V^T (BM x BN): 2 x 4 warps (32 x 32) for BN 128,
//                                         4 x 2 warps (16 x 32) for BN 64 and
//                                         for D 128 (16 x 64 in two slices).
//   dV, dK (BN x D):                      4 x 2 warps.
//   dQ (BM x D):                          2 x 4 warps (32 x D/4) where D/4 is a
//                                         multiple of 16 (D 64, 128, 192: fewer A
//                                         reloads, and it is what fits 255
//                                         registers at D 128), else 4 x 2; D 256
//                                         in two column halves of 4 x 2.
// Q/dO are double-buffered (cp.async of the next query tile overlaps the
// current one's math) when the device has the shared memory for it (H100:
// 227 KB per block; A100: 163 KB runs D 256 single-buffered).
#pragma once

namespace flashattn::cuda::bwd {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <int D>
struct Config {
  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = D <= 128 ? 128 : 64;
  // Warps along M for each product (kWarps / that along N).
  // (D 128 takes 4 x 2: with the column slices below its A fragments are half
  // those of 2 x 4 for the same ldmatrix count, which is what keeps it under
  // 255 registers with S and dP interleaved.)
  static constexpr int kSdpWarpsM = kBlockN == 128 && D != 128 ? 2 : 4;
  static constexpr int kDkvWarpsM = 4;
  static constexpr int kDqWarpsM = (D / 8) % 16 == 0 && D != 256 ? 2 : 4;
  // S and dP in column slices of the warp tile, each turned into P and dS
  // before the next: at D 128 the dK+dV accumulators (128 regs) plus whole S
  // and dP warp tiles (64) spilled in the inner loop (ptxas: 68 B); halves hold
  // 32 and do not spill, for one more read of the Q/dO fragments per slice.
  static constexpr int kSdpSplits = D == 128 ? 2 : 1;
  // dQ in column slices of D / kDqSplits: at D 256 dK+dV take 128 registers
  // and a whole 64x256 f32 dQ tile (64 more) spilled.
  static constexpr int kDqSplits = D == 256 || D == 128 ? 2 : 1;
  // Shared-memory rows are padded by one 16-byte chunk: a row of C chunks then
  // starts C+1 chunks after the previous one, and with C+1 odd the 8 rows an
  // ldmatrix reads land on 8 distinct bank groups (conflict-free) for every D.
  static constexpr int kRowStride = D + 8;        // Q, dO, K, V (elements)
  static constexpr int kPStride = kBlockN + 8;    // P, dS (elements)
};

// The kernel head dims (one instantiation each); a head dim runs on the
// smallest one at least as large.
inline int kernel_head_dim(int d) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  if (d <= 96) return 96;
  if (d <= 128) return 128;
  if (d <= 160) return 160;
  if (d <= 192) return 192;
  return 256;
}

}  // namespace flashattn::cuda::bwd
