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
#include "cuda/common/block_sparse.cuh"
#include "cuda/sm90/fwd/traits.h"

namespace flashattn::cuda::sm90 {

// What one tile of the persistent walk covers.
struct TileWork {
  SequenceInfo seq;
  int b, h, m0;
  int n_begin, n_end;  // K/V tile range [n_begin, n_end), walked from n_end - 1 down
  int e_first, e_last; // ListedKeys (set by its narrow()): the tile's entries [e_first, e_last) of the list
  bool valid;          // a query tile (mb >= 0) with m0 < seqlen_q of this sequence
};

// One step of a query tile's walk over its key tiles (from the highest down):
// key tile n (Walk::Step); for ListedKeys also the tile walked before it, its
// entry, and whether the block mask lists only part of the tile's pairs.
struct DenseStep {
  int n;
  static constexpr bool partial = false;
};
struct ListedStep {
  int n;
  int above;  // the tile walked before this one
  int e;      // the entry of tile n
  bool partial;
};

// Which key tiles a query tile walks, as a small policy type of the kernel
// (launch.cuh picks one per call; producer and consumers walk the same):
//   DenseKeys   every tile of the element mask's range [n_begin, n_end): the
//               kernel without a block mask
//   ListedKeys  only the tiles of that range the block mask lists for the
//               query tile (its Tiles, cuda/common/block_sparse.cuh): a tile
//               in no list is neither loaded nor computed, and a tile listed
//               in part is masked per element (softmax.cuh)
// Walk::Tiles: the lists block_sparse_forward_kernel gets (kernel.cuh says
// why it is a kernel of its own); empty for DenseKeys.
struct DenseKeys {
  struct Tiles {};
  using Step = DenseStep;
  static constexpr bool kListed = false;
  template <int kBlockM>
  __device__ __forceinline__ static void narrow(const AttentionParams&, const Tiles&, TileWork&) {}
  __device__ __forceinline__ static Step first(const Tiles&, const TileWork& w) { return {w.n_end - 1}; }
  // n_begin - 1 past the last tile.
  __device__ __forceinline__ static void advance(const Tiles&, const TileWork&, Step& k) { --k.n; }
  // The tile walked before k (its V is loaded after k's K), if any.
  __device__ __forceinline__ static int above(const Step& k) { return k.n + 1; }
  __device__ __forceinline__ static bool has_above(const TileWork& w, const Step& k) { return k.n < w.n_end - 1; }
};

// NOTES: n_begin and n_end become the lowest listed tile and one past the
// highest, so the walk's end tests (n == n_begin: the tile's last step) are
// the dense walk's.
struct ListedKeys {
  using Tiles = BlockTiles;
  using Step = ListedStep;
  static constexpr bool kListed = true;
  // The query tile's entries among the element mask's key tiles: its whole
  // list, cut at both ends to the mask's range.
  // NOTES: each end is searched only when it lies outside the range: every
  // consumer thread and the producer narrow each tile on the way from one
  // tile to the next, a binary search is a chain of ~log2(entries) dependent
  // loads, and the ends rarely lie outside (lists usually hold the element
  // mask's own blocks): then it costs the two end loads.
  template <int kBlockM>
  __device__ __forceinline__ static void narrow(const AttentionParams& p, const Tiles& tiles, TileWork& w) {
    const TileList& list = tiles.key_tiles;
    const int64_t r = BlockTiles::list_row(p.block_mask, w.b, w.h) * list.tiles + w.m0 / kBlockM;
    w.e_first = list.start[r];
    w.e_last = list.start[r + 1];
    if (w.e_last > w.e_first && TileList::index(list.entries[w.e_last - 1]) >= w.n_end)
      w.e_last = list.lower_bound(w.e_first, w.e_last, w.n_end);
    if (w.e_first < w.e_last && TileList::index(list.entries[w.e_first]) < w.n_begin)
      w.e_first = list.lower_bound(w.e_first, w.e_last, w.n_begin);
    if (w.e_first < w.e_last) {
      w.n_begin = TileList::index(list.entries[w.e_first]);
      w.n_end = TileList::index(list.entries[w.e_last - 1]) + 1;
    } else {
      w.n_end = w.n_begin;
    }
  }
  __device__ __forceinline__ static Step first(const Tiles& tiles, const TileWork& w) {
    Step k{0, 0, w.e_last, false};
    advance(tiles, w, k);
    k.above = w.n_end;  // (no tile walked before the first)
    return k;
  }
  __device__ __forceinline__ static void advance(const Tiles& tiles, const TileWork& w, Step& k) {
    k.above = k.n;
    if (--k.e >= w.e_first) {
      const int32_t entry = tiles.key_tiles.entries[k.e];
      k.n = TileList::index(entry);
      k.partial = !TileList::full(entry);
    } else {
      k.n = w.n_begin - 1;
    }
  }
  __device__ __forceinline__ static int above(const Step& k) { return k.above; }
  __device__ __forceinline__ static bool has_above(const TileWork& w, const Step& k) { return k.above < w.n_end; }
  // Step `step` of this CTA in the launch's schedule (TileSchedule, built
  // longest first on the host): (sequence, query head) bh and query tile mb.
  __device__ __forceinline__ static bool tile_at(const Tiles& tiles, int step, int& bh, int& mb) {
    const int32_t t = tiles.schedule.tiles[step * gridDim.x + blockIdx.x];
    if (t < 0) return false;
    const int q_tiles = tiles.key_tiles.tiles;
    bh = t / q_tiles;
    mb = t - bh * q_tiles;
    return true;
  }
};

// Query tile mb (none when < 0) of (sequence, query head) bh. kCache: the
// sequence's key count from p.seqused_k (the KV-cache route).
template <int kBlockM, int kBlockN, bool kCache, class Walk>
__device__ __forceinline__ TileWork tile_work_of(const AttentionParams& p, const typename Walk::Tiles& blocks,
                                                 int bh, int mb) {
  TileWork w;
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
    Walk::template narrow<kBlockM>(p, blocks, w);
  }
  return w;
}

// Rank t of the tile order.
template <int kBlockM, int kBlockN, bool kCache, class Walk>
__device__ __forceinline__ TileWork tile_work(const AttentionParams& p, const FwdArgs& a,
                                              const typename Walk::Tiles& blocks, int t) {
  int bh, mb;
  tile_of_rank(a.order, p.batch * p.heads_q, t, bh, mb);
  return tile_work_of<kBlockM, kBlockN, kCache, Walk>(p, blocks, bh, mb);
}

// Step `step` of this CTA's walk: in the main kernel round `step` of whole
// tiles (ListedKeys: step `step` of its schedule); in the split-tail kernel
// (kSplit) its segment `step` of the tail, a key range of a tail tile (seg).
// false: no tile at this step.
template <int kBlockM, int kBlockN, bool kSplit, bool kCache, class Walk = DenseKeys>
__device__ __forceinline__ bool work_at(const AttentionParams& p, const FwdArgs& a,
                                        const typename Walk::Tiles& blocks, int step, TileWork& w,
                                        SplitSegment& seg) {
  if constexpr (kSplit) {
    if (!split_segment(a.tail, gridDim.x, blockIdx.x, step, seg)) return false;
    static_assert(!Walk::kListed, "the split tail walks key ranges");
    w = tile_work<kBlockM, kBlockN, kCache, Walk>(p, a, blocks, a.tail.first_rank + seg.tile);
    w.n_end = min(w.n_end, w.n_begin + seg.key_hi);
    w.n_begin += seg.key_lo;
    return true;
  } else if constexpr (Walk::kListed) {
    int bh, mb;
    if (!Walk::tile_at(blocks, step, bh, mb)) return false;
    w = tile_work_of<kBlockM, kBlockN, kCache, Walk>(p, blocks, bh, mb);
    return true;
  } else {
    const int t = rank_of(a.order, step, gridDim.x, blockIdx.x);
    if (t >= a.order.num_ranks) return false;
    w = tile_work<kBlockM, kBlockN, kCache, Walk>(p, a, blocks, t);
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
