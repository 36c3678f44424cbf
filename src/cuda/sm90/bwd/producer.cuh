// The Hopper backward's producer warpgroup: warp 0 loads K and V once (TMA),
// then per query tile Q and dO (TMA) and the tile's lse (log2 domain) and D
// rows (plain loads by the warp's 32 lanes, published by their mbarrier
// arrivals) into the kStages ring; warp 1 (kDqTma) is the dQ reducer, adding
// each finished dQ partial tile into the f32 accumulator with TMA reduce-adds.
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention/mask.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/smem.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

template <class K, typename T>
struct BwdProducer {
  static constexpr int D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  const AttentionParams& p;
  const bwd::Workspace& ws;
  const MaskPolicy& mask;
  const KeyTileWork& w;
  const SequenceInfo& seq;
  const BwdSmem<K>& sm;
  int n_tile, hk, b, group, lane;  // group: query heads per kv head (p.group_size())

  // One TMA reduce per 32-column box (rows past the tensor are skipped; rows
  // past a varlen sequence hold zeros: dS = 0 there).
  __device__ __forceinline__ void reduce_dq(const CUtensorMap* tma_dq) const {
    const int bq = p.is_varlen() ? 0 : b;
    const int row_q0 = p.is_varlen() ? static_cast<int>(seq.row_q) : 0;
    for (int it = 0; it < w.iters; ++it) {
      const int qb = it % (K::kDqBufs > 0 ? K::kDqBufs : 1);
      const int h = hk * group + it / w.n_m;
      const int m = w.query_tile(it), q0 = m * kBlockM;
      int* sem = p.deterministic ? ws.dq_semaphore(p, b, h, m) : nullptr;
      if (sem != nullptr && lane == 0) {
        // Key tile n+1, if it sees query tile m, adds its share first.
        wait_dq_turn(sem, mask, m, n_tile, kBlockM, kBlockN, seq.seqlen_k);
        fence_proxy_async_global();  // its adds (seen by the acquire) before ours
      }
      named_sync(K::kDqFull0 + qb, K::kDqBarThreads);
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < D / 32; ++c)
          tma_reduce_add_4d(tma_dq, sm.base + K::kDqOff + qb * K::kDqBytes + c * kBlockM * 128, c * 32,
                            row_q0 + q0, h, bq);
        bulk_commit();
        if (sem != nullptr) {
          bulk_wait<0>();  // the adds are performed, then published
          fence_proxy_async_global();
          publish_dq_turn(sem, n_tile);
        } else {
          bulk_wait_read<0>();
        }
      }
      __syncwarp();
      // The consumers wait for this buffer only if they will fill it again.
      if (it + K::kDqBufs < w.iters) named_arrive(K::kDqFree0 + qb, K::kDqBarThreads);
    }
    if (lane == 0) bulk_wait<0>();
  }

  // lse in the log2 domain (+inf for rows that see no key and rows past the
  // sequence: P = 0 there) and D of query tile q0's rows, into stage s.
  __device__ __forceinline__ void load_rows(int s, int h, int q0) const {
#pragma unroll
    for (int r = lane; r < kBlockM; r += 32) {
      const int i = q0 + r;
      float lse2 = INFINITY, dd = 0.0f;
      if (i < seq.seqlen_q) {
        const float lse = p.lse[lse_offset(p, b, seq.row_q, i, h)];
        lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
        dd = ws.row_d[static_cast<int64_t>(h) * p.total_q + seq.row_q + i];
      }
      sm.lse[s * kBlockM + r] = lse2;
      sm.d[s * kBlockM + r] = dd;
    }
  }

  __device__ __forceinline__ void load(const CUtensorMap* tma_q, const CUtensorMap* tma_do, const CUtensorMap* tma_k,
                                       const CUtensorMap* tma_v) const {
    const bool varlen = p.is_varlen();
    const int bq = varlen ? 0 : b;
    const int row_q0 = varlen ? static_cast<int>(seq.row_q) : 0;
    const int row_k = (varlen ? static_cast<int>(seq.row_k) : 0) + w.k0;
    if (lane == 0) {
      tma_prefetch_map(tma_q);
      tma_prefetch_map(tma_do);
      mbar_arrive_expect_tx(sm.full_kv, 2 * K::kKVBytes);
#pragma unroll
      for (int c = 0; c < K::kColBlocks; ++c) {
        tma_load_4d(sm.base + K::kKOff + c * kBlockN * 128, tma_k, sm.full_kv, c * 64, row_k, hk, bq);
        tma_load_4d(sm.base + K::kVOff + c * kBlockN * 128, tma_v, sm.full_kv, c * 64, row_k, hk, bq);
      }
    }
    for (int it = 0; it < w.iters; ++it) {
      const int s = it % K::kStages;
      const uint32_t ph = (it / K::kStages) & 1;
      const int h = hk * group + it / w.n_m;
      const int q0 = w.query_tile(it) * kBlockM;
      mbar_wait(&sm.empty[s], ph ^ 1);
      if (lane == 0) {
        mbar_arrive_expect_tx(&sm.full[s], 2 * K::kQBytes);
#pragma unroll
        for (int c = 0; c < K::kColBlocks; ++c) {
          tma_load_4d(sm.base + K::kQOff + s * K::kQBytes + c * kBlockM * 128, tma_q, &sm.full[s], c * 64,
                      row_q0 + q0, h, bq);
          tma_load_4d(sm.base + K::kDoOff + s * K::kQBytes + c * kBlockM * 128, tma_do, &sm.full[s], c * 64,
                      row_q0 + q0, h, bq);
        }
      }
      load_rows(s, h, q0);
      mbar_arrive(&sm.full[s]);  // release: the stores above are visible to the waiters
    }
  }
};

}  // namespace flashattn::cuda::sm90
