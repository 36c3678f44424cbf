// The sm80 forward's loads: Q once, K/V tiles through kStages shared-memory
// slots by cp.async (the two pipelines: FwdTraits). Walk step j's tile of K
// (V) is loaded into slot j % kStages (Walk: key_walk.cuh, the tile of step j);
// steps past the CTA's range load nothing.
#pragma once

#include "core/params.h"
#include "cuda/common/block_sparse.cuh"
#include "cuda/common/mma.h"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/tile_copy.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

template <class K>
using QCopy = TileCopy<typename K::QTile, K::kThreads>;
template <class K>
using KVCopy = TileCopy<typename K::KVTile, K::kThreads, K::Tune::kFastWholeTiles>;

// Which operand a K/V load fills.
enum class KVOperand { kKeys, kValues };

// Step j's tile of K or V into its slot's half; nothing for steps past the CTA's range.
template <class K, class Walk, KVOperand kOp, typename T>
__device__ __forceinline__ void issue_kv(const KVCopy<K>& kv_copy, const AttentionParams& p, const FwdCta<T>& cta,
                                         const typename Walk::Tiles& tiles, int j, int slot, int d_valid) {
  if (j < cta.n_tiles) {
    constexpr bool kValues = kOp == KVOperand::kValues;
    const int n0 = Walk::tile(tiles, cta, j) * K::kN;
    const T* const rows = kValues ? cta.v : cta.k;
    const int64_t row_stride = kValues ? p.v_row_stride : p.k_row_stride;
    kv_copy.load(kValues ? smem_v<K>(slot) : smem_k<K>(slot), rows + n0 * row_stride, row_stride,
                 cta.seq.seqlen_k - n0, d_valid);
  }
}

// Q and the pipeline's first groups: K_0 (one stage), or K/V tiles 0 .. kStages - 2.
template <class K, class Walk, typename T>
__device__ __forceinline__ void load_first_tiles(const QCopy<K>& q_copy, const KVCopy<K>& kv_copy,
                                                 const AttentionParams& p, const FwdCta<T>& cta,
                                                 const typename Walk::Tiles& tiles, int d_valid) {
  q_copy.load(smem_q(), cta.q, p.q_row_stride, cta.rows_valid, d_valid);
  issue_kv<K, Walk, KVOperand::kKeys>(kv_copy, p, cta, tiles, 0, 0, d_valid);
  if constexpr (K::kSplitKV) {
    cp_async_commit();  // Q, K_0
  } else {
    issue_kv<K, Walk, KVOperand::kValues>(kv_copy, p, cta, tiles, 0, 0, d_valid);
    cp_async_commit();  // Q, K_0, V_0
#pragma unroll
    for (int s = 1; s < K::kStages - 1; ++s) {
      issue_kv<K, Walk, KVOperand::kKeys>(kv_copy, p, cta, tiles, s, s, d_valid);
      issue_kv<K, Walk, KVOperand::kValues>(kv_copy, p, cta, tiles, s, s, d_valid);
      cp_async_commit();
    }
  }
}

// Start of tile j: its K (one stage; V_j is issued now) or K and V (kStages
// >= 2; tile j + kStages - 1 is issued now) are in shared memory for every thread.
template <class K, class Walk, typename T>
__device__ __forceinline__ void await_tile(const KVCopy<K>& kv_copy, const AttentionParams& p, const FwdCta<T>& cta,
                                           const typename Walk::Tiles& tiles, int j, int d_valid) {
  if constexpr (K::kSplitKV) {
    cp_async_wait<0>();  // K_j (and, at j = 0, Q) landed
    __syncthreads();     // ... for every thread; V_{j-1} is no longer read
    issue_kv<K, Walk, KVOperand::kValues>(kv_copy, p, cta, tiles, j, 0, d_valid);
    cp_async_commit();
  } else {
    cp_async_wait<K::kPending>();  // tile j (and, at j = 0, Q) landed
    __syncthreads();               // ... for every thread; the slot of tile j-1 is free
    issue_kv<K, Walk, KVOperand::kKeys>(kv_copy, p, cta, tiles, j + K::kStages - 1, (j + K::kStages - 1) % K::kStages,
                                        d_valid);
    issue_kv<K, Walk, KVOperand::kValues>(kv_copy, p, cta, tiles, j + K::kStages - 1, (j + K::kStages - 1) % K::kStages,
                                          d_valid);
    cp_async_commit();
  }
}

// Before P V_j: V_j landed (one stage; K_{j+1} is issued now), or, with the
// pair split, the partner warp's P is in shared memory.
template <class K, class Walk, typename T>
__device__ __forceinline__ void await_v(const KVCopy<K>& kv_copy, const AttentionParams& p, const FwdCta<T>& cta,
                                        const typename Walk::Tiles& tiles, int j, int warp, int d_valid) {
  if constexpr (K::kSplitKV) {
    cp_async_wait<0>();  // V_j landed
    __syncthreads();     // ... for every thread (also the partner's P); K_j is no longer read
    issue_kv<K, Walk, KVOperand::kKeys>(kv_copy, p, cta, tiles, j + 1, 0, d_valid);
    cp_async_commit();
  } else if constexpr (K::kPairSplit) {
    pair_sync(warp / K::kSplit);  // the partner's P
  }
}

}  // namespace flashattn::cuda::sm80
