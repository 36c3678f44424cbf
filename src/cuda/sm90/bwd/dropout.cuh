// Dropout in the Hopper backward (cuda/sm90/dropout.cuh: the policy types and
// the keep bits of the S^T fragment, the forward's mask regenerated from the
// coordinates), z = keep / (1 - p8):
//   dV += (P z)^T dO      dS^T = P^T (z dP^T - D)
// The factor 1 / (1 - p8) is folded into each row's lse and D by the
// producer (producer.cuh, load_row_stats), so the consumer's P^T is already
// P^T / (1 - p8) and its D is D (1 - p8): the A fragments of dV's product
// take that P^T times keep as they are packed, and dS^T = P^T (keep dP^T -
// D) with the kernel's own code (softcap's `tanh` still taken back from P
// and lse, whose shifts cancel). P^T itself stays in the consumer's S^T
// registers (dS needs it where keep is 0).
#pragma once

#include <cstdint>

#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/bwd/softmax.cuh"
#include "cuda/sm90/dropout.cuh"

namespace flashattn::cuda::sm90 {

// P^T's 16-bit A fragments (softmax.cuh's to_frags), times keep (0 or 1)
// with dropout.
template <class K, typename T, class Drop>
__device__ __forceinline__ void p_frags(const float (&st)[K::kSN / 2], const TransposedKeep<K>& keep_in,
                                        uint32_t (&f)[K::kSN / 16][4]) {
  if constexpr (Drop::kOn) {
    const TransposedKeep<K> keep = keep_in.opaque();
#pragma unroll
    for (int kt = 0; kt < K::kSN / 16; ++kt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // acc[8 kt + 2 j] is element e = 2 (j & 1) of accumulator tile i = 2 kt + (j >> 1).
        const int i = 2 * kt + (j >> 1), e = 2 * (j & 1);
        f[kt][j] = pack2<T>(keep.kept(i, e) ? st[4 * i + e] : 0.0f, keep.kept(i, e + 1) ? st[4 * i + e + 1] : 0.0f);
      }
  } else {
    to_frags<K, T>(st, f);
  }
}

// dP^T *= keep (with dropout; nothing without).
template <class K, class Drop>
__device__ __forceinline__ void dropout_dp(float (&dpt)[K::kSN / 2], const TransposedKeep<K>& keep_in) {
  if constexpr (Drop::kOn) {
    const TransposedKeep<K> keep = keep_in.opaque();
#pragma unroll
    for (int i = 0; i < K::kSN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * i + e] = keep.kept(i, e) ? dpt[4 * i + e] : 0.0f;
  }
}

}  // namespace flashattn::cuda::sm90
