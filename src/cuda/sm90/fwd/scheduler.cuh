// The Hopper forward's scheduler on the device: step `step` of a CTA's
// persistent walk -> the query tile it covers and its key-tile range. The plan
// itself (tile order, split tail) is host + device code in attention/work_plan.h.
// Producer and consumers compute the same walk, so they agree on which tiles
// carry loads.
#pragma once

#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/sm90/fwd/traits.h"

namespace flashattn::cuda::sm90 {

// What one tile of the persistent walk covers.
struct TileWork {
  SequenceInfo seq;
  int b, h, m0;
  int n_begin, n_end;  // K/V tile range [n_begin, n_end), walked from n_end - 1 down
  bool valid;          // a query tile (mb >= 0) with m0 < seqlen_q of this sequence
};

// kCache: the sequence's key count from p.seqused_k (the KV-cache route).
template <int kBlockM, int kBlockN, bool kCache>
__device__ __forceinline__ TileWork tile_work(const AttentionParams& p, const FwdArgs& a, int t) {
  TileWork w;
  int bh, mb;
  tile_of_rank(a.order, p.batch * p.heads_q, t, bh, mb);
  w.b = bh / p.heads_q;
  w.h = bh - w.b * p.heads_q;
  w.seq = sequence_info(p, w.b);
  if constexpr (kCache) w.seq.seqlen_k = p.seqused_k[w.b];
  w.m0 = mb * kBlockM;
  w.valid = mb >= 0 && w.m0 < w.seq.seqlen_q;
  w.n_begin = w.n_end = 0;
  if (w.valid) {
    const KeyTileRange tiles = mask_for(p, w.seq).key_tiles(w.m0, min(w.m0 + kBlockM, w.seq.seqlen_q), kBlockN);
    w.n_begin = tiles.begin;
    w.n_end = tiles.end;
  }
  return w;
}

// Step `step` of this CTA's walk: in the main kernel round `step` of whole
// tiles; in the split-tail kernel (kSplit) its segment `step` of the tail, a
// key range of a tail tile (seg). false: no tile at this step.
template <int kBlockM, int kBlockN, bool kSplit, bool kCache>
__device__ __forceinline__ bool work_at(const AttentionParams& p, const FwdArgs& a, int step, TileWork& w,
                                        SplitSegment& seg) {
  if constexpr (kSplit) {
    if (!split_segment(a.tail, gridDim.x, blockIdx.x, step, seg)) return false;
    w = tile_work<kBlockM, kBlockN, kCache>(p, a, a.tail.first_rank + seg.tile);
    w.n_end = min(w.n_end, w.n_begin + seg.key_hi);
    w.n_begin += seg.key_lo;
    return true;
  } else {
    const int t = rank_of(a.order, step, gridDim.x, blockIdx.x);
    if (t >= a.order.num_ranks) return false;
    w = tile_work<kBlockM, kBlockN, kCache>(p, a, t);
    return true;
  }
}

// A tile of the walk as a consumer thread sees it: what its mask and
// epilogue need.
struct RowTile {
  TileWork w;
  SplitSegment seg;
  MaskPolicy mask;
  int row0;      // this thread's rows: row0, row0 + 8
  int rows_end;  // end of the tile's rows within the sequence
  AlibiScore alibi;  // ALiBi in the units of S (slope / logit_scale); unused when off
};

}  // namespace flashattn::cuda::sm90
