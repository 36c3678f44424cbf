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
//   kFastWholeTiles  K/V tiles wholly in bounds load without per-chunk bound
//             tests (a second copy loop: fewer instructions per tile, more
//             code and registers; d 64 and d 128 spill with it).
//   kMinBlocksPerSm  __launch_bounds__ occupancy hint: caps registers so that
//             many CTAs fit on an SM (65536 registers / SM).
// Shared memory = (kBlockM + 2 * kStages * kBlockN) * head_dim * 2 bytes; it
// must stay under the 163 KB an sm_80 CTA can have (H100: 227 KB).
#pragma once

#ifndef FLASHATTN_SM80_PAIR_SPLIT_256
#define FLASHATTN_SM80_PAIR_SPLIT_256 1
#endif
#ifndef FLASHATTN_SM80_WIDE_COPIES
#define FLASHATTN_SM80_WIDE_COPIES 1
#endif
#ifndef FLASHATTN_SM80_FAST_STORES
#define FLASHATTN_SM80_FAST_STORES 1
#endif

namespace flashattn::cuda::sm80 {

// NOTES (kFastStores; every head dim): the epilogue's O into
// shared memory with the lane's one swizzle computed once, and whole query
// tiles copied out with all shared-memory reads before the global stores and
// no per-row test (kernel.cuh). ncu of d256 1k non-causal (H100, locked
// clocks) before: the epilogue ran 1170 instructions per warp (the K/V loop
// ~990 per key tile) and held 6.0% of the warp samples (the prologue 3.3%);
// torch's FA2 took 1.5% fewer cycles there while ours is 3-5% ahead from 4k.
inline constexpr bool kFastStores = FLASHATTN_SM80_FAST_STORES;

// NOTES (TileCopy::kWide, FLASHATTN_SM80_WIDE_COPIES): whole K/V
// tiles at d256 (kFastWholeTiles) copied in FlashAttention-2's thread layout,
// 8 threads per 128-byte row segment and the 4 column blocks as immediate
// offsets: 4 row pointers per tile and thread instead of a 64-bit add per
// 16-byte copy (32 per tile). SASS: LDGSTS [R + imm] from 4 pointers. A/B in
// one process (5 rounds, H100):
// +1.4..+3.8% at 512-16k, both masks (10 of 10 cells); 9 rounds at 1k/2k
// non-causal +1.2/+1.8%. Output bitwise equal.

template <int HeadDim>
struct ForwardTuning;

// NOTES: all numbers below are bf16 forward TFLOP/s on an H100 SXM at the
// bench protocol (16k tokens, hidden 2048), from a harness that timed several
// tunings in one process (docs/performance.md). Registers are the real limit:
// every shape here sits at 190..255 registers with no spills (-Xptxas -v),
// i.e. 2 CTAs of 4 warps or 1 CTA of 8 warps per SM.

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
  static constexpr bool kFastWholeTiles = false;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = false;
};

// NOTES: FA2's d64 tile: 4 warps x 32 rows, N = 128 (half the per-tile
// barriers, row-max/sum shuffles and O rescales of N = 64), two stages with one
// barrier per tile, 80 KB (2 CTAs/SM on an H100 and on an A100). Fits 255
// registers with no spills since the softcap tanh is branch-free, P is packed
// per row half, and this width takes the per-row mask bounds (kernel.cuh);
// before, 40..84 bytes of spills. Run of 2026-11-22 12:50 (that harness, two
// runs each, seqlen 1023/1k/4k/16k): 276..300/299..306/329..336/335..338
// (causal 225..226/226..227/295/309..319) against 253..265/262..269/288..292/
// 298..299 (causal 208..211/208..211/257..266/282..287) for the 128x64 tile
// used before: +11..17% at 1k..16k, causal +7..15%. One and three stages at
// N = 128 still spill; Q K_{j+1}^T overlapped with the softmax (kOverlapQK)
// spills at N = 64 (148 bytes) too.
template <>
struct ForwardTuning<64> {
  static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr bool kFastWholeTiles = false;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = false;
};

// NOTES: 16 rows per warp, N = 128 (d128's previous shape; not re-measured
// since d128 moved to 32 rows per warp). 60 KB.
template <>
struct ForwardTuning<96> {
  static constexpr int kBlockM = 64, kBlockN = 128, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr bool kFastWholeTiles = false;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = false;
};

// NOTES: FA2's d128 shape: 4 warps x 32 rows (each K/V fragment feeds 2
// mma's, half the ldmatrix traffic of 16 rows), N = 64, here with two stages
// (one barrier per tile instead of two). 96 KB: 2 CTAs/SM on an H100, 1 on an
// A100 (164 KB/SM; not measured there; one stage, 64 KB, fits 2). O (128) + S
// (64) + fragments fit 255 registers without spills since K's fragments load
// as consecutive register pairs; two stages spilled 20 bytes until P was
// packed per row half. Run of 2026-11-22 12:50 (that harness, two runs each,
// seqlen 1023/1k/4k/16k): 342..349/346..348/357..363/378..381 (causal
// 261..262/259..263/323..327/334..351) against 304..320/313..322/335..348/
// 352..355 (causal 251..255/252..256/295..309/319..322) for one stage:
// +3..15% (causal +1..11%). Earlier: 64x64 at 3 CTAs/SM 269/286/294; 8 warps
// x 16 rows (128x64, 2 stages) 217/250/270.
template <>
struct ForwardTuning<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr bool kFastWholeTiles = false;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = false;
};

// NOTES: 16 rows per warp (O = 96 regs), 4 warps, 72 KB: 2 CTAs/SM. Two CTAs
// of 4 warps beat one of 8 (128 rows, 144 KB): 285/309/308 against 255/275/279;
// N = 32 with two stages: 246..282.
template <>
struct ForwardTuning<192> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr bool kFastWholeTiles = false;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = false;
};

// NOTES: as 192: 4 warps x 16 rows (O = 128 regs), 96 KB, so 2 CTAs/SM on an
// H100 (1 on an A100): 289/314/314 against 256/274/280 for one CTA of 8 warps
// (128 rows), whose barriers stall the whole SM. N = 32 with two stages:
// 242..278; N = 128 spills. Re-run with the K fix (12:07): 292/318/316
// against 251/281/286 for 8 warps and 226/259/279 for N = 32. Run of
// 2026-11-22 12:50 (seqlen 1023/1k/4k/16k, this shape 285..295/289..294/
// 307..313/305..321): Q in registers (255 registers, no spills) 255..263/
// 260..265/284..291/294..304, i.e. -0..14% (causal within noise); 128 rows x
// 8 warps, N = 64, one stage 259/260/278/287; N = 32, three stages 234/238/
// 261/267 (both 1 CTA/SM: half the K/V traffic from L2 per query row did not
// pay for the SM-wide barriers).
// NOTES (kPairSplit): ncu at 4k non-causal had shared memory at
// 75% of its peak (ldmatrix: Q 8 + K 32 + V 32 KB per warp and key tile for
// 16 rows; torch's FA2, same tile, 77%). With two warps per 32 rows, each
// reading K for its 32 keys and V for its 128 columns, it is 16 + 16 + 16 KB
// plus 4 KB of P exchange: 28% fewer bytes for the same mma's. Measured: 60%
// of peak, 4.3% fewer cycles (2.99M vs 3.13M). A/B in one process
// (bench/sm90_fwd_ab.py, 3 rounds, two runs, H100): +2..+8% at 1k-8k
// (non-causal and causal; one cell +0.4%), +2..+6% at 16k. 106.5 KB: sm_86/89
// (99 KB per CTA) run without it (kernel.cuh's launch_forward). Fragments of
// the next Q K^T k-step read ahead into a second register set (on top):
// 0.97..1.01 of without; V's copies spread over the Q K^T k-loop instead of
// one burst: 0.96..1.00 of without. Dropped.
template <>
struct ForwardTuning<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
  static constexpr bool kOverlapQK = false;
  static constexpr bool kFastWholeTiles = true;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = FLASHATTN_SM80_PAIR_SPLIT_256;
};

// Warp layout of a tile shape: with kPairSplit, warps 2i and 2i+1 share a
// block of rows; each keeps S for its half of the keys and O for its half of
// the head dim, so P and the row maxima (and, at the end, the row sums) cross
// between the two through shared memory (kernel.cuh).
template <class Cfg>
struct PairSplit {
  static constexpr int kWarpsPerRows = Cfg::kPairSplit ? 2 : 1;
  static constexpr int kWarpRows = Cfg::kBlockM * kWarpsPerRows / Cfg::kWarps;
  // One warp's P: kWarpRows rows of kBlockN / 2 16-bit values plus 16 bytes,
  // so rows start 20 banks apart: the 8 rows of a fragment store (4 bytes per
  // lane) or of an ldmatrix read (16 bytes per row) hit distinct banks.
  static constexpr int kPRowBytes = Cfg::kBlockN + 16;
  static constexpr int kPBytes = Cfg::kPairSplit ? kWarpRows * kPRowBytes : 0;
  static constexpr int kRowValueBytes = Cfg::kPairSplit ? kWarpRows * 4 : 0;  // a float per row
  static constexpr int kSmemBytes = Cfg::kWarps * (kPBytes + kRowValueBytes);
};

template <class Cfg>
constexpr int forward_smem_bytes(int head_dim) {
  return (Cfg::kBlockM + 2 * Cfg::kStages * Cfg::kBlockN) * head_dim * 2 + PairSplit<Cfg>::kSmemBytes;
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
