// Dropout in the Hopper forward (cuda/sm90/dropout.cuh: the policy types and
// the keep masks on the S fragment's layout).
//
// With dropout, P is zeroed where dropped after the row sum (l and the lse
// are those before dropout): on its 16-bit pairs, as packed for P V, with
// masks made from the Philox bytes (a prmt and an and per pair, where a test
// and a select per element on the f32 P cost twice the instructions). The
// factor 1 / (1 - p8) is constant, so it multiplies O once per tile before
// the epilogue instead of every element of P.
// NOTES: masking, not multiplying by 0, a NaN P: its row's l is NaN already,
// so O and the lse are NaN whatever P V adds.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/sm90/dropout.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"

namespace flashattn::cuda::sm90 {

// P's pairs of key tile n (this thread's pa) with the dropped halves zeroed.
template <class Drop, int kBlockN>
__device__ __forceinline__ void mask_dropped_p(uint32_t (&pa)[kBlockN / 16][4], const AttentionParams& p,
                                               const RowTile& t, int n, int lane) {
  if constexpr (Drop::kOn) {
    const int n0 = n * kBlockN, bh = t.w.b * p.heads_q + t.w.h;
    if constexpr (kBlockN % dropout::kBlockKeys == 0) {
      mask_p_pairs<kBlockN, 0>(pa, p.dropout, bh, t.row0, n0, lane % 4);
    } else if (n0 % dropout::kBlockKeys == 0) {
      mask_p_pairs<kBlockN, 0>(pa, p.dropout, bh, t.row0, n0, lane % 4);
    } else {
      mask_p_pairs<kBlockN, 2>(pa, p.dropout, bh, t.row0, n0, lane % 4);
    }
  }
}

// O = (sum_j P_j keep_j V_j) / (1 - p8), once per tile.
template <class Drop, int kN>
__device__ __forceinline__ void dropout_scale_out(float (&o)[kN], const AttentionParams& p) {
  if constexpr (Drop::kOn) {
#pragma unroll
    for (int i = 0; i < kN; ++i) o[i] *= p.dropout.scale;
  }
}

}  // namespace flashattn::cuda::sm90
