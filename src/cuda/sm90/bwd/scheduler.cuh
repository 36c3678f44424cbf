// The Hopper backward's scheduler: one CTA per key tile of one kv head of one
// sequence; which query tiles (of which query heads) it walks, in which order.
#pragma once

#include "attention/mask.h"
#include "core/params.h"

namespace flashattn::cuda::sm90 {

// Query tiles [m_begin, m_begin + n_m) see key tile n (rows k0 .. k0 + kv_rows);
// iteration it takes query head it / n_m of the group and the query tiles in
// the order m_begin + (it + m_rot) % n_m (see NOTES on the rotation).
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

}  // namespace flashattn::cuda::sm90
