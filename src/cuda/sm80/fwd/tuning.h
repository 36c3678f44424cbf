// Every tuning choice of the sm80 forward kernel, per head dim, in one place.
//
//   kBlockM   query rows per CTA; kWarps warps split them, kBlockM / kWarps
//             rows each (16 or 32: one or two m16 tiles per warp; two let a
//             K/V fragment read from shared memory feed two mma's).
//   kBlockN   keys per K/V tile.
//   kStages   K/V tiles in flight. 1: K and V load separately, the next K
//             during P V and V during Q K^T (FlashAttention-2's overlap, two
//             barriers per tile, least shared memory). >= 2: K and V load
//             together kStages - 1 tiles ahead, one barrier per tile.
//   kQInRegs  keep the Q fragments in registers for the whole K/V loop
//             instead of re-reading them from shared memory every tile.
//   kOverlapQK  issue S_{j+1} = Q K_{j+1}^T in the same basic block as the
//             softmax of tile j (needs kStages >= 3).
//   kMinBlocksPerSm  __launch_bounds__ occupancy hint: caps registers so that
//             many CTAs fit on an SM (65536 registers / SM).
// Shared memory = (kBlockM + 2 * kStages * kBlockN) * head_dim * 2 bytes; it
// must stay under the 163 KB an sm_80 CTA can have (H100: 227 KB).
#pragma once

namespace flashattn::cuda::sm80 {

template <int HeadDim>
struct ForwardTuning;

// NOTES: all numbers below are bf16 forward TFLOP/s on an H100 SXM at the
// bench protocol (16k tokens, hidden 2048), from bench/fwd_variants.cu; see
// docs/perf-notes.md. Registers are the real limit: every shape here sits at
// 190..255 registers with no spills (-Xptxas -v), i.e. 2 CTAs of 4 warps or
// 1 CTA of 8 warps per SM.

// NOTES: the softmax dominates at d = 32: wide N tiles (S = 128 regs) amortise
// the per-tile row max/sum shuffles and barriers; O and Q are small. 40 KB.
template <>
struct ForwardTuning<32> {
  static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = true;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 32 rows per warp (each K/V fragment feeds 2 mma's), Q in registers
// (32 regs). Two stages with one barrier per tile: 269/290/298 (seqlen
// 1k/4k/16k; causal 205/267/289) against 258/272/299 for one stage, 256..280
// for three, 228..254 for N = 32, 217..277 for 64-row tiles and 260..294 for
// N = 128 (which spills). 48 KB.
template <>
struct ForwardTuning<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: as 128 (same register shape with 96 regs of O). 60 KB.
template <>
struct ForwardTuning<96> {
  static constexpr int kBlockM = 64, kBlockN = 128, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 32 rows per warp does not fit: O (128) + S (64) + fragments spill at
// N = 64 and at N = 32 ran 261..294. 16 rows per warp with N = 128 keys per tile
// (half the tiles, so half the barriers and softmax reductions) ran 284/317/310
// against 239..279 for N = 64 with two or three stages (one barrier per tile).
// One stage: 80 KB, 2 CTAs/SM.
template <>
struct ForwardTuning<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 16 rows per warp (O = 96 regs), 4 warps, 72 KB: 2 CTAs/SM. Two CTAs
// of 4 warps beat one of 8 (128 rows, 144 KB): 285/309/308 against 255/275/279;
// N = 32 with two stages: 246..282.
template <>
struct ForwardTuning<192> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: as 192: 4 warps x 16 rows (O = 128 regs), 96 KB, so 2 CTAs/SM on an
// H100 (1 on an A100): 289/314/314 against 256/274/280 for one CTA of 8 warps
// (128 rows), whose barriers stall the whole SM. N = 32 with two stages:
// 242..278; N = 128 spills.
template <>
struct ForwardTuning<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

template <class Cfg>
constexpr int forward_smem_bytes(int head_dim) {
  return (Cfg::kBlockM + 2 * Cfg::kStages * Cfg::kBlockN) * head_dim * 2;
}

// Every shape must run on sm_80 too (163 KB of shared memory per CTA).
constexpr int kSm80MaxSmem = 163 * 1024;
static_assert(forward_smem_bytes<ForwardTuning<32>>(32) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<64>>(64) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<96>>(96) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<128>>(128) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<192>>(192) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<256>>(256) <= kSm80MaxSmem, "smem");

// The kernel head dims, ascending: a problem runs on the first >= its head dim.
constexpr int kForwardHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace flashattn::cuda::sm80
