// The Hopper backward kernel (FlashAttention-3's structure, our implementation),
// assembled from its parts:
//   traits.h       tile shape, shared-memory layout and views, barriers (tuning.h)
//   scheduler.cuh  key tile -> the query tiles it walks, and their order
//   producer.cuh   warpgroup 0, warp 0: K, V once; Q, dO, lse, D per query tile
//   mainloop.cuh   warpgroups 1, 2: S^T, dP^T, dV, dK, dQ products per query tile
//   softmax.cuh    P^T, the mask, dS^T, their fragments and shared-memory tiles
//   dq.cuh         dQ into the f32 accumulator (warpgroup 0, warp 1: TMA reduce-adds;
//                  split-d deterministic mode: the turns of the consumers' adds)
//   epilogue.cuh   dK (scaled), dV out
//   launch.cuh     tensor maps and the launch (host)
//
// One CTA per key tile: kBlockN = 128 keys (64 in split-d mode, d 256: see
// BwdTraits) of one kv head of one sequence. It walks the query tiles that can
// see the tile (MaskPolicy::query_begin/_end), for every query head of the kv
// head's group, and keeps dK and dV in registers throughout:
//   S^T  = K Q^T,  dP^T = V dO^T
//   P^T  = exp2(S^T * scale*log2e - lse*log2e)    (0 where masked)
//   dS^T = P^T * (dP^T - D)
//   dV  += P^T dO,  dK += dS^T Q,  dQ += dS K (f32 accumulator)
// The shared pre-pass (cuda/bwd/passes.cu) computed D = rowsum(dO * O) and
// zeroed the accumulator; the post-pass scales it into dq. dK is scaled here.
//
// NOTES: the parts are force-inlined functions that take what they use as
// arguments (or fill a small struct in place) and keep no state between
// calls: the kernel compiles to the same SASS as the one-function kernel it
// was cut from, for every instantiation (cuobjdump -sass, sm_90a). Role
// structs with member state (as the forward's) measured 0.96-1.01 of it at
// d 64 / 128 (mean 0.98, A/B in one process) with an 8-byte spill at d 64;
// docs/performance.md.
// Where a cut changed the machine code, the reason is noted beside it.
#pragma once

#include <cuda.h>

#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/sm90/arch.h"
#include "cuda/sm90/bwd/dq.cuh"
#include "cuda/sm90/bwd/mainloop.cuh"
#include "cuda/sm90/bwd/producer.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/sync.h"

namespace flashattn::cuda::sm90 {

// full_kv: one arrival (with the K, V bytes); full[s]: kFullArrivals (with the
// Q, dO bytes); empty[s]: one per consumer warp.
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

// The kernel's body. Drop: NoDropout or PhiloxDropout (cuda/sm90/dropout.cuh);
// Walk: DenseQueryWalk or ListedQueryWalk (a block mask; scheduler.cuh) with
// its lists; Mods: TileMods or SoftcapAlibiMods (softmax.cuh).
template <int D, typename T, class Drop, class Walk, class Mods = TileMods>
__device__ __forceinline__ void backward_cta(const CUtensorMap& tma_q, const CUtensorMap& tma_dq,
                                             const CUtensorMap& tma_do, const CUtensorMap& tma_k,
                                             const CUtensorMap& tma_v, const AttentionParams& p,
                                             const bwd::Workspace& ws, const typename Walk::Tiles& tiles) {
#if FLASHATTN_SM90_DEVICE
  using K = BwdTraits<D, T>;
  BwdCta cta;
  if (!bwd_cta<K::kBlockM, K::kBlockN, Walk>(p, ws, tiles, cta)) return;  // whole CTA: before any barrier

  const BwdSmem<K> sm;

  const int wg = warpgroup_index();
  if (threadIdx.x == 0) init_barriers<K>(sm);
  __syncthreads();

  if (wg == 0) {
    // Warp 0 produces the ring; with TMA dQ adds, warp 1 is the dQ reducer,
    // in split-d's deterministic mode the dQ turn warp.
    setmaxnreg_dec<K::Tune::kProducerRegs>();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (K::kSplitD && warp == 1) {
      if (p.deterministic && cta.w.iters > 0) order_dq_turns<K, Walk>(p, ws, cta, tiles, lane);
      return;
    }
    const int bq = cta.varlen ? 0 : cta.b;
    const int row_q0 = cta.varlen ? static_cast<int>(cta.seq.row_q) : 0;
    if (K::kDqTma && warp == 1 && cta.w.iters > 0) {
      reduce_dq<K, Walk>(&tma_dq, p, ws, cta, tiles, lane, bq, row_q0);
      return;
    }
    produce<K, Drop, Walk>(&tma_q, &tma_do, &tma_k, &tma_v, p, ws, cta, tiles, sm, warp, lane, bq, row_q0);
  } else {
    setmaxnreg_inc<K::Tune::kConsumerRegs>();
    consume<K, T, Drop, Walk, Mods>(p, ws, cta, tiles, sm, wg - 1);
  }
#endif
}

// The kernel without a block mask (with or without dropout; softcap with
// ALiBi: SoftcapAlibiMods, without dropout).
template <int D, typename T, class Drop = NoDropout, class Mods = TileMods>
__global__ void __launch_bounds__(BwdTraits<D, T>::kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap tma_q,
                    const __grid_constant__ CUtensorMap tma_dq,
                    const __grid_constant__ CUtensorMap tma_do,
                    const __grid_constant__ CUtensorMap tma_k,
                    const __grid_constant__ CUtensorMap tma_v,
                    const __grid_constant__ AttentionParams p, const bwd::Workspace ws) {
  backward_cta<D, T, Drop, DenseQueryWalk, Mods>(tma_q, tma_dq, tma_do, tma_k, tma_v, p, ws, DenseQueryWalk::Tiles{});
}

// The kernel of a block mask (with or without dropout): the lists' steps in `tiles`.
// NOTES: a kernel of its own rather than a parameter of backward_kernel: an
// empty parameter there changed how the plain kernels load the workspace's
// fields and took the d 128 dropout kernel's spill from 28 to 52 bytes.
template <int D, typename T, class Drop = NoDropout>
__global__ void __launch_bounds__(BwdTraits<D, T>::kThreads, 1)
    block_sparse_backward_kernel(const __grid_constant__ CUtensorMap tma_q,
                                 const __grid_constant__ CUtensorMap tma_dq,
                                 const __grid_constant__ CUtensorMap tma_do,
                                 const __grid_constant__ CUtensorMap tma_k,
                                 const __grid_constant__ CUtensorMap tma_v,
                                 const __grid_constant__ AttentionParams p, const bwd::Workspace ws,
                                 const __grid_constant__ BlockTiles tiles) {
  backward_cta<D, T, Drop, ListedQueryWalk>(tma_q, tma_dq, tma_do, tma_k, tma_v, p, ws, tiles);
}

}  // namespace flashattn::cuda::sm90
