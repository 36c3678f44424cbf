// The Hopper backward's producer warp (warp 0 of warpgroup 0): K and V of the
// key tile once (TMA), then per query tile of the walk Q and dO (TMA) and the
// tile's lse (log2 domain) and D rows (plain loads by the warp's 32 lanes,
// published by their mbarrier arrivals) into the kStages ring.
//
// NOTES:
// - Rows whose lse is -inf see no key: the producer stores +inf as their
//   log2-domain lse, so P = exp2(x - inf) = 0 and no NaN appears.
// - compute-sanitizer: memcheck is clean; racecheck reports the producer's
//   lse/D stores against the consumers' loads, which mbarrier arrivals and
//   waits order (racecheck does not model mbarriers: false positives).
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention/math.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// K and V of the key tile (rows row_k.., kv head hk, batch bq) onto full_kv.
template <class K>
__device__ __forceinline__ void load_key_tile(const CUtensorMap* tma_k, const CUtensorMap* tma_v,
                                              const BwdSmem<K>& sm, int row_k, int hk, int bq) {
  uint8_t* const smem = smem_raw + smem_align_pad();
  mbar_arrive_expect_tx(sm.full_kv, 2 * K::kKVBytes);
#pragma unroll
  for (int c = 0; c < K::kColBlocks; ++c) {
    tma_load_4d(smem + K::kKOff + c * K::kBlockN * 128, tma_k, sm.full_kv, c * 64, row_k, hk, bq);
    tma_load_4d(smem + K::kVOff + c * K::kBlockN * 128, tma_v, sm.full_kv, c * 64, row_k, hk, bq);
  }
}

// Q and dO of the query tile at tensor row row_q (head h, batch bq) into stage s.
template <class K>
__device__ __forceinline__ void load_query_tile(const CUtensorMap* tma_q, const CUtensorMap* tma_do,
                                                const BwdSmem<K>& sm, int s, int row_q, int h, int bq) {
  uint8_t* const smem = smem_raw + smem_align_pad();
  mbar_arrive_expect_tx(&sm.full[s], 2 * K::kQBytes);
#pragma unroll
  for (int c = 0; c < K::kColBlocks; ++c) {
    tma_load_4d(smem + K::kQOff + s * K::kQBytes + c * K::kBlockM * 128, tma_q, &sm.full[s], c * 64, row_q, h, bq);
    tma_load_4d(smem + K::kDoOff + s * K::kQBytes + c * K::kBlockM * 128, tma_do, &sm.full[s], c * 64, row_q, h,
                bq);
  }
}

// lse in the log2 domain (+inf for rows that see no key and rows past the
// sequence: P = 0 there) and D of the rows q0.. of head h into stage s, one row
// per lane and step. With dropout the factor z = 1 / (1 - p8) goes in here:
// lse2 - log2 z makes the consumers' P z, and D z^-1 with it gives
//   P z (keep dP - D / z) = P (z keep dP - D) = dS
// (bwd/dropout.cuh), so no multiply by z is left per element or on dV.
template <class K, class Drop>
__device__ __forceinline__ void load_row_stats(const AttentionParams& p, const bwd::Workspace& ws,
                                               const BwdCta& cta, const BwdSmem<K>& sm, int s, int q0, int h,
                                               int lane) {
  constexpr int kBlockM = K::kBlockM;
#pragma unroll
  for (int r = lane; r < kBlockM; r += 32) {
    const int i = q0 + r;
    float lse2 = INFINITY, dd = 0.0f;
    if (i < cta.seq.seqlen_q) {
      const float lse = p.lse[lse_offset(p, cta.b, cta.seq.row_q, i, h)];
      lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      dd = ws.row_d[static_cast<int64_t>(h) * p.total_q + cta.seq.row_q + i];
      if constexpr (Drop::kOn) {
        lse2 -= fast_log2(p.dropout.scale);
        dd *= 1.0f / p.dropout.scale;
      }
    }
    sm.lse[s * kBlockM + r] = lse2;
    sm.d[s * kBlockM + r] = dd;
  }
}

// The producer warp's walk (warp 0 of warpgroup 0; the other warps return):
// K, V once, then every query tile of the walk into the ring (stage
// it % kStages, once the consumers have released it).
// NOTES: the warp test is made here, not by the caller: there, lane's only
// use would have been this call, and the compiler moved its computation past
// the test (different SASS at d 256).
template <class K, class Drop, class Walk>
__device__ __forceinline__ void produce(const CUtensorMap* tma_q, const CUtensorMap* tma_do,
                                        const CUtensorMap* tma_k, const CUtensorMap* tma_v,
                                        const AttentionParams& p, const bwd::Workspace& ws, const BwdCta& cta,
                                        const typename Walk::Tiles& tiles, const BwdSmem<K>& sm, int warp, int lane,
                                        int bq, int row_q0) {
  if (warp != 0 || cta.w.iters == 0) return;
  const int row_k = (cta.varlen ? static_cast<int>(cta.seq.row_k) : 0) + cta.w.k0;
  if (lane == 0) {
    tma_prefetch_map(tma_q);
    tma_prefetch_map(tma_do);
    load_key_tile<K>(tma_k, tma_v, sm, row_k, cta.hk, bq);
  }
  for (int it = 0; it < cta.w.iters; ++it) {
    const int s = it % K::kStages;
    const uint32_t ph = (it / K::kStages) & 1;
    int h, m;
    Walk::step(tiles, cta, it, h, m);
    const int q0 = m * K::kBlockM;
    mbar_wait(&sm.empty[s], ph ^ 1);
    if (lane == 0) load_query_tile<K>(tma_q, tma_do, sm, s, row_q0 + q0, h, bq);
    load_row_stats<K, Drop>(p, ws, cta, sm, s, q0, h, lane);
    mbar_arrive(&sm.full[s]);  // release: the stores above are visible to the waiters
  }
}

}  // namespace flashattn::cuda::sm90
