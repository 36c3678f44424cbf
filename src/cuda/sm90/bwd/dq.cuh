// The Hopper backward's dQ reduction: each consumer's dQ partial (dS K over
// its share of the tile) is added into the f32 dQ accumulator, one of three ways:
//   kDqTma   staged in shared memory (stage_dq), added by TMA reduce-adds
//            issued by the producer warpgroup's second warp (reduce_dq);
//   split-d  (d 256) transposed through shared memory by each warp, then
//            red.global.add.v4.f32 along dQ rows (red_dq_rows);
//   else     red.global.add.v2.f32 from the fragment (red_dq_frags).
// The shared pre-pass (cuda/bwd/passes.cu) zeroed the accumulator; the
// post-pass scales it into dq.
//
// NOTES:
// - Deterministic mode: the reducer warp (split-d: the consumers, between two
//   barriers of their 256 threads) adds key tile n's dQ share of query tile m
//   only after key tile n+1 (if it sees m) has published its own (a counter
//   per (sequence, query head, query tile), release/acquire, as the sm80
//   kernel orders its atomics); the highest key tile is dispatched first so
//   that the chain cannot deadlock. Varlen batches
//   fall back to sm80 there: a tile's zero rows past its sequence are added
//   into the next sequence's rows in no fixed order (the sign of a zero could
//   change between runs).
// - dQ without TMA (d 256): the L2 counts requests, not bytes. A thread's
//   accumulator fragment holds 2 adjacent columns per 8, so red.v2 from the
//   fragment makes one 1-sector L2 request per instruction and lane; ncu on
//   the d 256 kernel showed L2 at 82-87% of peak, 66% of it tag lookups, and
//   30% of warp stalls on the reds. Rows made contiguous first (8 lanes x 16
//   bytes = one 128-byte row segment) cut requests 4x: +12..32% backward
//   TFLOP/s (docs/performance.md).
#pragma once

#include <cuda.h>

#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/common/named_barrier.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// The reducer warp: adds each finished dQ tile into the f32 accumulator with
// one TMA reduce per 32-column box (rows past the tensor are skipped; rows
// past a varlen sequence hold zeros: dS = 0 there).
template <class K>
__device__ __forceinline__ void reduce_dq(const CUtensorMap* tma_dq, const AttentionParams& p,
                                          const bwd::Workspace& ws, const BwdCta& cta, int lane, int bq,
                                          int row_q0) {
  uint8_t* const smem = smem_raw + smem_align_pad();
  for (int it = 0; it < cta.w.iters; ++it) {
    const int qb = it % (K::kDqBufs > 0 ? K::kDqBufs : 1);
    const int h = cta.head(it);
    const int m = cta.w.query_tile(it), q0 = m * K::kBlockM;
    int* sem = p.deterministic ? ws.dq_semaphore(p, cta.b, h, m) : nullptr;
    if (sem != nullptr && lane == 0) {
      // Key tile n+1, if it sees query tile m, adds its share first.
      wait_dq_turn(sem, cta.mask, m, cta.n_tile, K::kBlockM, K::kBlockN, cta.seq.seqlen_k);
      fence_proxy_async_global();  // its adds (seen by the acquire) before ours
    }
    named_sync(K::kDqFull0 + qb, K::kDqBarThreads);
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < K::kHeadDim / 32; ++c)
        tma_reduce_add_4d(tma_dq, smem + K::kDqOff + qb * K::kDqBytes + c * K::kBlockM * 128, c * 32,
                          row_q0 + q0, h, bq);
      bulk_commit();
      if (sem != nullptr) {
        bulk_wait<0>();  // the adds are performed, then published
        fence_proxy_async_global();
        publish_dq_turn(sem, cta.n_tile);
      } else {
        bulk_wait_read<0>();
      }
    }
    __syncwarp();
    // The consumers wait for this buffer only if they will fill it again.
    if (it + K::kDqBufs < cta.w.iters) named_arrive(K::kDqFree0 + qb, K::kDqBarThreads);
  }
  if (lane == 0) bulk_wait<0>();
}

}  // namespace flashattn::cuda::sm90
