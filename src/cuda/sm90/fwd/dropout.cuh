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

// A consumer's keep flags of the key tile whose P it converts next: drawn
// while S = Q K^T of that tile is on the tensor cores (draw), applied to P's
// pairs after the softmax (mask). Without dropout, nothing.
// NOTES: drawn between issuing S and waiting for it, where the warp has
// nothing else to issue, rather than at the conversion, on the chain from S
// through the softmax to P V: measured level with the draw at the conversion
// but for the 8k non-causal forward (-1.5%; docs/variants.md, "Dropout's
// cost"), so the forward with dropout is bound by issue, not by that chain.
// The flags hold 4 words per 32-key block.
template <class Drop, int kBlockN>
struct TileKeep {
  __device__ __forceinline__ void draw(const AttentionParams&, const RowTile&, int, int) {}
  __device__ __forceinline__ void mask(uint32_t (&)[kBlockN / 16][4], int) const {}
};

template <int kBlockN>
struct TileKeep<PhiloxDropout, kBlockN> {
  TileKeepFlags<kBlockN> flags;
  // A tile of a multiple of 32 keys starts on a block; others every other tile.
  __device__ __forceinline__ static bool half_block(int n) {
    return kBlockN % dropout::kBlockKeys != 0 && (n * kBlockN) % dropout::kBlockKeys != 0;
  }
  // The flags of key tile n of tile t (lane's rows t.row0, t.row0 + 8).
  __device__ __forceinline__ void draw(const AttentionParams& p, const RowTile& t, int n, int lane) {
    const int n0 = n * kBlockN, bh = t.w.b * p.heads_q + t.w.h;
    if (half_block(n)) {
      flags.template draw<2>(p.dropout, bh, t.row0, n0, lane % 4);
    } else {
      flags.template draw<0>(p.dropout, bh, t.row0, n0, lane % 4);
    }
  }
  // P's pairs of the drawn key tile n with the dropped halves zeroed.
  __device__ __forceinline__ void mask(uint32_t (&pa)[kBlockN / 16][4], int n) const {
    if (half_block(n)) {
      flags.template apply<2>(pa);
    } else {
      flags.template apply<0>(pa);
    }
  }
};

// O = (sum_j P_j keep_j V_j) / (1 - p8), once per tile.
template <class Drop, int kN>
__device__ __forceinline__ void dropout_scale_out(float (&o)[kN], const AttentionParams& p) {
  if constexpr (Drop::kOn) {
#pragma unroll
    for (int i = 0; i < kN; ++i) o[i] *= p.dropout.scale;
  }
}

}  // namespace flashattn::cuda::sm90
