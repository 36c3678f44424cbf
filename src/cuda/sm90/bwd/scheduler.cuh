// The Hopper backward's scheduler: one CTA per key tile of one kv head of one
// sequence; which query tiles (of which query heads) it walks, in which order.
//
// NOTES: key tiles start their walk over the query tiles at different tiles
// (KeyTileWork::m_rot = n_tile % n_m): the CTAs running side by side are
// mostly neighbouring key tiles of one head, and in the same order they would
// add into the same dQ rows at the same time. Not in deterministic mode, whose
// adds go in key-tile order anyway.
#pragma once

#include "attention/mask.h"
#include "core/layout.h"
#include "core/params.h"

namespace flashattn::cuda::sm90 {

// Query tiles [m_begin, m_begin + n_m) see key tile n (rows k0 .. k0 + kv_rows);
// iteration it takes query head it / n_m of the group and the query tiles in
// the order m_begin + (it + m_rot) % n_m (see NOTES).
struct KeyTileWork {
  int k0, kv_rows, m_begin, n_m, iters;  // iters = n_m * query heads of the group
  int m_rot;
  __device__ __forceinline__ int query_tile(int it) const {
    const int r = it % n_m + m_rot;
    return m_begin + (r >= n_m ? r - n_m : r);
  }
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ KeyTileWork key_tile_work(const AttentionParams& p, const MaskPolicy& mask,
                                                     int n_tile) {
  KeyTileWork w;
  w.k0 = n_tile * kBlockN;
  w.kv_rows = min(kBlockN, mask.seqlen_k - w.k0);
  w.m_begin = mask.query_begin(w.k0) / kBlockM;
  const int m_end = (mask.query_end(w.k0 + w.kv_rows) + kBlockM - 1) / kBlockM;
  w.n_m = max(0, m_end - w.m_begin);
  w.iters = w.n_m * p.group_size();
  w.m_rot = (p.deterministic || w.n_m == 0) ? 0 : n_tile % w.n_m;
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

// This CTA's work; false if its key tile lies past the sequence (the whole
// CTA returns then, before any barrier). Deterministic mode dispatches the
// highest key tile first (see dq.cuh's NOTES).
// NOTES: filled in place, field by field, in the order the fields are known:
// built as one aggregate after the exit test, it moved the read of
// blockIdx.y there (different SASS).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool bwd_cta(const AttentionParams& p, BwdCta& c) {
  c.n_tile = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  c.hk = blockIdx.y;
  c.b = blockIdx.z;
  c.seq = sequence_info(p, c.b);
  if (c.n_tile * kBlockN >= c.seq.seqlen_k) return false;
  c.mask = mask_for(p, c.seq);
  c.w = key_tile_work<kBlockM, kBlockN>(p, c.mask, c.n_tile);
  c.group = p.group_size();
  c.varlen = p.is_varlen();
  return true;
}

}  // namespace flashattn::cuda::sm90
