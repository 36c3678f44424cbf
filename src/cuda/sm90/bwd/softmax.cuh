// The Hopper backward's softmax gradient on a consumer's S^T / dP^T
// fragments (keys as rows, ConsumerThread's layout):
//   P^T  = exp2(S^T * scale*log2e + alibi*log2e - lse*log2e)    (0 where masked)
//   dS^T = P^T * (dP^T - D)
// with softcap c, S^T * scale becomes c tanh(S^T * scale / c) and dS^T gains
// the factor 1 - tanh^2;
// and the 16-bit A fragments and [key][query] shared-memory tiles made of them.
//
// NOTES:
// - Masking: a (query tile, key tile) pair that MaskPolicy::tile_fully_visible
//   clears tests nothing; others zero P outside each key's visible query range
//   [query_begin(j), query_end(j + 1)) (the MaskPolicy's, so the same pairs as
//   visible(i, j)) clipped to the sequence, which also zeroes P for query rows
//   past the sequence (TMA fills them with the next sequence's rows in varlen
//   batches) and for keys past it.
// - The scale is applied to dK (epilogue) and dQ (post-pass), not folded into
//   dS (fp16 subnormals: see the sm80 kernel's NOTES).
#pragma once

#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/numeric.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// P^T = exp2(S^T * scale_log2 - lse2) in place; lse_row: the shared-memory
// address of the log2-domain lse of this thread's first query column (the
// columns of tile i are 32 bytes further per i).
template <class K>
__device__ __forceinline__ void exp_scores(float (&st)[K::kSN / 2], uint32_t lse_row, float scale_log2) {
  fence_operands(st);
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i) {
    const float2 lse2 = ld_shared_v2(lse_row + 32u * i);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      st[4 * i + e] = fast_exp2(fmaf(st[4 * i + e], scale_log2, -((e & 1) ? lse2.y : lse2.x)));
    }
  }
}

// With softcap c: P^T = exp2(c log2e tanh(S^T * scale / c) - lse2);
// inv_cap = scale / c, cap_log2 = c log2e (bwd::Workspace).
template <class K>
__device__ __forceinline__ void exp_scores_softcap(float (&st)[K::kSN / 2], uint32_t lse_row, float inv_cap,
                                                   float cap_log2) {
  fence_operands(st);
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i) {
    const float2 lse2 = ld_shared_v2(lse_row + 32u * i);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float th = SoftcapScore::unscaled(st[4 * i + e], inv_cap);
      st[4 * i + e] = fast_exp2(fmaf(th, cap_log2, -((e & 1) ? lse2.y : lse2.x)));
    }
  }
}

// Which score modifiers a backward kernel's consumers apply, as a policy type
// (a template argument of the kernel; launch.cuh picks one per call):
//   TileMods         per call, at run time: none, softcap, or ALiBi (the kernel
//                    without a modifier keeps its code)
//   SoftcapAlibiMods softcap and ALiBi together (a kernel of its own: the bias
//                    needed again for softcap's derivative, with the other
//                    paths beside it, spilled 12 bytes in the plain d 64 and
//                    d 128 kernels)
struct TileMods {
  static constexpr bool kSoftcapAlibi = false;
};
struct SoftcapAlibiMods {
  static constexpr bool kSoftcapAlibi = true;
};

// The base-2 logit of a raw score x, plus c (exp_scores_alibi's): the plain
// scale (x scale log2e), or softcap's (c log2e tanh(x scale / c); inv_cap =
// scale / c, cap_log2 = c log2e, bwd::Workspace).
struct PlainLogit2 {
  float scale_log2;
  __device__ __forceinline__ float operator()(float x, float c) const { return fmaf(x, scale_log2, c); }
};
struct SoftcapLogit2 {
  float inv_cap, cap_log2;
  __device__ __forceinline__ float operator()(float x, float c) const {
    return fmaf(SoftcapScore::unscaled(x, inv_cap), cap_log2, c);
  }
};

// exp_scores_alibi's bias2 again, times `unit`, for ds_scores_softcap with
// ALiBi (unit = 1 / (c log2e): the bias in units of th); the arguments are
// exp_scores_alibi's, the linear form off the diagonal as there.
template <class K>
struct AlibiBias2 {
  AlibiScore alibi2;
  int key0, query0;
  float unit, step;  // step: -side slope unit (0 across the diagonal)
  float base[2];     // per key row
  // NOTES: not used by exp_scores_alibi itself: through this struct the
  // TileMods kernels with ALiBi spilled 8 bytes more at d 64 (-Xptxas -v).
  __device__ __forceinline__ AlibiBias2(const AlibiScore& a, int key0_, int query0_, int side, float unit_)
      : alibi2(a), key0(key0_), query0(query0_), unit(unit_) {
    const float sslope = static_cast<float>(side) * a.slope;
    step = -sslope * unit;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      base[r] = sslope * unit * static_cast<float>(key0 + 8 * r - query0 - a.diagonal_offset);
  }
  __device__ __forceinline__ float linear(int i, int e) const {
    return fmaf(step, static_cast<float>(8 * i + (e & 1)), base[e >> 1]);
  }
  __device__ __forceinline__ float exact(int i, int e) const {
    return alibi2.bias<float>(query0 + 8 * i + (e & 1), key0 + 8 * (e >> 1)) * unit;
  }
};

// With ALiBi: P^T = exp2(logit2(S^T) + bias2(i, j) - lse2), logit2 a
// PlainLogit2 or (SoftcapAlibiMods) a SoftcapLogit2, bias2 the ALiBi bias in
// base 2 (alibi2's slope is slope * log2 e). key0: this
// thread's first key row (key_r); query0: its first query column
// (q0 + q_col + 2 * quad), as in consume's element map; side: +1 when every
// pair of the tile has j <= i + off, -1 when every pair has j >= i + off,
// 0 when the diagonal crosses the tile.
// NOTES: a second function chosen once per tile, not a zero-slope bias in
// exp_scores: the plain loop keeps its code (SASS) when ALiBi is off. Off the
// diagonal the bias is linear, -slope |i + off - j| = side slope (j - i - off)
// = base_r - side slope c (c = i - query0, base_r per key row), an FFMA per
// element instead of the integer distance and its I2F (as the forward's
// alibi_key_tile).
template <class K, class Logit2>
__device__ __forceinline__ void exp_scores_alibi(float (&st)[K::kSN / 2], uint32_t lse_row, const Logit2& logit2,
                                                 const AlibiScore& alibi2, int key0, int query0, int side) {
  fence_operands(st);
  // bias2(i, e) of element e of accumulator tile i, then the exponentials.
  auto apply = [&](auto&& bias2) {
#pragma unroll
    for (int i = 0; i < K::kSN / 8; ++i) {
      const float2 lse2 = ld_shared_v2(lse_row + 32u * i);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[4 * i + e] = fast_exp2(logit2(st[4 * i + e], bias2(i, e) - ((e & 1) ? lse2.y : lse2.x)));
    }
  };
  if (side != 0) {
    const float sslope = static_cast<float>(side) * alibi2.slope;
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      base[r] = sslope * static_cast<float>(key0 + 8 * r - query0 - alibi2.diagonal_offset);
    apply([&](int i, int e) { return fmaf(-sslope, static_cast<float>(8 * i + (e & 1)), base[e >> 1]); });
  } else {
    apply([&](int i, int e) { return alibi2.bias<float>(query0 + 8 * i + (e & 1), key0 + 8 * (e >> 1)); });
  }
}

// The side of the diagonal i + off = j that the whole (query tile q0, key
// tile k0) lies on, for exp_scores_alibi: +1 below (j <= i + off), -1 above,
// 0 across.
template <class K>
__device__ __forceinline__ int alibi_side(int q0, int k0, int off) {
  if (k0 + K::kBlockN - 1 <= q0 + off) return 1;
  if (q0 + K::kBlockM - 1 + off <= k0) return -1;
  return 0;
}

// Boundary tile: key j sees queries [query_begin(j), query_end(j + 1)) of the
// sequence (none if j is past it). Per key row r of this thread (key_r + 8r),
// query column c of its span is visible iff c - rel_lo[r] (unsigned) < count[r].
// NOTES: a separate pass with two bounds per row, not visible() per element
// inside the exp loop: that made the d 64 kernel's loop body large enough to
// stall on instruction fetch (ncu: no_instruction was the top stall reason).
__device__ __forceinline__ void visible_spans(int (&rel_lo)[2], int (&count)[2], const BwdCta& cta,
                                              const ConsumerThread& th, int q0) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = cta.w.k0 + th.key_r + 8 * r;
    const int lo = cta.mask.query_begin(kj);
    const int hi = kj < cta.seq.seqlen_k ? min(cta.mask.query_end(kj + 1), cta.seq.seqlen_q) : lo;
    rel_lo[r] = lo - q0 - th.q_col - 2 * th.quad;
    count[r] = max(hi - lo, 0);
  }
}

// P^T = 0 outside the visible spans.
template <class K>
__device__ __forceinline__ void zero_invisible(float (&st)[K::kSN / 2], const int (&rel_lo)[2], const int (&count)[2]) {
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const bool vis = static_cast<unsigned>(8 * i + (e & 1) - rel_lo[r]) < static_cast<unsigned>(count[r]);
      st[4 * i + e] = vis ? st[4 * i + e] : 0.0f;
    }
}

// Which pairs of this thread's S^T elements the block mask lists, on a step
// it lists in part: bit e of word e / 32 for element e (accumulator tile
// e / 4, element e % 4: key key_r + 8 ((e % 4) >> 1), query query0 + 8 (e / 4)
// + (e & 1)). Key row r lies in key block kb[r]; query column q in query
// block q / block_q, whose bit row holds the listed key blocks. Queries and
// keys past the sequence are clamped to its last block (their P is zero
// already: zero_invisible).
// NOTES: made before S^T and dP^T are issued, as dropout's keep bits are
// (their accumulators not live yet): tested where P is made, the loads and
// their addresses spilled 12 bytes at d 64.
template <class K>
struct ListedBits {
  static constexpr int kWords = (K::kSN / 2 + 31) / 32;
  uint32_t w[kWords];
};
template <class K>
__device__ __forceinline__ ListedBits<K> listed_bits(const BlockMaskView& m, const ListedBlocks& blocks,
                                                     const BwdCta& cta, const ConsumerThread& th, int h, int q0) {
  ListedBits<K> out;
#pragma unroll
  for (int w = 0; w < ListedBits<K>::kWords; ++w) out.w[w] = 0;
  const int64_t row = BlockTiles::list_row(m, cta.b, h);
  int kb[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) kb[r] = min((cta.w.k0 + th.key_r + 8 * r) / m.block_k, m.k_blocks - 1);
  const int query0 = q0 + th.q_col + 2 * th.quad;
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint32_t* bits = blocks.row_bits(m, row, min(query0 + 8 * i + c, cta.seq.seqlen_q - 1));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 4 * i + 2 * r + c;
        out.w[e / 32] |= static_cast<uint32_t>(ListedBlocks::listed(bits, kb[r])) << (e % 32);
      }
    }
  return out;
}

// P^T = 0 where the block mask does not list the pair (listed_bits).
template <class K>
__device__ __forceinline__ void zero_unlisted(float (&st)[K::kSN / 2], const ListedBits<K>& listed) {
#pragma unroll
  for (int e = 0; e < K::kSN / 2; ++e) st[e] = (listed.w[e / 32] >> (e % 32)) & 1u ? st[e] : 0.0f;
}

// dS^T = P^T * (dP^T - D) into dpt; d_row: the shared-memory address of D of
// this thread's first query column (as exp_scores' lse_row).
template <class K>
__device__ __forceinline__ void ds_scores(float (&dpt)[K::kSN / 2], const float (&st)[K::kSN / 2], uint32_t d_row) {
  fence_operands(dpt);
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i) {
    const float2 dd = ld_shared_v2(d_row + 32u * i);
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - ((e & 1) ? dd.y : dd.x));
  }
}

// With softcap: dS^T = P^T * (dP^T - D) * (1 - th^2), th = tanh(S^T scale / c),
// the softcapped logit's derivative. th is taken back from P rather than kept
// from exp_scores_softcap: log2 P = c log2e th + bias2 - lse2 (bias2 ALiBi's,
// else 0), so
//   th = (log2 P + lse2 - bias2) / (c log2e)
// bias_th(i, e): bias2 / (c log2e) of element e of tile i (NoBias: 0).
// NOTES: keeping th beside P (a second kSN / 2 array live across the dP wait)
// made ptxas serialize the wgmmas (C7512); this costs one lg2 and one lse load
// a pair instead. th is clamped to [-1, 1]: rounding may step past it, and a
// P of 0 (masked, underflowed, or a row that sees no key with its +inf lse2)
// gives -inf or NaN there, which the clamp turns into th = +-1 (factor 0,
// dS 0, as P is 0). inv_cap_log2 = 1 / (c log2e).
struct NoBias {
  __device__ __forceinline__ float operator()(int, int) const { return 0.0f; }
};
template <class K, class BiasTh = NoBias>
__device__ __forceinline__ void ds_scores_softcap(float (&dpt)[K::kSN / 2], const float (&st)[K::kSN / 2],
                                                  uint32_t d_row, uint32_t lse_row, float inv_cap_log2,
                                                  const BiasTh& bias_th = {}) {
  fence_operands(dpt);
#pragma unroll
  for (int i = 0; i < K::kSN / 8; ++i) {
    const float2 dd = ld_shared_v2(d_row + 32u * i);
    float2 lse2 = ld_shared_v2(lse_row + 32u * i);
    lse2.x *= inv_cap_log2;
    lse2.y *= inv_cap_log2;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = st[4 * i + e];
      const float th =
          fminf(fmaxf(fmaf(fast_log2(p), inv_cap_log2, ((e & 1) ? lse2.y : lse2.x) - bias_th(i, e)), -1.0f), 1.0f);
      dpt[4 * i + e] = p * (dpt[4 * i + e] - ((e & 1) ? dd.y : dd.x)) * fmaf(-th, th, 1.0f);
    }
  }
}

// 16-bit A fragments: two accumulator n8 tiles make one k16 fragment.
template <class K, typename T>
__device__ __forceinline__ void to_frags(const float (&acc)[K::kSN / 2], uint32_t (&f)[K::kSN / 16][4]) {
#pragma unroll
  for (int kt = 0; kt < K::kSN / 16; ++kt)
#pragma unroll
    for (int j = 0; j < 4; ++j) f[kt][j] = pack2<T>(acc[8 * kt + 2 * j], acc[8 * kt + 2 * j + 1]);
}

// dS^T (or P^T) -> shared memory buffer buf at base, [key][query], 128B-swizzled
// (chunk ^= row % 8): fragment f[kt][j] is accumulator tile i = 2kt + (j >> 1),
// key row key_r + 8 * (j & 1), queries q_col + 8i + 2*quad, +1.
template <class K>
__device__ __forceinline__ void store_transposed(uint32_t base, int buf, const uint32_t (&f)[K::kSN / 16][4],
                                                 const ConsumerThread& th) {
  const uint32_t rowb = base + buf * K::kDsBytes + th.key_r * 128 + th.quad * 4;
  const uint32_t swz = opaque(th.lane / 4);  // row % 8 of both rows stored
#pragma unroll
  for (int kt = 0; kt < K::kSN / 16; ++kt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = th.q_col / 8 + 2 * kt + (j >> 1);
      st_shared_b32(rowb + (i / 8) * (K::kBlockN * 128) + (j & 1) * 1024 + ((i % 8) ^ swz) * 16, f[kt][j]);
    }
  }
}

}  // namespace flashattn::cuda::sm90
