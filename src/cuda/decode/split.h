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
};

// The fraction of the GPU's CTA slots the last wave of n CTAs keeps busy,
// averaged over all waves: n / (waves * slots).
inline double wave_efficiency(long long n, long long slots) {
  const long long waves = (n + slots - 1) / slots;
  return static_cast<double>(n) / static_cast<double>(waves * slots);
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

// NOTES: CTAs without splitting = batch * heads_kv * query_tiles, against
// kCtasPerSm * sm_count resident slots. Each split adds one partial (O, lse)
// per packed row and a combine pass, and a split shorter than
// kMinTilesPerSplit tiles spends more on its start than on its keys. Among the
// allowed tight counts the fewest splits whose waves are within kWaveSlack of
// the best count's efficiency win: 128 CTAs on 264 slots split 2 ways (one full
// wave), not 3 (a wave and a half).
inline int choose_splits(const SplitShape& s) {
  const int tiles = std::max(1, (s.max_keys + s.block_keys - 1) / s.block_keys);
  const int most = std::max(1, std::min(kMaxSplits, tiles));
  if (s.forced > 0) return std::min(s.forced, most);
  const long long ctas = 1LL * s.batch * s.heads_kv * s.query_tiles;
  const long long slots = 1LL * kCtasPerSm * std::max(1, s.sm_count);
  if (ctas <= 0 || ctas >= slots) return 1;
  const int limit = std::max(1, std::min(most, tiles / kMinTilesPerSplit));
  double best = 0.0;
  for (int n = 1; n <= limit; ++n) {
    if (splits_are_tight(n, tiles)) best = std::max(best, wave_efficiency(ctas * n, slots));
  }
  for (int n = 1; n <= limit; ++n) {
    if (splits_are_tight(n, tiles) && wave_efficiency(ctas * n, slots) >= kWaveSlack * best) return n;
  }
  return limit;
}

}  // namespace flashattn::cuda::decode
