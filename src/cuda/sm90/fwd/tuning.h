// Every tuning choice of the Hopper forward kernel, per head dim, in one place.
//
// Fixed shape: kBlockM = 128 query rows per CTA, split over two consumer
// warpgroups of 64 rows (wgmma's M is 64 per warpgroup), plus one producer
// warpgroup that only issues TMA loads: 384 threads, one CTA per SM
// (persistent). Registers: 65536 / 384 = 168 at launch; the producer gives
// back down to kProducerRegs, the consumers take kConsumerRegs
// (128 * (24 + 2 * 240) = 64512 <= 65536).
//
//   kBlockN   keys per K/V tile: the N of S = Q K^T and the K of O += P V.
//             Bounded by registers: a consumer thread holds O (head_dim/2 f32),
//             S (kBlockN/2 f32) and P (kBlockN/4 regs) at once.
//   kStages   K/V ring depth in shared memory. Bounded by 227 KB:
//             smem = 128*d*2 (Q) + kStages * 2 * kBlockN*d*2 (K, V).
//   kIntraWgOverlap  issue S(j+1) = Q K(j+1)^T together with O += P(j) V(j),
//             so the tensor cores run while the softmax of tile j+1 runs
//             (FA3's intra-warpgroup pipelining). Costs S + P registers live
//             across the async wgmma.
//   kPingPong  the two consumer warpgroups take turns issuing their GEMMs
//             (named barriers), so one warpgroup's softmax overlaps the other's
//             GEMMs (FA3's inter-warpgroup ping-pong).
// The FLASHATTN_SM90_* macros exist only so the benchmark can build the
// variants that docs/perf-notes.md compares; the defaults are the shipped ones.
#pragma once

#ifndef FLASHATTN_SM90_OVERLAP
#define FLASHATTN_SM90_OVERLAP 1
#endif
#ifndef FLASHATTN_SM90_PINGPONG
#define FLASHATTN_SM90_PINGPONG 1
#endif

namespace flashattn::cuda::sm90 {

constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;

template <int HeadDim>
struct ForwardTuning;

// NOTES: d = 64 is bound by the softmax (exp per element is 1/64 of the
// flops of d = 4096), so wide K/V tiles (fewer row-max/sum rounds per key)
// and a deep ring (each tile is only 16 KB): 16 + 4 * 32 = 144 KB.
template <>
struct ForwardTuning<64> {
  static constexpr int kBlockN = 128, kStages = 4;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
};

// NOTES: S 64 + O 64 + P 32 regs; 32 + 2 * 64 = 160 KB.
template <>
struct ForwardTuning<128> {
  static constexpr int kBlockN = 128, kStages = 2;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
};

// NOTES: O alone is 128 regs per thread, so narrow K/V tiles (S 32 + P 16);
// Q is 64 KB: 64 + 2 * 64 = 192 KB.
template <>
struct ForwardTuning<256> {
  static constexpr int kBlockN = 64, kStages = 2;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
};

}  // namespace flashattn::cuda::sm90
