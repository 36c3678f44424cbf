// Every tuning value of the Hopper forward, per head dim, with one reason each.
// The measurements behind them are in docs/performance.md ("What each
// technique bought"); a benchmark compares another configuration by
// instantiating the kernel with its own tuning type (traits.h's FwdTraits).
//
// Shape: kConsumers consumer warpgroups of 64 query rows each (wgmma's M is 64
// per warpgroup) plus one producer warpgroup that only issues TMA loads; one
// persistent CTA per SM. The structure every head dim shares (FA3's): S of the
// next key tile issued with P V of the current one (intra-warpgroup overlap),
// consumers taking turns at the tensor cores (ping-pong), O rescaled inside
// the turn, K of a key tile requested before V of the previous one, and, with
// two Q buffers, the next tile's Q requested early and its first S issued in
// the current tile's last turn (cross-tile).
#pragma once

#include "attention/work_plan.h"

namespace flashattn::cuda::sm90 {

// Registers per producer thread: setmaxnreg gives the rest to the consumers
// (at 32 the consumers' setmaxnreg waited forever with two of them).
inline constexpr int kProducerRegs = 24;

// Registers per consumer thread: what is left of 512 per thread-slot after the
// producer's, rounded down to setmaxnreg's multiple of 8, capped at 240.
constexpr int consumer_regs(int consumers) {
  const int r = ((512 - kProducerRegs) / consumers) / 8 * 8;
  return r < 240 ? r : 240;
}

// The split tail (attention/work_plan.h) pays a launch and a partial-O round trip per
// piece: it gains only from this many keys on (below, -1..-5% at 1k-4k).
inline constexpr int kSplitTailMinKeys = 8192;

// The tile order's rules (attention/work_plan.h), the same for every head dim: head groups
// of equal size; plain causal tiles dealt in pairs of equal cost; unmasked runs
// walked head by head so each head's K/V is read from DRAM about once.
inline constexpr TileOrderPolicy kTileOrderRules = {true, true, true};

// Block masks (ListedKeys, scheduler.cuh) run two consumers at every head dim:
// 128-row query tiles, so FlexAttention's default 128 x 128 blocks map onto
// whole tiles (at d 64 and 128, whose key tiles are 128 too) and every listed
// tile is full, without the per-element test.
inline constexpr int kBlockSparseConsumers = 2;

template <int HeadDim>
struct ForwardTuning;

// d = 64 is bound by the softmax's exponentials: three consumers keep the
// tensor cores fed while two are in their softmax; causal takes two (fewer rows
// on the masked diagonal). Small tiles: a deep ring and two Q buffers fit.
template <>
struct ForwardTuning<64> {
  static constexpr int kHeadDim = 64;
  static constexpr int kConsumers = 3, kCausalConsumers = 2;
  // With dropout, 2: the Philox rounds in 3 consumers' 160 registers spilled
  // 212 bytes (sm_90a, -Xptxas -v); 2 have 240.
  static constexpr int kDropoutConsumers = 2;
  static constexpr int kBlockN = 128;      // keys per K/V tile
  static constexpr int kStages = 4;        // K/V ring depth: 16 KB tiles
  static constexpr int kQStages = 2;       // next tile's Q loads during this one
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;  // no long-key kernel
  static constexpr bool kOTma = true;      // O through smem + TMA store (room for staging)
  static constexpr bool kSplitTail = false;  // meets its target without
};

// d = 128: 128-key tiles leave room for two Q buffers (192 KB). From 8192 keys
// per row, 176-key tiles (FA3's) with one Q buffer: a third fewer key tiles.
template <>
struct ForwardTuning<128> {
  static constexpr int kHeadDim = 128;
  static constexpr int kConsumers = 2, kCausalConsumers = 2, kDropoutConsumers = 2;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;  // a third stage only fits with one Q: no gain
  static constexpr int kQStages = 2;
  static constexpr int kLongBlockN = 176, kLongKeys = 8192;
  static constexpr bool kOTma = true;
  static constexpr bool kSplitTail = true;  // the long-key kernel's last round
};

// d = 192 has its own kernel (on d = 256's a third of the work is zeros): O is
// 96 registers, 112-key tiles and one Q buffer fill 216 KB.
template <>
struct ForwardTuning<192> {
  static constexpr int kHeadDim = 192;
  static constexpr int kConsumers = 2, kCausalConsumers = 2, kDropoutConsumers = 2;
  static constexpr int kBlockN = 112, kStages = 2;
  static constexpr int kQStages = 1;  // 112 keys beat 80 keys with two Q buffers
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;
  static constexpr bool kOTma = false;  // no room for O staging
  static constexpr bool kSplitTail = false;  // no target at d 192
};

// d = 256: O alone is 128 registers, so 80-key tiles (FA3's); Q is 64 KB and
// the ring 160 KB: 224 KB, no room for a second Q buffer or O staging.
template <>
struct ForwardTuning<256> {
  static constexpr int kHeadDim = 256;
  static constexpr int kConsumers = 2, kCausalConsumers = 2, kDropoutConsumers = 2;
  static constexpr int kBlockN = 80, kStages = 2, kQStages = 1;
  static constexpr int kLongBlockN = kBlockN, kLongKeys = 0;
  static constexpr bool kOTma = false;
  static constexpr bool kSplitTail = true;
};

}  // namespace flashattn::cuda::sm90
