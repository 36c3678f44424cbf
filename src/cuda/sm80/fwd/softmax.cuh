// The sm80 forward's work on a warp's S registers (FwdThread's layout):
// score modifiers (softcap, ALiBi) and the mask on boundary tiles, then the
// online softmax
//   m' = max(m, rowmax S);  O *= 2^(m - m');  l = l 2^(m - m') + rowsum P;
//   P = 2^(S - m')          (scores in base 2: scale_log2, kernel.cuh)
// with P packed to 16-bit A fragments for P V. With the pair split, the row
// maxima (and at the end the row sums) of the two warps of a pair combine
// through shared memory.
#pragma once

#include <cmath>

#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/sm80/fwd/mainloop.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

// fn(score, row, key) on every element of this warp's S (keys from n0).
template <class K, class Fn>
__device__ __forceinline__ void for_each_score(Scores<K>& s, int row0, const FwdThread& th, int n0, Fn&& fn) {
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < K::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        fn(s[mt][nt][e], row0 + th.warp_row + mt * 16 + th.g + (e >> 1) * 8, n0 + nt * 8 + 2 * th.t + (e & 1));
}

// Only tiles the mask cuts (or that run past seqlen_k) pay for masking;
// a score modifier (softcap, ALiBi) takes the same body on every tile.
template <class K, typename T>
__device__ __forceinline__ bool needs_mask(const AttentionParams& p, const FwdCta<T>& cta, bool softcap, int n0) {
  return softcap || p.has_alibi() || !cta.mask.tile_fully_visible(cta.m0, cta.m0 + cta.rows_valid, n0, n0 + K::kN);
}

// Softcap, s -> softcap * tanh(s * scale / softcap), ALiBi, and the mask (-inf where
// key col of row is not visible).
// NOTES: tanh(x) = 1 - 2 / (e^(2x) + 1): one ex2 and one rcp, no branch.
// libm tanhf branches on |x|, and at d = 64, N = 128 that body spilled; the
// error is ~1e-7 * softcap absolute, and +-inf / NaN come out as +-1 / NaN.
// Two forms of the same mask, picked by tile width because ptxas, at 255
// registers, spills one or the other (bytes of spill stores, -Xptxas -v):
//  - per row, bounds [lo, hi) relative to this lane's first column n0 + 2t,
//    compared with a compile-time column per element (kNT >= 16: d = 64 at
//    128x128; the per-element form spilled 100 bytes there, sm_80 build);
//  - per element, visible(row, col) (narrower tiles: the per-row form
//    spilled 112 bytes at d = 128, 128x64, one stage, sm_90a build).
template <class K, typename T>
__device__ __forceinline__ void mask_scores(Scores<K>& s, const AttentionParams& p, const FwdCta<T>& cta,
                                            const FwdThread& th, bool softcap, int n0) {
  if (softcap) {
    const float cap_in2 = 2.0f * kLog2e * p.scale / p.softcap;
    const float cap2 = -2.0f * p.softcap;
    for_each_score<K>(s, cta.m0, th, n0, [&](float& x, int, int) {
      x = fmaf(cap2, fast_rcp(fast_exp2(x * cap_in2) + 1.0f), p.softcap);
    });
  }
  if (p.has_alibi()) {
    // ALiBi (score_mod.h) in the units of s: the logit bias divided by the
    // factor scale_log2 / log2 e that s still gets (1 with softcap). Built
    // here, not held across the loop (at d 256 that spilled).
    const AlibiScore alibi_s{p.alibi_slope(cta.b, cta.h) / (softcap ? 1.0f : p.scale), cta.mask.diagonal_offset()};
    for_each_score<K>(s, cta.m0, th, n0, [&](float& x, int row, int col) { x = alibi_s(x, row, col); });
  }
  if constexpr (K::kNT >= 16) {
    const int col0 = n0 + 2 * th.t;
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = cta.m0 + th.warp_row + mt * 16 + th.g + hf * 8;
        const int lo = cta.mask.first_key(row) - col0;
        const int hi = min(cta.mask.end_key(row), cta.mask.seqlen_k) - col0;
#pragma unroll
        for (int nt = 0; nt < K::kNT; ++nt)
#pragma unroll
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            const int c = nt * 8 + (e & 1);
            if (c < lo || c >= hi) s[mt][nt][e] = -INFINITY;
          }
      }
  } else {
    for_each_score<K>(s, cta.m0, th, n0, [&](float& x, int row, int col) {
      if (!cta.mask.visible(row, col)) x = -INFINITY;
    });
  }
}

// Pair split: a row value of this warp (lanes t == 0 hold it) combined with
// the partner warp's through shared memory; both warps get the same result.
// NOTES: the two warps of a pair meet at named barrier 1 + pair (64 threads).
// A warp writes its slot again only after the next barrier both pass, by
// which time the partner has read it.
template <class K>
__device__ __forceinline__ void pair_combine(float (&v)[K::kMT][2], bool sum, const FwdThread& th) {
  float* const s_rows = reinterpret_cast<float*>(smem + K::kRowsOff);
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      if (th.t == 0) s_rows[th.warp * K::kWarpRows + mt * 16 + hf * 8 + th.g] = v[mt][hf];
  pair_sync(th.warp / K::kSplit);
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float other = s_rows[(th.warp ^ 1) * K::kWarpRows + mt * 16 + hf * 8 + th.g];
      v[mt][hf] = sum ? v[mt][hf] + other : fmaxf(v[mt][hf], other);
    }
}

// Online softmax: m' = max(m, rowmax S); O *= 2^(m - m'); P = 2^(S - m').
// Dropout (z, dropout.cuh) multiplies P after the row sum: l and the lse are
// those before dropout, O accumulates P z.
template <class K, typename T, class Z>
__device__ __forceinline__ void online_softmax(Scores<K>& s, float (&row_max)[K::kMT][2],
                                               float (&row_sum)[K::kMT][2], OAcc<K>& acc, PFrags<K>& pk,
                                               float scale_log2, const FwdThread& th, const Z& z) {
  using Mma = MmaType<T>;
  float new_max[K::kMT][2];
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = row_max[mt][hf];
#pragma unroll
      for (int nt = 0; nt < K::kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
      new_max[mt][hf] = quad_max(mx);
    }
  if constexpr (K::kPairSplit) pair_combine<K>(new_max, /*sum=*/false, th);
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float mx = new_max[mt][hf];
      // A row with nothing visible yet keeps m = -inf; subtracting 0 then
      // gives P = 2^-inf = 0 and no NaN.
      const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
      const float corr = fast_exp2(row_max[mt][hf] * scale_log2 - m_scaled);
      row_max[mt][hf] = mx;
      // P of this row to 16 bits right away (registers hf of the A
      // fragment: a0/a2 row g, a1/a3 row g + 8), so S dies row by row.
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < K::kNT; ++nt) {
        float p0 = fast_exp2(fmaf(s[mt][nt][2 * hf], scale_log2, -m_scaled));
        float p1 = fast_exp2(fmaf(s[mt][nt][2 * hf + 1], scale_log2, -m_scaled));
        sum += p0 + p1;
        z.apply(p0, p1, mt, nt, hf);
        pk[mt][nt / 2][hf + 2 * (nt % 2)] = Mma::pack(p0, p1);
      }
      row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;
#pragma unroll
      for (int dt = 0; dt < K::kDT; ++dt) {
        acc[mt][dt][2 * hf] *= corr;
        acc[mt][dt][2 * hf + 1] *= corr;
      }
    }
}

}  // namespace flashattn::cuda::sm80
