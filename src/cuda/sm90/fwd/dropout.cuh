// Dropout in the Hopper forward (cuda/sm90/dropout.cuh: the policy types and
// the keep bits of the S fragment).
//
// With dropout the softmax keeps P where the bit is set and zeroes it where
// not, after the row sum (l and the lse are those before dropout), before P
// goes to 16 bits; the factor 1 / (1 - p8) is constant, so it multiplies O
// once per tile before the epilogue instead of every element of P.
// NOTES: zeroing, not multiplying by 0, a NaN P: its row's l is NaN already,
// so O and the lse are NaN whatever P V adds.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/sm90/dropout.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"

namespace flashattn::cuda::sm90 {

// P of key tile n (this thread's s) times keep: 0 where dropped.
template <class Drop, int kBlockN>
__device__ __forceinline__ void apply_dropout(float (&s)[kBlockN / 2], const AttentionParams& p, const RowTile& t,
                                              int n, int lane) {
  if constexpr (Drop::kOn) {
    uint64_t bits[2];
    tile_keep_bits<kBlockN>(p.dropout, t.w.b * p.heads_q + t.w.h, t.row0, n * kBlockN, lane % 4, bits);
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, bit = 2 * i + (e & 1);
        if (((bits[r] >> bit) & 1u) == 0) s[4 * i + e] = 0.0f;
      }
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
