// The Hopper backward's epilogue: dK (scaled: the scale is kept out of dS, see
// softmax.cuh's NOTES) and dV of this consumer's keys and columns, from the
// registers they accumulated in over the whole walk, for the sequence's keys and
// the call's columns only (a head dim below the kernel's: head_dims.h).
#pragma once

#include "core/layout.h"
#include "core/params.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

template <class K, typename T>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[K::kDvN / 2], const float (&dv)[K::kDvN / 2],
                                            const AttentionParams& p, const BwdCta& cta, const ConsumerThread& th) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = cta.w.k0 + th.key_r + 8 * r;
    if (key >= cta.seq.seqlen_k) continue;
    T* dkrow = static_cast<T*>(p.dk) + row_offset(cta.b, cta.seq.row_k, key, cta.hk, p.dk_batch_stride,
                                                  p.dk_row_stride, p.dk_head_stride, cta.varlen);
    T* dvrow = static_cast<T*>(p.dv) + row_offset(cta.b, cta.seq.row_k, key, cta.hk, p.dv_batch_stride,
                                                  p.dv_row_stride, p.dv_head_stride, cta.varlen);
#pragma unroll
    for (int i = 0; i < K::kDvN / 8; ++i) {
      const int c = (K::kSplitD ? th.cw * K::kDvN : 0) + 8 * i + 2 * th.quad;
      if (c >= p.head_dim) continue;  // pairs never straddle it: head dims are multiples of 8
      *reinterpret_cast<uint32_t*>(dkrow + c) = pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvrow + c) = pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
}

}  // namespace flashattn::cuda::sm90
