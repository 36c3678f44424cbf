// The Hopper backward's epilogue: dK (scaled: the scale is kept out of dS, see
// softmax.cuh's NOTES) and dV of this consumer's keys and columns, from the
// registers they accumulated in over the whole walk, for the sequence's keys and
// the call's columns only (a head dim below the kernel's: head_dims.h). Rows
// stored Inf or NaN are recomputed exactly (common/nonfinite.cuh), each warp
// its own keys and columns.
#pragma once

#include "core/layout.h"
#include "core/params.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// row_d: the pre-pass's D rows (the fix's dS needs them); pairs: the block
// mask's (nonfinite::pairs_of the walk's lists).
template <class K, typename T, class Pairs>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[K::kDvN / 2], const float (&dv)[K::kDvN / 2],
                                            const AttentionParams& p, const BwdCta& cta, const ConsumerThread& th,
                                            const float* row_d, const Pairs& pairs) {
  uint32_t bits = 0;  // nonfinite::nonfinite_bits of the values stored
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
      const uint32_t dk2 = pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      const uint32_t dv2 = pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
      bits |= nonfinite::nonfinite_bits<T>(dk2) | nonfinite::nonfinite_bits<T>(dv2);
      *reinterpret_cast<uint32_t*>(dkrow + c) = dk2;
      *reinterpret_cast<uint32_t*>(dvrow + c) = dv2;
    }
  }
  if (__any_sync(0xffffffffu, bits != 0)) {  // rare
    // The warp's 16 keys, and its columns: its consumer's half of d under
    // split-d (the other consumer stores the other half), else all.
    const int key0 = cta.w.k0 + th.key_r - th.lane / 4;
    constexpr uint32_t kChunks = K::kDvN / 8 >= 32 ? nonfinite::kAllChunks : (1u << (K::kDvN / 8)) - 1u;
    const uint32_t chunks = K::kSplitD ? kChunks << (th.cw * K::kDvN / 8) : nonfinite::kAllChunks;
    __syncwarp();  // the warp's stores of those rows come first
    nonfinite::fix_dkdv_rows<T>(p, pairs, row_d, cta.b, cta.hk, key0, min(16, cta.seq.seqlen_k - key0), chunks);
  }
}

}  // namespace flashattn::cuda::sm90
