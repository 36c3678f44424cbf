// How many pieces the keys of each sequence are split into (flash decoding).
// Host-only arithmetic, unit-tested on the CPU (tests/test_decode_split.cpp).
#pragma once

#include <algorithm>

#include "cuda/decode/tuning.h"

namespace flashattn::cuda::decode {

struct SplitShape {
  int batch;
  int heads_kv;
  int query_tiles;  // packed query tiles per KV head
  int max_keys;     // keys of the longest sequence the call may see (the cache capacity)
  int block_keys;   // keys per tile
  int sm_count;
  int forced;       // caller's count, 0 = heuristic
  int ctas_per_sm = kCtasPerSm;  // decode CTAs an SM holds at once
};

// CTAs of `cta_smem` bytes an SM holds at once (up to kCtasPerSm, at least one).
inline int ctas_per_sm(int smem_per_sm, int reserved_per_cta, int cta_smem) {
  return std::clamp(smem_per_sm / std::max(1, cta_smem + reserved_per_cta), 1, kCtasPerSm);
}

// Which of the decode kernel's two rings a device runs (tuning.h: kRingBytes,
// kSmallRingBytes; api.cu reads the device's figures), and how many of its
// CTAs an SM holds (the split heuristic's ctas_per_sm).
// NOTES: the big ring where a block may take it and an SM holds as many of its
// CTAs as of the small ring's: the H100 (two either way). Else the small ring:
// GPUs with ~99 KiB a block (sm_86 / sm_89), where the big ring does not
// launch, and the A100, whose 164 KiB an SM hold one big-ring CTA but two
// small-ring ones. Reasoned for the A100 (not measured there): on the H100
// the small ring at two CTAs an SM read 0.94-1.02x the big one at d128
// (docs/inference.md), and a second CTA hides one CTA's merge and math behind
// the other's copies.
struct RingChoice {
  bool small;
  int ctas_per_sm;
};
inline RingChoice choose_ring(int smem_optin, int smem_per_sm, int reserved_per_cta, int big_cta_smem,
                              int small_cta_smem, bool force_small) {
  const bool small = force_small || smem_optin < big_cta_smem ||
                     ctas_per_sm(smem_per_sm, reserved_per_cta, big_cta_smem) <
                         ctas_per_sm(smem_per_sm, reserved_per_cta, small_cta_smem);
  return {small, ctas_per_sm(smem_per_sm, reserved_per_cta, small ? small_cta_smem : big_cta_smem)};
}

// The kernel gives each of n splits ceil(tiles / n) tiles, so only
// ceil(tiles / ceil(tiles / n)) of them get any: n is tight when that is n
// (31 splits of 64 tiles would leave 9 CTAs of each sequence and head idle).
inline bool splits_are_tight(int n, int tiles) {
  const int per_split = (tiles + n - 1) / n;
  return (tiles + per_split - 1) / per_split == n;
}

// Key tiles of the longest split: what the kernel gives each of `splits`
// (tile_work in common.cuh) when a sequence has max_keys keys.
inline int tiles_per_split(int max_keys, int block_keys, int splits) {
  const int tiles = std::max(1, (max_keys + block_keys - 1) / block_keys);
  return (tiles + splits - 1) / std::max(1, splits);
}

// The tile steps of a call split n ways: waves of CTAs one after the other,
// each as long as the longest split (ceil(tiles / n) tiles).
inline long long split_steps(long long ctas, int n, int tiles, long long slots) {
  const long long waves = (ctas * n + slots - 1) / slots;
  return waves * ((tiles + n - 1) / n);
}

// NOTES: CTAs without splitting = batch * heads_kv * query_tiles, against
// ctas_per_sm * sm_count resident slots. Each split adds one partial (O, lse)
// per packed row and a combine pass, and a split shorter than
// kMinTilesPerSplit tiles spends more on its start than on its keys. A call
// takes about split_steps tile steps; among the allowed tight counts the
// fewest splits within kWaveSlack of the best count's steps win: 128 CTAs on
// 264 slots split 2 ways (one wave of half-length splits), not 3 (two waves of
// third-length ones); 8 CTAs with 1024 tiles 32 ways (32 tiles a split), not
// 31 (a wave as full, but 34 tiles a split: measured 4% slower on the H100,
// docs/inference.md).
inline int choose_splits(const SplitShape& s) {
  const int tiles = std::max(1, (s.max_keys + s.block_keys - 1) / s.block_keys);
  const int most = std::max(1, std::min(kMaxSplits, tiles));
  if (s.forced > 0) return std::min(s.forced, most);
  const long long ctas = 1LL * s.batch * s.heads_kv * s.query_tiles;
  const long long slots = 1LL * std::max(1, s.ctas_per_sm) * std::max(1, s.sm_count);
  if (ctas <= 0 || ctas >= slots) return 1;
  const int limit = std::max(1, std::min(most, tiles / kMinTilesPerSplit));
  long long best = split_steps(ctas, 1, tiles, slots);
  for (int n = 2; n <= limit; ++n) {
    if (splits_are_tight(n, tiles)) best = std::min(best, split_steps(ctas, n, tiles, slots));
  }
  for (int n = 1; n <= limit; ++n) {
    if (splits_are_tight(n, tiles) && kWaveSlack * split_steps(ctas, n, tiles, slots) <= best) return n;
  }
  return limit;
}

}  // namespace flashattn::cuda::decode
