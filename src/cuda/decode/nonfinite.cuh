// The NaN/Inf rules (docs/semantics.md) in the split-KV decode kernel.
//
// The kernel's P V product is dense over a key tile, so a key masked for some
// rows of a packed tile (causal or window with several query positions) adds
// 0 x V there: an Inf or NaN in that V row turns those rows' O into NaN. As in
// the prefill kernels (common/nonfinite.cuh), write_rows checks what it
// stores and, only where it found an Inf or NaN, the CTA recomputes those rows
// exactly in f32 over their visible keys of the split, with the cache's
// addressing (core/kvcache.h: pages, cache_batch_idx) and the score
// modifiers of attention/score_mod.h, and stores them over the regular
// stores: out and lse with one split, else the split's normalised partial,
// which the combine merges as any other.
#pragma once

#include <cstdint>

#include "attention/score_mod.h"
#include "core/kvcache.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/decode/common.cuh"

namespace flashattn::cuda::decode {

// nonfinite::detail::sum_row's view of query position i of head h in a
// decode tile: the sequence's mask, the kernel's score modifiers, its K/V
// rows in the cache. No dropout on the KV-cache path.
struct CacheRowKeys {
  const KvCacheParams& p;
  const TileWork& t;
  int i;
  AlibiScore alibi;  // slope 0 without ALiBi

  __device__ __forceinline__ bool visible(int j) const { return t.mask.visible(i, j); }
  // s = softcap(scale q . k_j) + ALiBi(i, j), as slice_scores.
  __device__ __forceinline__ float score(float dot, int j) const {
    float s = dot * p.attn.scale;
    if (p.attn.softcap > 0.0f) s = SoftcapScore{p.attn.softcap}(s);
    return alibi(s, i, j);
  }
  template <typename T>
  __device__ __forceinline__ const T* k_row(int j) const {
    return static_cast<const T*>(p.attn.k) + k_cache_offset(p, t.b, j, t.hk);
  }
  template <typename T>
  __device__ __forceinline__ const T* v_row(int j) const {
    return static_cast<const T*>(p.attn.v) + v_cache_offset(p, t.b, j, t.hk);
  }
  __device__ __forceinline__ float factor(int) const { return 1.0f; }
};

// Every warp of the CTA (after a barrier that follows write_rows' stores):
// the tile's packed rows r whose bit is set in `rows`, recomputed over the
// split's keys [tile_begin, tile_end) x block_keys and stored where
// write_rows stored them.
// NOTES: out of line, so the kernel's own code and registers stay as they
// were; the plain path pays one check per stored value and one barrier. The
// CTA's TileWork is derived again here: passed by reference it put a 56-byte
// stack frame in every decode kernel.
template <typename T>
__device__ __noinline__ void fix_rows(const KvCacheParams& p, const Work& w, int block_keys, uint32_t rows) {
  using nonfinite::detail::LaneRow;
  const TileWork t = tile_work(p, w, block_keys);  // the CTA's (a function of blockIdx)
  const AttentionParams& a = p.attn;
  const int lane = threadIdx.x % 32, d = a.head_dim;
  const int split_begin = t.tile_begin * block_keys, split_end = min(t.tile_end * block_keys, t.keys);
  for (int r = threadIdx.x / 32; r < t.rows; r += kThreads / 32) {
    if (((rows >> r) & 1u) == 0) continue;
    const int i = t.query_of(r), h = t.head_of(r);
    LaneRow q;
    q.load(query_row<T>(p, w, t.b, i, h), d, lane);
    const CacheRowKeys keys{p, t, i, AlibiScore{a.has_alibi() ? a.alibi_slope(t.b, h) : 0.0f, t.mask.diagonal_offset()}};
    nonfinite::detail::RowSums sums;
    nonfinite::detail::sum_row<T>(q, keys, max(split_begin, t.mask.key_begin(i)), min(split_end, t.mask.key_end(i + 1)),
                                  d, lane, sums);
    if (w.splits == 1) {
      float inv, lse;
      nonfinite::detail::finish_row(a, h, sums, inv, lse);
      sums.o.store(static_cast<T*>(a.out) + out_offset(a, t.b, i, h), inv, d, lane, nonfinite::kAllChunks);
      if (lane == 0 && a.lse != nullptr) a.lse[lse_index(a, t.b, i, h)] = lse;
    } else {
      // The split's partial: normalised O and its lse (the combine adds the sink).
      const int64_t row = partial_row(a, t.split, t.b, i, h);
      sums.o.store(w.partial_o + row * d, sums.inv(), d, lane, nonfinite::kAllChunks);
      if (lane == 0) w.partial_lse[row] = sums.lse();
    }
  }
}

}  // namespace flashattn::cuda::decode
