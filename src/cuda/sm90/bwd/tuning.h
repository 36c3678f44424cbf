// Every tuning choice of the Hopper backward kernel, per head dim, in one place.
//
// Shape: one CTA per key tile of kBlockN = 128 keys (one kv head of one
// sequence); two consumer warpgroups own 64 keys each (wgmma's M is 64 per
// warpgroup, so dK and dV of a warpgroup's keys live in its registers for the
// whole walk over query tiles), plus one producer warpgroup whose first warp
// loads Q, dO (TMA) and the lse / D rows of each query tile into a kStages ring.
//   kBlockM   query rows per tile: the N of S^T = K Q^T and dP^T = V dO^T, the
//             K of dV += P^T dO and dK += dS^T Q. Bounded by registers: a
//             consumer thread holds dK + dV (2 * 64 * d / 128 = d regs), S^T and
//             dP^T (2 * 64 * kBlockM / 128 = kBlockM regs) and then P^T, dS^T as
//             16-bit A fragments (kBlockM / 2 regs) with the dQ tile (32 regs).
//             The dS^T tile is also what one barrier per query tile exchanges.
//   kStages   Q/dO ring depth: smem = 2 * kBlockN*d*2 (K, V) + kStages * 2 *
//             kBlockM*d*2 (Q, dO) + 2 * kBlockN*kBlockM*2 (dS^T, double-buffered)
//             + kDqBufs * kBlockM*d*4 (dQ tiles) <= 227 KB.
//   kOverlapP compute P^T while dP^T's wgmmas still run (S^T and dP^T are
//             separate commit groups) instead of waiting for both.
//   kEarlyDv  issue dV += P^T dO as soon as P is ready, so it runs on the tensor
//             cores while dS is computed; P's fragments (kBlockM / 4 regs) are
//             then live next to S^T, dP^T, dK and dV.
//   kDqTma    dQ partial tiles go to shared memory and one warp of the producer
//             warpgroup adds them into the f32 accumulator with TMA reduce-adds
//             (FA3's way), instead of consumer threads issuing red.global
//             adds (red.v2 from the fragment; at d 256 red.v4 along rows).
//             At d 64/128 the deterministic mode needs the TMA path.
//   kDqBufs   dQ tiles in flight (kBlockM*d*4 bytes each).
//   kDqAlternate  dQ = dS K of a query tile computed whole by one consumer
//             warpgroup, the two taking the tiles in turn (mainloop.cuh
//             NOTES), instead of each computing half of every tile's: the
//             other warpgroup's next S^T, dP^T fill the tensor cores while
//             dQ is finished and staged. Needs the TMA reducer (whole tiles).
//   kProducerRegs / kConsumerRegs: setmaxnreg split, 128 * (24 + 2 * 240) <= 65536.
// ptxas must neither spill nor serialize the wgmmas ("C7512: wgmma.mma_async
// instructions are serialized due to insufficient register resources", which
// it reports with -Xptxas -v only): check both after every change here.
// dQ = dS K (M = queries, N = d, K = keys): with kDqAlternate one consumer
// warpgroup computes a tile's whole dQ, the two in turn; otherwise it is
// split between them along the queries when kBlockM = 128, along d when
// kBlockM = 64 (each runs m64n64 wgmmas over all 128 keys).
//
// What runs here and what falls back to the sm80 kernel (api.cu decides):
//   here:     f16/bf16, head_dim 64, 128 and 256 exactly, causal / sliding window
//             (bottom-right), GQA/MQA (the CTA loops over the query heads of
//             its group, as sm80 does), varlen (zero-length sequences
//             included), fully masked rows (zero gradients),
//             deterministic mode (ordered TMA dQ adds at d 64/128, ordered
//             red.global adds at d 256; dq.cuh NOTES), softcap, ALiBi and
//             both (softmax.cuh).
//   fallback: softcap with ALiBi and dropout or a block mask (no kernel of
//             SoftcapAlibiMods with those), other head dims, non-9.0 devices,
//             FLASHATTN_DISABLE_SM90=1.
#pragma once

namespace flashattn::cuda::sm90 {

template <int HeadDim>
struct BackwardTuning;

// NOTES: d 64 (FA3's tile for d 64): 128 x 128. dK + dV 64 regs, S^T + dP^T
// 128 regs: the largest tile the 240 registers allow. Smem: 2 * 16 (K, V) +
// 2 * 2 * 16 (Q, dO) + 2 * 32 (dS^T) + 32 (dQ) = 192 KB.
template <>
struct BackwardTuning<64> {
  static constexpr bool kSplitD = false;
  static constexpr int kBlockM = 128, kStages = 2;
  // 64 (dK, dV) + 64 (S^T) + 64 (dP^T) + 32 (P) regs: spilled (48 bytes).
  static constexpr bool kEarlyDv = false;
  static constexpr bool kOverlapP = true;
  // 160 + 32 KB; a second buffer would be 40 bytes over the 227 KB.
  static constexpr bool kDqTma = true;
  static constexpr int kDqBufs = 1;
  static constexpr bool kDqAlternate = true;  // dQ 2 x m64n64 (64 regs) after dV, dK end
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

// NOTES: d 128 (FA3's tile for d 128): 64 x 128. dK + dV 128 regs, S^T + dP^T
// 64 regs. Smem: 2 * 32 (K, V) + 2 * 2 * 16 (Q, dO) + 2 * 16 (dS^T) + 2 * 32
// (dQ) = 224 KB.
template <>
struct BackwardTuning<128> {
  static constexpr bool kSplitD = false;
  static constexpr int kBlockM = 64, kStages = 2;
  static constexpr bool kEarlyDv = true;
  static constexpr bool kOverlapP = true;
  static constexpr bool kDqTma = true;
  static constexpr int kDqBufs = 2;  // 160 + 64 KB
  static constexpr bool kDqAlternate = true;  // dQ m64n128 (64 regs) after dV, dK end
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

// NOTES: d 256: dK + dV of 64 keys x 256 are 256 regs per thread of one
// warpgroup, so the split-d mode (kernel.cuh): 64 keys x 64 queries, each
// consumer computes S^T, dP^T for 32 of the queries (32 regs) and owns 128
// columns of dK, dV (128 regs) and dQ (64 regs). P^T and dS^T are exchanged
// through shared memory, so dV waits for that barrier (no kEarlyDv). dQ by
// red.global (row-contiguous red.v4 after a per-warp transpose through the
// P^T / dS^T buffer not in use: kernel.cuh NOTES): its f32 tile (64 KB) does
// not fit beside K, V (64 KB), two Q/dO stages (128 KB), P^T and dS^T (2 x 16
// KB) = 224 KB. Deterministic mode orders those adds per query tile instead
// (kernel.cuh NOTES).
template <>
struct BackwardTuning<256> {
  static constexpr bool kSplitD = true;
  static constexpr int kBlockM = 64, kStages = 2;
  static constexpr bool kEarlyDv = false;
  static constexpr bool kOverlapP = true;
  static constexpr bool kDqTma = false;
  static constexpr int kDqBufs = 0;
  static constexpr bool kDqAlternate = false;  // split-d adds dQ by red.global, no TMA reducer
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

}  // namespace flashattn::cuda::sm90
