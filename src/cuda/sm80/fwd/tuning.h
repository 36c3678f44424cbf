// Every tuning choice of the sm80 forward kernel, per head dim, in one place.
//
//   kBlockM   query rows per CTA; kWarps warps split them, kBlockM / kWarps
//             rows each (16 or 32: one or two m16 tiles per warp; two let a
//             K/V fragment read from shared memory feed two mma's).
//   kBlockN   keys per K/V tile.
//   kStages   K/V tiles in flight (ring depth). With 1, the next K tile loads
//             while P V runs and the V tile while Q K^T runs (FlashAttention-2's
//             overlap); 2 adds a whole tile of look-ahead.
//   kQInRegs  keep the Q fragments in registers for the whole K/V loop
//             instead of re-reading them from shared memory every tile.
//   kMinBlocksPerSm  __launch_bounds__ occupancy hint: caps registers so that
//             many CTAs fit on an SM (65536 registers / SM).
// Shared memory = (kBlockM + 2 * kStages * kBlockN) * head_dim * 2 bytes; it
// must stay under the 163 KB an sm_80 CTA can have (H100: 227 KB).
#pragma once

namespace flashattn::cuda::sm80 {

template <int HeadDim>
struct ForwardTuning;

// NOTES: small head dims are bound by the softmax and the loads, not the mma:
// wide N tiles amortise the per-row max/sum shuffles; Q (2x2x4 regs) is cheap
// to hold. 40 KB smem, ~3 CTAs/SM.
template <>
struct ForwardTuning<32> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = true;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 32 rows per warp so each K/V fragment feeds two mma's; Q in
// registers (32 regs) since S (64) + O (64) leave room. 48 KB smem.
template <>
struct ForwardTuning<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = true;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: O is 96 regs; Q from shared memory keeps S + O + P under ~200 regs
// for 2 CTAs/SM. 72 KB smem.
template <>
struct ForwardTuning<96> {
  static constexpr int kBlockM = 128, kBlockN = 32, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: FlashAttention-2's 128 x 64 / 4 warps shape; O is 128 regs, so Q is
// re-read from shared memory. Two stages: 96 KB, still 2 CTAs/SM.
template <>
struct ForwardTuning<128> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: O would be 192 regs at 32 rows per warp: 8 warps of 16 rows each.
// 144 KB smem: one CTA/SM (fits sm_80's 163 KB).
template <>
struct ForwardTuning<192> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr int kMinBlocksPerSm = 1;
};

// NOTES: 8 warps x 16 rows (O = 128 regs). One stage (FlashAttention-2's
// K-while-PV / V-while-QK overlap) keeps smem at 128 KB, inside sm_80's limit.
template <>
struct ForwardTuning<256> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr int kMinBlocksPerSm = 1;
};

template <int HeadDim>
constexpr int forward_smem_bytes() {
  using T = ForwardTuning<HeadDim>;
  return (T::kBlockM + 2 * T::kStages * T::kBlockN) * HeadDim * 2;
}

// The kernel head dims, ascending: a problem runs on the first >= its head dim.
constexpr int kForwardHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace flashattn::cuda::sm80
