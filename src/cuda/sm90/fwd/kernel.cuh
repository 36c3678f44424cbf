// The Hopper forward kernel (FlashAttention-3's structure, our implementation),
// assembled from its parts:
//   traits.h       shape, shared-memory layout, barriers (from tuning.h)
//   scheduler.cuh  the persistent walk: step -> query tile, key-tile range
//   producer.cuh   warpgroup 0: TMA loads of Q and of the K/V ring
//   mainloop.cuh   warpgroups 1..C: S = Q K^T, softmax, O += P V (ping-pong)
//   softmax.cuh    score modifier, mask, online softmax on a wgmma fragment
//   epilogue.cuh   O / l and the logsumexp out (TMA or registers), split merge
//   launch.cuh     tensor maps, work plan and instantiation choice (host)
//
// One persistent CTA per SM walks query tiles (kBlockM = 64 * C rows of one
// head of one sequence). The split-tail instantiation (kSplit) walks segments
// of the last round's tiles cut along the keys and merges their parts.
//
// Head dims below D (any multiple of 8 up to D) run on the kernel of D: the
// tensor maps have the real head dim as their inner extent, so TMA zero-fills
// columns d..D-1 of every Q/K/V tile. S = Q K^T then sums zeros over them
// (exact), O's columns past d are P times zeros and are never stored, and the
// softmax scale comes from params (1/sqrt(real d) by default).
#pragma once

#include <cuda.h>

#include "core/params.h"
#include "cuda/sm90/arch.h"
#include "cuda/sm90/fwd/epilogue.cuh"
#include "cuda/sm90/fwd/mainloop.cuh"
#include "cuda/sm90/fwd/producer.cuh"
#include "cuda/sm90/fwd/traits.h"
#include "cuda/sm90/sync.h"

namespace flashattn::cuda::sm90 {

// The kernel's body. Drop: NoDropout or PhiloxDropout (cuda/sm90/dropout.cuh);
// Walk: DenseKeys or ListedKeys (a block mask; scheduler.cuh) with its lists.
template <class Tune, typename T, int C, int N, bool kSplit, bool kCache, class Drop, class Walk>
__device__ __forceinline__ void forward_cta(const CUtensorMap& tma_q, const CUtensorMap& tma_k,
                                            const CUtensorMap& tma_v, const CUtensorMap& tma_o,
                                            const AttentionParams& p, const FwdArgs& a,
                                            const typename Walk::Tiles& blocks) {
#if FLASHATTN_SM90_DEVICE
  using K = FwdTraits<Tune, C, N, kCache>;
  extern __shared__ uint8_t smem_raw[];
  const FwdSmem<K, T> sm(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));

  const int wg = warpgroup_index();
  if constexpr (!kSplit) {
    // The split-tail kernel that may follow (launch.cuh) starts as this
    // grid's CTAs exit; its merges wait for this grid before they count parts.
    if (blockIdx.x == 0 && a.part_count != nullptr) {
      for (int i = threadIdx.x; i < a.tail.tiles * 4 * K::kConsumers; i += blockDim.x) a.part_count[i] = 0;
    }
    grid_launch_dependents();
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < K::kQStages; ++s) {
      mbar_init(&sm.full_q[s], 1);
      mbar_init(&sm.empty_q[s], K::kConsumerWarps);
    }
    for (int s = 0; s < K::kStages; ++s) {
      mbar_init(&sm.full_k[s], 1);
      mbar_init(&sm.full_v[s], 1);
      mbar_init(&sm.empty_k[s], K::kConsumerWarps);
      mbar_init(&sm.empty_v[s], K::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<K::kProducerRegs>();
    if (threadIdx.x == 0) TmaProducer<K, T, kSplit, Walk>{&tma_q, &tma_k, &tma_v, p, a, blocks, sm}.run();
  } else {
    setmaxnreg_inc<K::kConsumerRegs>();
    const int cw = wg - 1;
    const int tid = threadIdx.x % 128;
    const Epilogue<K, T, kSplit> epi{&tma_o, p, a, sm.o_staging(cw), cw, tid, tid / 32, tid % 32};
    Consumer<K, T, kSplit, Drop, Walk> consumer(p, a, blocks, sm, epi, cw, tid);
    consumer.run();
    epi.template fix_after_walk<Walk>(consumer.nonfinite, blocks);
  }
#endif
}

// The kernel without a block mask, chosen at launch.
template <class Tune, typename T, int C, int N, bool kSplit, bool kCache = false, class Drop = NoDropout>
__global__ void __launch_bounds__(FwdTraits<Tune, C, N, kCache>::kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap tma_q,
                   const __grid_constant__ CUtensorMap tma_k,
                   const __grid_constant__ CUtensorMap tma_v,
                   const __grid_constant__ CUtensorMap tma_o,
                   const __grid_constant__ AttentionParams p, const __grid_constant__ FwdArgs a) {
  forward_cta<Tune, T, C, N, kSplit, kCache, Drop, DenseKeys>(tma_q, tma_k, tma_v, tma_o, p, a, DenseKeys::Tiles{});
}

// The kernel of a block mask (with or without dropout): its lists on this
// kernel's tiles in `blocks`.
// NOTES: a kernel of its own rather than a parameter of forward_kernel: the
// lists in FwdArgs (32 more bytes of it) changed the plain kernels' SASS
// (53-221 instructions rescheduled in each).
template <class Tune, typename T, int C, int N, class Drop = NoDropout>
__global__ void __launch_bounds__(FwdTraits<Tune, C, N, false>::kThreads, 1)
    block_sparse_forward_kernel(const __grid_constant__ CUtensorMap tma_q,
                                const __grid_constant__ CUtensorMap tma_k,
                                const __grid_constant__ CUtensorMap tma_v,
                                const __grid_constant__ CUtensorMap tma_o,
                                const __grid_constant__ AttentionParams p, const __grid_constant__ FwdArgs a,
                                const __grid_constant__ BlockTiles blocks) {
  forward_cta<Tune, T, C, N, false, false, Drop, ListedKeys>(tma_q, tma_k, tma_v, tma_o, p, a, blocks);
}

}  // namespace flashattn::cuda::sm90
