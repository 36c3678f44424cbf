// The Hopper backward kernel (FlashAttention-3's structure, our implementation).
//   traits.h       tile shape, shared-memory layout, barriers (tuning.h)
//   scheduler.cuh  key tile -> the query tiles it walks, and their order
//   kernel.cuh     the producer warpgroup and the consumers (below)
//   launch.cuh     tensor maps and the launch (host)
// NOTES: the producer and consumers stay one function here: split into
// role structs (as the forward is), the same code measured 0.96-1.01 of this
// one at d 64 / 128 (mean 0.98, A/B in one process) with an 8-byte spill at
// d 64; docs/performance.md.
//
// One CTA per key tile: kBlockN = 128 keys (64 in split-d mode, d 256: see
// BwdTraits) of one kv head of one sequence. It
// walks the query tiles that can see the tile (MaskPolicy::query_begin/_end),
// for every query head of the kv head's group, and keeps dK and dV in registers
// throughout. Warpgroup 0 is the producer: its first warp loads K and V once
// (TMA), then per query tile Q and dO (TMA) and the tile's lse (log2 domain)
// and D rows (plain loads by the warp's 32 lanes, published by their mbarrier
// arrivals) into a kStages ring. Warpgroups 1 and 2 are consumers, 64 keys
// each, with keys as wgmma's M dimension:
//   S^T  = K Q^T                  wgmma, A = K (smem, K-major), B = Q (K-major)
//   dP^T = V dO^T                 wgmma, A = V, B = dO
//   P^T  = exp2(S^T * scale*log2e - lse*log2e)    (0 where masked)
//   dS^T = P^T * (dP^T - D)
//   dV  += P^T dO                 wgmma, A = P^T (registers), B = dO (MN-major)
//   dK  += dS^T Q                 wgmma, A = dS^T (registers), B = Q (MN-major)
//   dS^T -> shared memory ([key][query], 128B-swizzled), both warpgroups
//   dQ_partial = dS K             wgmma, A = dS (smem, MN-major), B = K (MN-major)
//   dQ_partial -> shared memory, added into the f32 dQ accumulator by TMA
//                 reduce-adds issued by the producer warpgroup's second warp
//                 (kDqTma); split-d (d 256): transposed through shared memory
//                 by each warp, then red.global.add.v4.f32 along dQ rows.
// The shared pre-pass (cuda/bwd/passes.cu) computed D = rowsum(dO * O) and
// zeroed the accumulator; the post-pass scales it into dq. dK is scaled here.
//
// NOTES:
// - The scale is applied to dK (epilogue) and dQ (post-pass), not folded into
//   dS (fp16 subnormals: see the sm80 kernel's NOTES).
// - Masking: a (query tile, key tile) pair that MaskPolicy::tile_fully_visible
//   clears tests nothing; others zero P outside each key's visible query range
//   [query_begin(j), query_end(j + 1)) (the MaskPolicy's, so the same pairs as
//   visible(i, j)) clipped to the sequence, which also zeroes P for query rows
//   past the sequence (TMA fills them with the next sequence's rows in varlen
//   batches) and for keys past it.
// - Rows whose lse is -inf see no key: the producer stores +inf as their
//   log2-domain lse, so P = exp2(x - inf) = 0 and no NaN appears.
// - Key tiles start their walk over the query tiles at different tiles
//   (KeyTileWork::m_rot = n_tile % n_m): the CTAs running side by side are
//   mostly neighbouring key tiles of one head, and in the same order they
//   would add into the same dQ rows at the same time. Not in deterministic
//   mode, whose adds go in key-tile order anyway.
// - Deterministic mode: the reducer warp (split-d: the consumers, between two
//   barriers of their 256 threads) adds key tile n's dQ share of query tile m
//   only after key tile n+1 (if it sees m) has published its own (a counter
//   per (sequence, query head, query tile), release/acquire, as the sm80
//   kernel orders its atomics); the highest key tile is dispatched first so
//   that the chain cannot deadlock. Varlen batches
//   fall back to sm80 there: a tile's zero rows past its sequence are added
//   into the next sequence's rows in no fixed order (the sign of a zero could
//   change between runs).
// - compute-sanitizer: memcheck is clean; racecheck reports the producer's
//   lse/D stores against the consumers' loads, which mbarrier arrivals and
//   waits order (racecheck does not model mbarriers: false positives).
// - dS^T is double-buffered in shared memory: the one named barrier per query
//   tile (both warpgroups have written their half) also proves that both have
//   finished the dQ wgmma of the tile before, which read the other buffer.
// - dQ without TMA (d 256): the L2 counts requests, not bytes. A thread's
//   accumulator fragment holds 2 adjacent columns per 8, so red.v2 from the
//   fragment makes one 1-sector L2 request per instruction and lane; ncu on
//   the d 256 kernel showed L2 at 82-87% of peak, 66% of it tag lookups, and
//   30% of warp stalls on the reds. Rows made contiguous first (8 lanes x 16
//   bytes = one 128-byte row segment) cut requests 4x: +12..32% backward
//   TFLOP/s (docs/performance.md).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention/mask.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/arch.h"
#include "cuda/sm90/bwd/dq.cuh"
#include "cuda/sm90/bwd/mainloop.cuh"
#include "cuda/sm90/bwd/producer.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

template <class K>
__device__ __forceinline__ void init_barriers(const BwdSmem<K>& sm) {
  constexpr uint32_t kConsumerWarps = 4 * K::kConsumers;
  mbar_init(sm.full_kv, 1);
  for (int s = 0; s < K::kStages; ++s) {
    mbar_init(&sm.full[s], K::kFullArrivals);
    mbar_init(&sm.empty[s], kConsumerWarps);
  }
  mbar_fence_init();
}

template <int D, typename T>
__global__ void __launch_bounds__(BwdTraits<D, T>::kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap tma_q,
                    const __grid_constant__ CUtensorMap tma_dq,
                    const __grid_constant__ CUtensorMap tma_do,
                    const __grid_constant__ CUtensorMap tma_k,
                    const __grid_constant__ CUtensorMap tma_v,
                    const __grid_constant__ AttentionParams p, const bwd::Workspace ws) {
#if FLASHATTN_SM90_DEVICE
  using K = BwdTraits<D, T>;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  BwdCta cta;
  if (!bwd_cta<kBlockM, kBlockN>(p, cta)) return;  // whole CTA: before any barrier

  const BwdSmem<K> sm;

  const int wg = warpgroup_index();
  if (threadIdx.x == 0) init_barriers<K>(sm);
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<K::Tune::kProducerRegs>();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int bq = cta.varlen ? 0 : cta.b;
    const int row_q0 = cta.varlen ? static_cast<int>(cta.seq.row_q) : 0;
    if (K::kDqTma && warp == 1 && cta.w.iters > 0) {
      reduce_dq<K>(&tma_dq, p, ws, cta, lane, bq, row_q0);
      return;
    }
    produce<K>(&tma_q, &tma_do, &tma_k, &tma_v, p, ws, cta, sm, warp, lane, bq, row_q0);
  } else {
    setmaxnreg_inc<K::Tune::kConsumerRegs>();
    consume<K, T>(p, ws, cta, sm, wg - 1);
  }
#endif
}

}  // namespace flashattn::cuda::sm90
