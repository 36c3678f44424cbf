// Every tuning choice of the Hopper forward kernel, per head dim, in one place.
//
// Shape: kConsumers consumer warpgroups of 64 query rows each (wgmma's M is
// 64 per warpgroup; kBlockM = 64 * kConsumers rows per CTA) plus one producer
// warpgroup that only issues TMA loads; one persistent CTA per SM.
//   kConsumers / kProducerRegs: registers are 65536 per SM, 65536 / threads
//             at launch; setmaxnreg moves them from the producer to the
//             consumers: 128 * (kProducerRegs + kConsumers * consumer_regs)
//             <= 65536 (2 consumers: 24 + 2 * 240; 3: 24 + 3 * 160).
//   kCausalConsumers  consumer warpgroups when the mask is causal (a second
//             instantiation where it differs from kConsumers).
//   kQStages  Q buffers: 2 lets the producer load the next tile's Q while the
//             consumers still work on the current one (where smem allows).
//
//   kBlockN   keys per K/V tile: the N of S = Q K^T and the K of O += P V.
//             Bounded by registers: a consumer thread holds O (head_dim/2 f32),
//             S (kBlockN/2 f32) and P (kBlockN/4 regs) at once.
//   kLongBlockN / kLongKeys  wider K/V tiles where the middle query row
//             sees at least kLongKeys keys (a second instantiation where it
//             differs from kBlockN; the Q buffers and O staging then get what
//             shared memory has left, kernel.cuh's FwdTraits).
//   kStages   K/V ring depth in shared memory. Bounded by 227 KB:
//             smem = kQStages * kBlockM*d*2 (Q) + kStages * 2 * kBlockN*d*2 (K, V).
//   kIntraWgOverlap  issue S(j+1) = Q K(j+1)^T together with O += P(j) V(j),
//             so the tensor cores run while the softmax of tile j+1 runs
//             (FA3's intra-warpgroup pipelining). Costs S + P registers live
//             across the async wgmma.
//   kPingPong  the two consumer warpgroups take turns issuing their GEMMs
//             (named barriers), so one warpgroup's softmax overlaps the other's
//             GEMMs (FA3's inter-warpgroup ping-pong).
//   kRescaleInTurn  O *= exp(m_old - m_new) runs inside the turn, between
//             issuing S = Q K^T and O += P V (which needs it), instead of after
//             the softmax (the same for every head dim; NOTES below).
//   kCrossTile  with two Q buffers, a tile's last P V and the next tile's
//             first S = Q K^T are issued in one ping-pong turn, and the tile's
//             epilogue (O / l, its store, the logsumexp) runs while that S is
//             on the tensor cores (NOTES below).
//   kKAhead   the producer requests K of a key tile before V of the tile
//             walked before it (kernel.cuh's NOTES): K's lead grows from about
//             one key-tile period to about one and a half. A/B in one process
//             (bench/sm90_fwd_ab.py, 8 rounds, bf16, H100, session14.md):
//             2k/4k/8k d128 +1.0/+2.4/+2.9% non-causal, -0.7/+2.4/+3.0%
//             causal; d256 +2.1/+1.8/+0.6%, -0.9/0/+2.3%; d64 +1.2/0/+0.9%,
//             -0.6/0/+0.7%.
//   kEarlyQ   with two Q buffers, the producer requests the next tile's Q
//             after the current tile's first kStages - 1 K/V tiles instead
//             of after all of them (kernel.cuh says why that never waits).
//   kOTma     epilogue through shared memory and a TMA store (not varlen),
//             where there is room for a 64 x d staging buffer per consumer
//             warpgroup (d = 64, 128; d = 192 / 256 use all of the 227 KB).
//   kBalancedGroups  the tile order's head groups of equal size (+-1) instead
//             of full groups and a remainder (schedule.h).
//   kCausalPairs  plain causal masks: query tiles i and last-i dealt as one
//             pair of equal total cost (schedule.h), instead of the snake.
//   kSplitTail  where every tile costs the same (no mask, fixed lengths)
//             and walks at least kSplitTailMinKeys keys, the last round's
//             tiles are cut along the keys over all CTAs by a second kernel
//             (schedule.h's split tail), on the long-key instantiation only:
//             two more kernels per head dim to compile, so only for the head
//             dims whose long-key cells were short of their target.
//   kHeadMajor  unmasked runs and causal pairs take query tiles head by
//             head (schedule.h), so each head's K/V is read from DRAM about
//             once.
// Measured in one process against the kernel before them (bf16, H100, the A/B
// run of bench/results/2026-11-22-h100-forward-sm90-round2.md; median of 3
// interleaved timings): kEarlyQ + kOTma (shipped) / before at d128
// 2k/4k/8k/16k 1.02/1.02/1.06/1.03 non-causal, 1.06/1.00/1.01/1.01 causal.
// One at a time (the other two on): kOTma 1.01/1.01/1.02/0.98 and
// 1.02/1.03/1.01/1.02, kEarlyQ 0.99/1.00/1.01/0.97 and 1.00/1.02/1.05/1.00
// (no effect beyond the spread: builds with the same d256 kernel differed by
// up to 4% in that run; kept because it is part of the build that was tested
// and timed); tight groups (since replaced by kHeadMajor) 1.03/1.03/0.99/0.98
// non-causal, but 0.94 at d128 causal 2k and 0.81 at d64 causal 2k (session 5:
// on, unmasked only, where a round spans >= 4 heads).
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
#define FLASHATTN_SM90_BLOCKN_128 128
#endif
#ifndef FLASHATTN_SM90_LONG_BLOCKN_128
#define FLASHATTN_SM90_LONG_BLOCKN_128 176
#endif
#ifndef FLASHATTN_SM90_BLOCKN_256
#define FLASHATTN_SM90_BLOCKN_256 80
#endif
#ifndef FLASHATTN_SM90_CONSUMERS_64
#define FLASHATTN_SM90_CONSUMERS_64 3
#endif
#ifndef FLASHATTN_SM90_CAUSAL_CONSUMERS_64
#define FLASHATTN_SM90_CAUSAL_CONSUMERS_64 2
#endif
#ifndef FLASHATTN_SM90_BLOCKN_192
#define FLASHATTN_SM90_BLOCKN_192 112
#endif
#ifndef FLASHATTN_SM90_QSTAGES_192
#define FLASHATTN_SM90_QSTAGES_192 1
#endif
#ifndef FLASHATTN_SM90_QSTAGES_64
#define FLASHATTN_SM90_QSTAGES_64 2
#endif
#ifndef FLASHATTN_SM90_LONG_KEYS_128
#define FLASHATTN_SM90_LONG_KEYS_128 8192
#endif
#ifndef FLASHATTN_SM90_STAGES_128
#define FLASHATTN_SM90_STAGES_128 2
#endif
#ifndef FLASHATTN_SM90_QSTAGES_128
#define FLASHATTN_SM90_QSTAGES_128 2
#endif
#ifndef FLASHATTN_SM90_O_TMA
#define FLASHATTN_SM90_O_TMA 1
#endif
#ifndef FLASHATTN_SM90_BALANCED_GROUPS
#define FLASHATTN_SM90_BALANCED_GROUPS 1
#endif
#ifndef FLASHATTN_SM90_CAUSAL_PAIRS
#define FLASHATTN_SM90_CAUSAL_PAIRS 1
#endif
#ifndef FLASHATTN_SM90_SPLIT_TAIL
#define FLASHATTN_SM90_SPLIT_TAIL 1
#endif
#ifndef FLASHATTN_SM90_HEAD_MAJOR
#define FLASHATTN_SM90_HEAD_MAJOR 1
#endif
#ifndef FLASHATTN_SM90_RESCALE_IN_TURN
#define FLASHATTN_SM90_RESCALE_IN_TURN 1
#endif
#ifndef FLASHATTN_SM90_EARLY_Q
#define FLASHATTN_SM90_EARLY_Q 1
#endif
#ifndef FLASHATTN_SM90_K_AHEAD
#define FLASHATTN_SM90_K_AHEAD 1
#endif
#ifndef FLASHATTN_SM90_CROSS_TILE
#define FLASHATTN_SM90_CROSS_TILE 1
#endif

namespace flashattn::cuda::sm90 {

// NOTES (split tail, kSplitTailMinKeys): the tail kernel pays a launch, a
// prologue and an epilogue per piece, and the partial O round trip; the
// half-empty last round it replaces runs faster than a full one (19 vs 28 us
// at d128 2k, 31 vs 55 us at d256 2k). Profiled (torch.profiler, back to back, H100 bf16
// non-causal): d128 2k: main 424.6 us + tail ending 27 us later vs 443.8 us
// unsplit (-2%); d256 2k -5%; d128 4k +0.7%; d128 16k 3499 vs 3590 us
// (+2.5%). A/B in one process (bench/sm90_fwd_ab.py, split / unsplit): 1k-4k
// -1..-5% (d128, d256); 8k +2.0/+5.6% (d128, two runs), +2.9/+2.8% (d256);
// 16k -1.5/+1.5% (d128), -0.4/+4.4% (d256). Hence only from 8192 keys.
#ifndef FLASHATTN_SM90_SPLIT_TAIL_MIN_KEYS
#define FLASHATTN_SM90_SPLIT_TAIL_MIN_KEYS 8192
#endif
inline constexpr int kSplitTailMinKeys = FLASHATTN_SM90_SPLIT_TAIL_MIN_KEYS;

// Registers per producer thread. setmaxnreg moves registers within what the
// CTA got at launch: 384 threads (two consumer warpgroups) launch at 168 each
// (65536 / 384 rounded down to 8), so the consumers' 2 * (240 - 168) per
// thread-slot must all come from the producer: 168 - 24 = 144. (At 32 the
// consumers' setmaxnreg waited forever.)
inline constexpr int kProducerRegs = 24;

// Registers per consumer thread for a given number of consumer warpgroups:
// what is left of 512 per thread-slot after the producer's, rounded down to
// setmaxnreg's multiple of 8, capped at its 240 (2: 240, 3: 160).
constexpr int consumer_regs(int consumers) {
  const int r = ((512 - kProducerRegs) / consumers) / 8 * 8;
  return r < 240 ? r : 240;
}

// The tile order's rules (kBalancedGroups, kCausalPairs, kHeadMajor above;
// schedule.h): the same for every head dim.
inline constexpr bool kBalancedGroups = FLASHATTN_SM90_BALANCED_GROUPS;
inline constexpr bool kCausalPairs = FLASHATTN_SM90_CAUSAL_PAIRS;
inline constexpr bool kHeadMajor = FLASHATTN_SM90_HEAD_MAJOR;

// NOTES (kRescaleInTurn, session 11): the steady-state trace (trace.h's step
// stamps, d128 2k) has each warpgroup's issue of its 16 wgmmas take ~700
// cycles after it gets the turn (the tensor pipe's queue is full, the warp
// waits at the HGMMA), while the chain from its S done through the softmax to
// its next turn is what sets the key tile's period. The 64 FMULs of the O
// rescale sat on that chain; between the S and P V issues they run while the
// warp would wait on the queue anyway. A/B in one process (bench/sm90_fwd_ab.py,
// two runs of 3 and 5 rounds, bench/results/2026-11-24-h100-session11.md):
// 16k +3.8..+7.5% at d128, +4.2..+5.9% d256, +3.6..+4.3% d64 (causal 16k
// +1..+5.5%); 2k-4k within the spread, 0.97..1.05. Same for every head dim.
inline constexpr bool kRescaleInTurn = FLASHATTN_SM90_RESCALE_IN_TURN;

// NOTES (kCrossTile, session 14): at d128 2k the tile boundary (first S and
// its wait, first softmax, last P V, epilogue) was 12% of the consumers' warp
// samples against cuDNN's 4% (ncu source view, session13.md 13): with one
// turn per boundary fewer, the first S's wait and the epilogue overlap the
// tensor cores' work. Sessions 3, 5 and 9 built it without a gain; this form
// keeps O zeroed only after the fused turn's S has completed (no accumulator
// written with a wgmma in flight: no C7515) and the steady-state loop
// untouched (the same code for a primed tile and a first one). A/B in one
// process (bench/sm90_fwd_ab.py, 10 rounds of 200 ms, bf16, H100,
// session14.md): d128 non-causal 1k/2k/4k 0.995/1.023/1.035, causal
// 1.003/1.004/1.015; d64 within +-2% (5 rounds). Sustained 3 s runs at the
// 700 W cap: d128 2k 561-563 vs 559 TFLOP/s, 4k 591-595 vs 574-579. ncu
// cycles (locked clocks) 2k 742.5k vs 744.1k, 4k 1405k vs 1415k: the gain is
// mostly power (clock 1575-1680 vs 1515-1650 MHz), not cycles.
// An L2 prefetch of the next tile's first two K/V tiles (its first loads
// miss to DRAM: every tile starts a new head) gained nothing: 0.93-1.02 of
// the fused-turn kernel without it, 0.97-1.06 of the kernel before (the
// spread of those runs, session14.md 1 and 4).
inline constexpr bool kCrossTileDefault = FLASHATTN_SM90_CROSS_TILE;

template <int HeadDim>
struct ForwardTuning;

// NOTES: d = 64 is bound by the softmax: per key tile a warpgroup's wgmmas
// take about as many cycles (2*64*kBlockN*64*2 flops at ~4096 flops/clk/SM)
// as its exponentials on the MUFU (64*kBlockN at 16/clk/SM). Three consumer
// warpgroups (kBlockM 192, FA3's shape for d = 64) keep the tensor cores fed
// while two of them are in their softmax; O (32) + S (64) + P (32) regs fit
// in 160. Wide K/V tiles and a deep ring (each tile is only 16 KB), and room
// for two Q buffers: 2 * 24 + 4 * 32 = 176 KB.
// Causal runs with two consumer warpgroups (kBlockM 128): fewer of a tile's
// rows sit on the masked diagonal (3 were 5-10% slower at 512-4k causal).
template <>
struct ForwardTuning<64> {
  static constexpr int kConsumers = FLASHATTN_SM90_CONSUMERS_64;
  static constexpr int kCausalConsumers = FLASHATTN_SM90_CAUSAL_CONSUMERS_64;
  static constexpr int kBlockN = 128, kStages = 4, kQStages = FLASHATTN_SM90_QSTAGES_64;
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;
  static constexpr bool kEarlyQ = FLASHATTN_SM90_EARLY_Q;
  static constexpr bool kKAhead = FLASHATTN_SM90_K_AHEAD;
  static constexpr bool kCrossTile = kCrossTileDefault;
  static constexpr bool kOTma = FLASHATTN_SM90_O_TMA;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
  static constexpr bool kSplitTail = false;  // meets its target without
};

// NOTES: 128-key tiles and two Q buffers: 2 * 32 + 2 * 2 * 32 = 192 KB (176-key
// tiles, FA3's choice, leave room for one Q only: 32 + 2 * 2 * 44 = 208 KB).
// 176 vs 128 keys alone was within the run-to-run spread (528/628/635 vs
// 521/585/604 at 2k/8k/16k in one run, 496/592/614 vs 555/598/614 in the
// next). With the second Q buffer, the next tile's Q and first K load while
// the current tile runs: 2k/4k/8k non-causal 529/563/591 vs 486/534/587 and
// 499/547/590 (176 keys, one Q, timed before and after), causal 415/464/498
// vs 390/441/490 and 389/449/501 (bf16, H100, one run).
// A third K/V stage (FLASHATTN_SM90_STAGES_128=3; room only with one Q buffer,
// O stored from registers and 128-key tiles): 0.978-1.000 of the same without
// it (one Q buffer, register O), which was itself 0.977-1.008 of the shipped
// build at 1k-4k (A/B, 5 rounds, session13.md 11): the consumers' waits for
// K/V in the trace are not what the period is made of. Session 14, with the
// cross-tile turn and K ahead of V: a V or K ring of 3 (two Q buffers, O from
// registers: 224 KB) 0.98-1.02; 160-key tiles (the same room) 2k level, 1k
// -6.5%, causal 2k -4.6% (session14.md 9, 12).
// Long keys (the middle row sees >= 8192: non-causal from 8k, causal from
// 16k): 176-key tiles (FA3's width), one Q buffer and O stored from registers
// (32 + 2 * 2 * 44 = 208 KB): a third fewer key tiles, so fewer per-tile max
// reductions, barriers and O rescales, and S = Q K^T runs as n176 wgmmas.
// A/B in one process (bench/sm90_fwd_ab.py, 5 rounds, session 7): non-causal
// 8k/16k +3.9/+4.6%, causal 16k +4.2%; but 4k -3.3%, causal 8k -4.3%, 1k/2k
// -2..-16% (one Q buffer: the next tile's Q cannot load during this one; and
// the ragged last tile wastes more of its width).
template <>
struct ForwardTuning<128> {
  static constexpr int kConsumers = 2, kCausalConsumers = 2;
  static constexpr int kBlockN = FLASHATTN_SM90_BLOCKN_128, kStages = FLASHATTN_SM90_STAGES_128;
  static constexpr int kQStages = FLASHATTN_SM90_QSTAGES_128;
  static constexpr int kLongBlockN = FLASHATTN_SM90_LONG_BLOCKN_128, kLongKeys = FLASHATTN_SM90_LONG_KEYS_128;
  static constexpr bool kEarlyQ = FLASHATTN_SM90_EARLY_Q;
  static constexpr bool kKAhead = FLASHATTN_SM90_K_AHEAD;
  static constexpr bool kCrossTile = kCrossTileDefault;
  static constexpr bool kOTma = FLASHATTN_SM90_O_TMA;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
  static constexpr bool kSplitTail = FLASHATTN_SM90_SPLIT_TAIL;
};

// NOTES: d = 192 (three 64-column swizzle blocks) has its own kernel: run on
// the d = 256 one, a third of its Q K^T and P V work would multiply zeros.
// O is 96 regs; 112-key tiles (S 56 + P 28: 180 live, as d = 256's 188) and Q
// of 48 KB: 48 + 2 * 2 * 42 = 216 KB (128 keys would need 240 KB).
// Measured against 80-key tiles with two Q buffers (2 * 48 + 2 * 2 * 30 =
// 216 KB; bf16, H100, TFLOP/s at 2k/4k/8k, one run, 112 timed after):
// non-causal 573/600/633 vs 566/586/613, causal 447/467/573 vs 448/456/562.
template <>
struct ForwardTuning<192> {
  static constexpr int kConsumers = 2, kCausalConsumers = 2;
  static constexpr int kBlockN = FLASHATTN_SM90_BLOCKN_192, kStages = 2;
  static constexpr int kQStages = FLASHATTN_SM90_QSTAGES_192;
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;
  static constexpr bool kEarlyQ = FLASHATTN_SM90_EARLY_Q;
  static constexpr bool kKAhead = FLASHATTN_SM90_K_AHEAD;
  static constexpr bool kCrossTile = false;  // one Q buffer
  static constexpr bool kOTma = false;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
  static constexpr bool kSplitTail = false;  // no target at d 192
};

// NOTES: O alone is 128 regs per thread, so narrow K/V tiles: 80 keys
// (S 40 + P 20 regs; FA3's choice), Q is 64 KB: 64 + 2 * 80 = 224 KB, the
// most that fits. Measured on the H100 against 64-key tiles (bf16, TFLOP/s at
// 2k / 8k / 16k): non-causal 655/676/728 vs 539/608/623, causal 454/585/472
// vs 420/518/416: each P V wgmma has K = 80 instead of 64 and the per-tile
// softmax/barrier overhead is spread over 25% more keys.
// No room for a second Q buffer. Tried and dropped: the producer requesting a
// tile's first K before its Q and prefetching the next tile's Q into L2
// (predicted +3-5% at 2k): 564/621/674 vs 577/624/685 without either
// (non-causal 2k/4k/8k), causal 472/512/574 vs 482/520/579: no gain.
template <>
struct ForwardTuning<256> {
  static constexpr int kConsumers = 2, kCausalConsumers = 2;
  static constexpr int kBlockN = FLASHATTN_SM90_BLOCKN_256, kStages = 2, kQStages = 1;
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;
  static constexpr bool kEarlyQ = FLASHATTN_SM90_EARLY_Q;
  static constexpr bool kKAhead = FLASHATTN_SM90_K_AHEAD;
  static constexpr bool kCrossTile = false;  // one Q buffer
  static constexpr bool kOTma = false;
  static constexpr bool kIntraWgOverlap = FLASHATTN_SM90_OVERLAP, kPingPong = FLASHATTN_SM90_PINGPONG;
  static constexpr bool kSplitTail = FLASHATTN_SM90_SPLIT_TAIL;
};

}  // namespace flashattn::cuda::sm90
