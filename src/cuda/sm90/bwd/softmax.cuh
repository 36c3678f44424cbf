// The Hopper backward's softmax gradient on a consumer's S^T / dP^T
// fragments (keys as rows, ConsumerThread's layout):
//   P^T  = exp2(S^T * scale*log2e - lse*log2e)    (0 where masked)
//   dS^T = P^T * (dP^T - D)
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
