// The sm80 forward's epilogue: O / l through shared memory (Q's slot) for
// 16-byte stores, and lse = ln(l) + m * scale. A row that saw no key: O = 0,
// lse = -inf. With the pair split, l sums both warps' halves of the keys.
// Rows stored Inf or NaN are recomputed exactly (common/nonfinite.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/score_mod.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/sm80/fwd/loads.cuh"
#include "cuda/sm80/fwd/mainloop.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/softmax.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

// O / l of this thread's rows into Q's slot (the loads are drained first),
// the lse of each row out, then the tile of O out in 16-byte rows. Returns
// whether a stored value is Inf or NaN (in any thread: the barrier before the
// store says), for fix_nonfinite_tile; for the flat fix (flat_fix.cuh) also
// which of this warp's rows did (*warp_rows, bit mt * 16 + hf * 8 + g).
// NOTES: every row of this lane is g modulo 8, so all share one swizzle:
// addresses are a lane base plus kAtom XOR-ed chunk offsets plus constants
// (QTile::offset per row computed the swizzle again for each of 64 stores:
// ~350 integer instructions per warp at d256).
template <class K, typename T>
__device__ __forceinline__ bool write_out(const OAcc<K>& acc, const float (&row_max)[K::kMT][2],
                                          const float (&row_sum)[K::kMT][2], const AttentionParams& p,
                                          const FwdCta<T>& cta, const FwdThread& th, const QCopy<K>& q_copy,
                                          float scale_log2, int d_valid, uint32_t* warp_rows) {
  using QTile = typename K::QTile;
  using Mma = MmaType<T>;
  float l_rows[K::kMT][2];
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) l_rows[mt][hf] = quad_sum(row_sum[mt][hf]);
  if constexpr (K::kPairSplit) pair_combine<K>(l_rows, /*sum=*/true, th);
  const auto o_lane = QTile::lane(th.g, 0);
  const uint32_t o_base = smem_q() +
                          (th.warp_row * QTile::kAtom + th.half * (K::kDT / QTile::kAtom) * K::kM * QTile::kAtom) * 16 +
                          4 * th.t;
  cp_async_wait<0>();
  __syncthreads();
  uint32_t bits = 0;  // nonfinite::nonfinite_bits of every value staged
  constexpr bool kRowVotes = K::kNonfiniteFix == NonfiniteFix::kFlatInline;  // *warp_rows too
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = l_rows[mt][hf];
      // Empty: l == 0 exactly (l >= 1 once a key is seen). A NaN score that
      // fmaxf kept out of m still made its P, and so l, NaN: NaN O and lse.
      const bool empty = l == 0.0f;
      float inv = empty ? 0.0f : 1.0f / l;
      float lse = empty ? -INFINITY : (row_max[mt][hf] * scale_log2 + log2f(l)) * kLn2;
      if (p.has_sinks()) {  // the sink's share of the denominator (score_mod.h)
        const AttentionSink sink{p.sinks[cta.h]};
        const float lse_keys = lse;
        lse = sink.lse(lse_keys);
        inv *= sink.output_factor(lse_keys, lse);
      }
      const int r = th.warp_row + mt * 16 + th.g + hf * 8;
      uint32_t row_bits = 0;  // this row's values only (kRowVotes)
      uint32_t& seen = kRowVotes ? row_bits : bits;
#pragma unroll
      for (int dt = 0; dt < K::kDT; ++dt) {
        const uint32_t packed = Mma::pack(acc[mt][dt][2 * hf] * inv, acc[mt][dt][2 * hf + 1] * inv);
        seen |= nonfinite::nonfinite_bits<T>(packed);
        if constexpr (K::kFastOStaging) {
          st_shared_b32(o_base + QTile::at(o_lane, mt * 16 + hf * 8, dt), packed);
        } else {
          *reinterpret_cast<uint32_t*>(smem + QTile::offset(r, th.half * K::kDT + dt) + 4 * th.t) = packed;
        }
      }
      if constexpr (kRowVotes) {
        bits |= row_bits;
        // Row r's lanes are 4 g .. 4 g + 3: bit 4 g + t of the vote.
        const uint32_t lanes = __ballot_sync(0xffffffffu, row_bits != 0 && r < cta.rows_valid);
#pragma unroll
        for (int g = 0; g < 8; ++g)
          if ((lanes >> (4 * g)) & 0xfu) *warp_rows |= 1u << (mt * 16 + hf * 8 + g);
      }
      if (p.lse != nullptr && th.half == 0 && th.t == 0 && r < cta.rows_valid) {
        const int64_t off = cta.varlen ? cta.h * p.lse_head_stride + (cta.seq.row_q + cta.m0 + r) * p.lse_row_stride
                                       : cta.b * p.lse_batch_stride + cta.h * p.lse_head_stride +
                                             static_cast<int64_t>(cta.m0 + r) * p.lse_row_stride;
        p.lse[off] = lse;
      }
    }
  const bool any_nonfinite = __syncthreads_or(bits != 0);
  T* o = static_cast<T*>(p.out) + row_offset(cta.b, cta.seq.row_q, cta.m0, cta.h, p.o_batch_stride, p.o_row_stride,
                                             p.o_head_stride, cta.varlen);
  q_copy.store(o, p.o_row_stride, smem, cta.rows_valid, d_valid);
  return any_nonfinite;
}

// The rare path after a write_out that returned true (the whole CTA): its
// rows stored Inf or NaN recomputed exactly (common/nonfinite.cuh).
// NOTES: the tile is placed again from blockIdx, so nothing of it stays live
// across the K/V loop for this path: keeping the sequence, head and first row
// live until here made ptxas spill the d128 kernel (at 255 registers).
// Pairs: nonfinite::ListedPairs (a block mask) or NoBlockMask.
template <class K, typename T, class Pairs>
__device__ __noinline__ void fix_nonfinite_tile(const AttentionParams& p, int m_blocks, const Pairs pairs) {
  FwdCta<T> cta;
  cta.template place<K>(p, m_blocks);
  __syncthreads();  // every thread's stores of the tile come first
  nonfinite::fix_out_tile<T>(p, pairs, cta.b, cta.h, cta.m0, min(K::kM, cta.seq.seqlen_q - cta.m0));
}

}  // namespace flashattn::cuda::sm80
