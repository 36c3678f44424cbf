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
#ifndef FLASHATTN_SM90_BLOCKN_128
#define FLASHATTN_SM90_BLOCKN_128 176
#endif
#ifndef FLASHATTN_SM90_BLOCKN_256
#define FLASHATTN_SM90_BLOCKN_256 80
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

// NOTES: 176-key tiles (FA3's choice for d = 128): S 88 + O 64 + P 44 regs;
// 32 + 2 * 88 = 208 KB. Measured on the H100 against 128-key tiles (bf16,
// TFLOP/s at 2k / 8k / 16k): non-causal 528/628/635 vs 521/585/604, causal
// 402/514/548 vs 417/498/518: better from 8k on, 4% worse at 2k causal (more
// of each diagonal tile is masked away).
template <>
struct ForwardTuning<128> {
  static constexpr int kBlockN = FLASHATTN_SM90_BLOCKN_128, kStages = 2;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
};

// NOTES: O alone is 128 regs per thread, so narrow K/V tiles: 80 keys
// (S 40 + P 20 regs; FA3's choice), Q is 64 KB: 64 + 2 * 80 = 224 KB, the
// most that fits. Measured on the H100 against 64-key tiles (bf16, TFLOP/s at
// 2k / 8k / 16k): non-causal 655/676/728 vs 539/608/623, causal 454/585/472
// vs 420/518/416: each P V wgmma has K = 80 instead of 64 and the per-tile
// softmax/barrier overhead is spread over 25% more keys.
template <>
struct ForwardTuning<256> {
  static constexpr int kBlockN = FLASHATTN_SM90_BLOCKN_256, kStages = 2;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
};

}  // namespace flashattn::cuda::sm90
