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

// NOTES: CTAs without splitting = batch * heads_kv * query_tiles. Each split
// adds one partial (O, lse) per packed row and a combine pass, so split only
// while the GPU would otherwise hold fewer than kCtasPerSm CTAs per SM, and
// never into pieces of fewer than kMinTilesPerSplit tiles.
inline int choose_splits(const SplitShape& s) {
  const int tiles = std::max(1, (s.max_keys + s.block_keys - 1) / s.block_keys);
  const int most = std::max(1, std::min(kMaxSplits, tiles));
  if (s.forced > 0) return std::min(s.forced, most);
  const long long ctas = 1LL * s.batch * s.heads_kv * s.query_tiles;
  const long long target = 1LL * kCtasPerSm * s.sm_count;
  if (ctas <= 0 || ctas >= target) return 1;
  const int wanted = static_cast<int>((target + ctas - 1) / ctas);
  const int by_length = std::max(1, tiles / kMinTilesPerSplit);
  return std::max(1, std::min({wanted, by_length, most}));
}

}  // namespace flashattn::cuda::decode
