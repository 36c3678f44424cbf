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

// NOTES: d64's shape with Q in registers (16 regs at d = 32). The wide N = 128
// tile used before (S = 128 regs, to amortise the per-tile shuffles and
// barriers) spills 16 bytes in the sm_80 build once K has its own ldmatrix
// lane pattern (not in sm_90a's); this one: 197 registers (sm_80), 230
// (sm_90a). Not timed. 32 KB.
template <>
struct ForwardTuning<32> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = true;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 32 rows per warp (each K/V fragment feeds 2 mma's); two stages with
// one barrier per tile. Run of 2026-11-22 12:07 (fwd_variants, seqlen
// 1k/4k/16k): 274/299/306 (causal 213/270/294); one stage 267/298/308, one
// stage with Q in registers 268/297/306, three stages 258/284/299, 64-row
// tiles at 3 CTAs/SM 244/236/251. Q stays in shared memory: Q in registers
// with two stages spilled 8 bytes once K got its own ldmatrix lane pattern.
// N = 128 (FA2's d64 tile) still spills; Q K_{j+1}^T overlapped with the
// softmax (kOverlapQK) fits only at N = 32: 236/249/254. 48 KB.
template <>
struct ForwardTuning<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: 16 rows per warp, N = 128 (d128's previous shape; not re-measured
// since d128 moved to 32 rows per warp). 60 KB.
template <>
struct ForwardTuning<96> {
  static constexpr int kBlockM = 64, kBlockN = 128, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr int kMinBlocksPerSm = 2;
};

// NOTES: FA2's d128 shape: 4 warps x 32 rows (each K/V fragment feeds 2
// mma's, half the ldmatrix traffic of 16 rows), N = 64, one stage (64 KB,
// 2 CTAs/SM). O (128) + S (64) + fragments fit 255 registers without spills
// only since K's fragments load as consecutive register pairs (92 bytes of
// spills before). 326/358/359 (causal 225..249/295..307/314..333, two runs
// in one process) against 260/273/301 for the previous 16-rows-per-warp
// 64x128 tile with the same K fix; 64x64 at 3 CTAs/SM 269/286/294; 8 warps
// x 16 rows (128x64, 2 stages) 217/250/270; two stages spill.
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
// 242..278; N = 128 spills. Re-run with the K fix (12:07): 292/318/316
// against 251/281/286 for 8 warps and 226/259/279 for N = 32.
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
