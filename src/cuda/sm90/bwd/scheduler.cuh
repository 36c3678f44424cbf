// The Hopper backward's scheduler: one CTA per key tile of one kv head of one
// sequence; which query tiles (of which query heads) it walks, in which order.
//
// NOTES: key tiles start their walk over the query tiles at different tiles
// (KeyTileWork::m_rot = n_tile % n_m): the CTAs running side by side are
// mostly neighbouring key tiles of one head, and in the same order they would
// add into the same dQ rows at the same time. In deterministic mode the walks
// are rotated too where the mask lets every key tile see every query tile and
// a head's key tiles all run at once (Workspace::rotated_turns): each query
// tile's adds then go in the order the walks meet it (rotated_dq_turn),
// one step apart. Otherwise the walks start at their first query tile and
// every query tile takes its adds from the highest key tile down, an order
// that waits only on key tiles dispatched earlier (any grid size) but puts the
// CTAs of a head one handoff apart per key tile.
#pragma once

#include "attention/mask.h"
#include "attention/work_plan.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/block_sparse.cuh"

namespace flashattn::cuda::sm90 {

// Query tiles [m_begin, m_begin + n_m) see key tile n (rows k0 .. k0 + kv_rows);
// iteration it takes query head it / n_m of the group and the query tiles in
// the order m_begin + (it + m_rot) % n_m (see NOTES).
struct KeyTileWork {
  int k0, kv_rows, m_begin, n_m, iters;  // iters = n_m * query heads of the group
  int m_rot;
  int first;  // ListedQueryWalk: the key tile's first step in the list
  __device__ __forceinline__ int query_tile(int it) const {
    const int r = it % n_m + m_rot;
    return m_begin + (r >= n_m ? r - n_m : r);
  }
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ KeyTileWork key_tile_work(const AttentionParams& p, const MaskPolicy& mask,
                                                     int n_tile, bool rotated_turns) {
  KeyTileWork w;
  w.k0 = n_tile * kBlockN;
  w.kv_rows = min(kBlockN, mask.seqlen_k - w.k0);
  w.m_begin = mask.query_begin(w.k0) / kBlockM;
  const int m_end = (mask.query_end(w.k0 + w.kv_rows) + kBlockM - 1) / kBlockM;
  w.n_m = max(0, m_end - w.m_begin);
  w.iters = w.n_m * p.group_size();
  w.m_rot = ((p.deterministic && !rotated_turns) || w.n_m == 0) ? 0 : n_tile % w.n_m;
  return w;
}

// One CTA's work, fixed for the kernel: key tile n_tile of kv head hk of
// sequence b, the sequence's mask, and the query tiles it walks.
struct BwdCta {
  int n_tile, hk, b;
  SequenceInfo seq;
  MaskPolicy mask;
  KeyTileWork w;
  int group;  // query heads per kv head
  bool varlen;
  // Query head of iteration it of the walk.
  __device__ __forceinline__ int head(int it) const { return hk * group + it / w.n_m; }
};

// Which (query head, query tile) steps a key tile walks, as a small policy
// type of the kernel (launch.cuh picks one per call; every role walks the
// same):
//   DenseQueryWalk   every query tile of the element mask's range for every
//                    query head of the group (the kernel without a block mask)
//   ListedQueryWalk  the steps of a block mask listed for the key tile, built
//                    on the host (BlockWalk::kGroupSteps), inside the element
//                    mask's range (varlen calls: cut to it in narrow); a
//                    step listed in part tests each pair
//                    (zero_unlisted, softmax.cuh); a key tile no query
//                    tile lists walks none and writes dK = dV = 0; in
//                    deterministic mode a key tile's dQ turn follows the
//                    next-higher key tile that lists the same query tile
// Walk::Tiles: the lists the kernel gets (kernel.cuh).
struct DenseQueryWalk {
  struct Tiles {};
  static constexpr bool kListed = false;
  __device__ __forceinline__ static void narrow(const AttentionParams&, const Tiles&, BwdCta&) {}
  // Step it: query head h, query tile m; whether the block mask lists the
  // tile in part (never here).
  __device__ __forceinline__ static bool step(const Tiles&, const BwdCta& c, int it, int& h, int& m) {
    h = c.head(it);
    m = c.w.query_tile(it);
    return false;
  }
  // Deterministic mode: the key tile whose dQ adds into a query tile come
  // right before this one's, from which step of the walk over one head's
  // query tiles (steps before it: none, this key tile adds first). Without
  // rotated walks the next-higher key tile, from the first query tile it sees;
  // with them attention/work_plan.h's order.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static DqTurn dq_turn(const bwd::Workspace& ws, const BwdCta& c) {
    const int n = (c.seq.seqlen_k + kBlockN - 1) / kBlockN;
    if (ws.rotated_turns != 0) return rotated_dq_turn(c.n_tile, c.w.m_rot, n, c.w.n_m);
    const int next = c.n_tile + 1;
    if (next >= n) return DqTurn{-1, 0};
    return DqTurn{next, c.mask.query_begin(next * kBlockN) / kBlockM - c.w.m_begin};
  }
  // One thread: returns once step it's turn (query tile m) has come.
  // NOTES: the reducer warp runs this on 24 registers. (k + 1) mod n_m is
  // taken from m_rot and the step from m (no division of their own: a
  // division by n_m beside the walk's own made the d 128 kernels spill 4-12
  // bytes).
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static void wait_turn(const int* sem, const Tiles&, const DqTurn& turn,
                                                   const BwdCta& c, int, int m) {
    int s = m - c.w.m_begin - c.w.m_rot;  // the step: (m - m_begin - m_rot) mod n_m
    if (s < 0) s += c.w.n_m;
    if (turn.before >= 0 && s >= turn.from_step) wait_dq_published(sem, turn.before);
  }
};

struct ListedQueryWalk {
  using Tiles = BlockTiles;
  static constexpr bool kListed = true;
  // The key tile's steps: entries [first, first + iters) of its list row;
  // varlen calls keep those whose query tile lies in the sequence's range
  // [m_begin, m_begin + n_m) (the host orders them by query tile there).
  __device__ __forceinline__ static void narrow(const AttentionParams& p, const Tiles& tiles, BwdCta& c) {
    const TileList& l = tiles.steps;
    const int64_t r = (int64_t{c.b} * p.heads_kv + c.hk) * l.tiles + c.n_tile;
    c.w.first = l.start[r];
    c.w.iters = l.start[r + 1] - c.w.first;
    if (p.is_varlen()) {
      const int end = c.w.first + c.w.iters;
      const int lo = l.lower_bound(c.w.first, end, c.w.m_begin, kStepTileMask);
      c.w.iters = l.lower_bound(lo, end, c.w.m_begin + c.w.n_m, kStepTileMask) - lo;
      c.w.first = lo;
    }
  }
  // NOTES: the entry holds the query head itself, not its index in the group:
  // hk * group held across the consumers' loop spilled 8 bytes at d 128.
  __device__ __forceinline__ static bool step(const Tiles& tiles, const BwdCta& c, int it, int& h, int& m) {
    const int32_t entry = tiles.steps.entries[c.w.first + it];
    h = (entry >> kStepHeadShift) & kStepHeadMask;
    m = entry & kStepTileMask;
    return (entry & kStepPartial) != 0;
  }
  // As DenseQueryWalk's, with the next-higher key tile that lists the step's
  // (h, m) found on the host per step (BlockTiles::step_turns, as
  // wait_dq_turn's n_tile less one; gridDim.x - 1 when none, so the wait
  // returns at once).
  // NOTES: a binary search here (as the sm80 kernel does) spilled 8 bytes
  // in the d 64 / d 128 block-mask kernels.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static DqTurn dq_turn(const bwd::Workspace&, const BwdCta&) {
    return DqTurn{};
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static void wait_turn(const int* sem, const Tiles& tiles, const DqTurn&,
                                                   const BwdCta& c, int it, int m) {
    wait_dq_turn(sem, c.mask, m, tiles.step_turns[c.w.first + it], kBlockM, kBlockN, c.seq.seqlen_k);
  }
};

// This CTA's work; false if its key tile lies past the sequence (the whole
// CTA returns then, before any barrier). Deterministic mode dispatches the
// highest key tile first (see dq.cuh's NOTES).
// NOTES: filled in place, field by field, in the order the fields are known:
// built as one aggregate after the exit test, it moved the read of
// blockIdx.y there (different SASS).
template <int kBlockM, int kBlockN, class Walk = DenseQueryWalk>
__device__ __forceinline__ bool bwd_cta(const AttentionParams& p, const bwd::Workspace& ws,
                                        const typename Walk::Tiles& tiles, BwdCta& c) {
  c.n_tile = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  c.hk = blockIdx.y;
  c.b = blockIdx.z;
  c.seq = sequence_info(p, c.b);
  if (c.n_tile * kBlockN >= c.seq.seqlen_k) return false;
  c.mask = mask_for(p, c.seq);
  c.w = key_tile_work<kBlockM, kBlockN>(p, c.mask, c.n_tile, ws.rotated_turns != 0);
  c.group = p.group_size();
  c.varlen = p.is_varlen();
  Walk::narrow(p, tiles, c);
  return true;
}

}  // namespace flashattn::cuda::sm90
