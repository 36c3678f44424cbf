// The Hopper forward's softmax: the score modifier (softcap), the mask of a
// key tile and the online-softmax step, on a consumer warpgroup's S fragment
// (wgmma's accumulator layout: thread t of a warp holds rows t/4 and t/4 + 8,
// columns 2 (t % 4) + 8 i and +1 of its 16 rows).
#pragma once

#include <cmath>

#include "attention/mask.h"
#include "attention/score_mod.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/fwd/scheduler.cuh"

namespace flashattn::cuda::sm90 {

// P's exponentials in online_softmax: exp2(x, i) for element i of s. The
// default is fast_exp2 (attention/math.h), one MUFU.EX2 that ignores i:
// exp2f adds a range check and a rescale per element for denormal results,
// ~4 extra instructions on the softmax's critical path; this flushes them to
// 0, and 2^-inf = 0. bench/sm90_softmax_beside_wgmma.cu passes a policy that
// moves some of them off the MUFU.
struct MufuExp2 {
  __device__ __forceinline__ float operator()(float x, int) const { return fast_exp2(x); }
};

// A score term constant along each of this thread's two rows within a key
// tile, kept out of S's elements (alibi_key_tile): the scores are S + v[r].
// 0 without one; a runtime value, so the softmax is one copy of code.
// NOTES: a second copy for ALiBi tiles (the plain one without the shift's
// two adds a row) grew the kernels' code 12-19% and ran plain calls at
// 0.93-1.03 of the build before the shift, against 0.98-1.05 for one copy
// (H100, bench/sm90_fwd_ab.py, d64/128/256 at 2k/8k).
struct RowShift {
  float v[2] = {0.0f, 0.0f};
};

// One online-softmax step on a warpgroup's S fragment (2 rows per thread):
// new row max, correction factor for the old O and l, P = exp(S - max) in place.
// With a row shift the scores are S + shift.v[r]: it enters the row max and,
// folded into the exponent's per-row addend, the exponentials, so it costs
// two adds a row instead of one an element.
// NOTES: the shift differs between the lanes of a quad (it holds each lane's
// first column), so the quad's max is taken on S + shift, not on S with the
// old max shifted down (which mixed the lanes' units).
// NOTES: the row max and row sum are reduced through kAcc independent partials
// and both rows' shuffles are issued together: as one chain per row they were
// 32 dependent FMNMX (and FADD) per row, which ptxas kept in order (fmax and
// float adds are not reassociated), the first exponential of the tile waiting
// behind the whole max chain of row 0.
template <int kN, typename Exp2 = MufuExp2>
__device__ __forceinline__ void online_softmax(float (&s)[kN], float (&m)[2], float (&l)[2],
                                               float (&corr)[2], float scale_log2, Exp2 exp2 = {},
                                               RowShift shift = {}) {
  constexpr int kPairs = kN / 4;  // (element pairs per row)
  constexpr int kAcc = kPairs % 4 == 0 ? 4 : (kPairs % 2 == 0 ? 2 : 1);
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float part[kAcc];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) part[a] = fmaxf(s[4 * a + 2 * r], s[4 * a + 2 * r + 1]);
#pragma unroll
    for (int i = kAcc; i < kPairs; ++i)
      part[i % kAcc] = fmaxf(part[i % kAcc], fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    // m_new = max(m, rowmax(S) + shift) (this thread's quarter of the row, then the quad)
    mx[r] = part[0];
#pragma unroll
    for (int a = 1; a < kAcc; ++a) mx[r] = fmaxf(mx[r], part[a]);
    mx[r] = fmaxf(m[r], mx[r] + shift.v[r]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // A row that has seen no visible key keeps max -inf: subtract 0 instead so
    // exp2(-inf - 0) = 0 rather than NaN.
    const float ms = mx[r] == -INFINITY ? 0.0f : mx[r] * scale_log2;
    corr[r] = fast_exp2(m[r] * scale_log2 - ms);  // exp(m_old - m_new)
    // the exponent's addend: (m_new - shift) * scale * log2 e
    const float msh = fmaf(-shift.v[r], scale_log2, ms);
    m[r] = mx[r];
    float sum[kAcc];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) sum[a] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // P = exp2((S + shift) * scale * log2 e - m_new * scale * log2 e)
        const float v = exp2(fmaf(s[4 * i + 2 * r + e], scale_log2, -msh), 4 * i + 2 * r + e);
        s[4 * i + 2 * r + e] = v;
        sum[i % kAcc] += v;
      }
    }
    float total = 0.0f;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) total += sum[a];
    // l_new = l * exp(m_old - m_new) + rowsum(P); per-thread partial sums, the
    // quad reduction happens once, in the epilogue.
    l[r] = l[r] * corr[r] + total;
  }
}

// ALiBi on this thread's two rows of key tile n (score_mod.h): S += bias in
// the units of S (t.alibi's slope is divided by the logit scale), its
// row-constant part in shift (online_softmax). Runs before the mask, which
// overwrites what it removes with -inf.
// NOTES: bias = -slope |i + off - j|. Where every (row, key) pair of the CTA's
// tile lies on one side of the diagonal (all tiles but those it crosses),
// the sign is known and the bias is linear in the key:
//   bias = sgn slope (j - i - off) = base_r + sgn slope c,  c = j - col0,
// base_r = sgn slope (col0 - i - off) once per row and tile (the shift), so
// an element costs one FFMA (S + sgn slope c, c a constant). The per-element
// form converts |i + off - j| to float (I2F), which shares the pipe with the
// softmax's ex2: it made ALiBi cost the forward 12-19%; base_r added to each
// element (an FFMA and an FADD) 8-22%.
template <int kBlockN>
__device__ __forceinline__ void alibi_key_tile(float (&s)[kBlockN / 2], RowShift& shift, const RowTile& t, int n,
                                               int lane) {
  const int col0 = n * kBlockN + 2 * (lane % 4);
  const int off = t.alibi.diagonal_offset, n0 = n * kBlockN;
  const bool below = t.w.m0 + off >= n0 + kBlockN - 1;  // every key j <= i + off
  const bool above = t.rows_end - 1 + off <= n0;        // every key j >= i + off
  if (below || above) {
    const float sslope = below ? t.alibi.slope : -t.alibi.slope;
#pragma unroll
    for (int r = 0; r < 2; ++r) shift.v[r] = sslope * static_cast<float>(col0 - (t.row0 + 8 * r + off));
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[4 * i + e] = fmaf(sslope, static_cast<float>(8 * i + (e & 1)), s[4 * i + e]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[4 * i + e] = t.alibi(s[4 * i + e], t.row0 + 8 * (e >> 1), col0 + 8 * i + (e & 1));
  }
}

// The mask of key tile n (keys n0 .. n0 + kBlockN - 1) on this thread's two
// rows: -inf where a key is not visible. Skipped for tiles the mask shows in
// full.
// NOTES: visible(row, col) as one range per row: columns [lo, hi) of the tile
// relative to this lane's first, n0 + 2 * (lane % 4), so each element compares
// a compile-time column with two bounds (per-element visible() took ~6
// instructions an element; the ranges gave causal +9-11% at 2k). Without a
// window only the ragged end is cut, with row-independent bounds: per-row
// ones there too cost the unmasked runs 2-5%.
template <int kBlockN>
__device__ __forceinline__ void mask_key_tile(float (&s)[kBlockN / 2], const RowTile& t, int n, int lane) {
  const int n0 = n * kBlockN;
  if (t.mask.tile_fully_visible(t.w.m0, t.rows_end, n0, n0 + kBlockN)) return;
  const int col0 = n0 + 2 * (lane % 4);
  int lo[2], hi[2];
  if (t.mask.window_left < 0 && t.mask.window_right < 0) {
    lo[0] = lo[1] = -col0;
    hi[0] = hi[1] = t.mask.seqlen_k - col0;
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lo[r] = max(t.mask.first_key(t.row0 + 8 * r), 0) - col0;
      hi[r] = min(t.mask.end_key(t.row0 + 8 * r), t.mask.seqlen_k) - col0;
    }
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * i + (e & 1), r = e >> 1;
      if (c < lo[r] || c >= hi[r]) s[4 * i + e] = -INFINITY;
    }
  }
}

// A block mask's per-element test (ListedKeys), for key tiles it lists in
// part: bit 2 i + e of the result is set when key col0 + 8 i + e (this lane's
// keys of the tile, col0 = the tile's first key + 2 (lane % 4)) lies in a key
// block that `listed` (the bit row of one query row's block, block_sparse.cuh's
// ListedBlocks, `words` words) holds. Keys from seqlen_k on may come out either
// way (the element mask drops them).
// NOTES: the test runs in the softmax, the issue-bound part of a key tile, so
// its instructions count (a loop over the keys with a load each made 64 x 64
// blocks on 128-key tiles run 3.5 ms a call at density 0.5 against 0.44 for
// 128 x 128 blocks; H100, d 128, 8k keys, 16 heads). Blocks of >= 8 keys
// (kFastBlockKeys): the tile's blocks lie in the two bit words from its first
// key's (<= 17 blocks from bit 31 at most): two loads a row. Where the block
// size also divides the tile, the tile starts on a block boundary and each
// block is a run of block_k / 4 result bits: one select per block. Otherwise
// the lane's keys, ascending by gaps of 1 and 7, cross at most one block
// boundary from one to the next, so the block index steps without a division.
inline constexpr int kFastBlockKeys = 8;
template <int kBlockN>
__device__ __forceinline__ uint32_t listed_key_bits(const uint32_t* listed, int words, int col0, int block_k) {
  static_assert(kBlockN / 4 <= 32, "a lane's keys of one row in one word");
  int kb = col0 / block_k;
  int next = (kb + 1) * block_k;  // the first key of block kb + 1
  uint32_t bits = 0;
  if (block_k >= kFastBlockKeys) {
    const int w0 = kb >> 5;
    // (A lane's first key may lie past the keys, so w0 may be words.)
    const uint64_t window = (w0 < words ? listed[w0] : 0u) | (w0 + 1 < words ? uint64_t{listed[w0 + 1]} << 32 : 0);
    if (kBlockN % block_k == 0) {
      const uint64_t rel = window >> (kb - 32 * w0);  // bit j: the tile's block j
      const int run = block_k / 4;                    // this lane's keys of one block
      const uint32_t ones = run >= 32 ? ~0u : (1u << run) - 1;
#pragma unroll 1
      for (int j = 0; j < kBlockN / block_k; ++j) bits |= ((rel >> j) & 1u) ? ones << (run * j) : 0u;
      return bits;
    }
#pragma unroll
    for (int c = 0; c < kBlockN / 4; ++c) {
      const int col = col0 + 8 * (c >> 1) + (c & 1);
      const bool step = col >= next;
      kb += step;
      next += step ? block_k : 0;
      bits |= static_cast<uint32_t>((window >> (kb - 32 * w0)) & 1u) << c;
    }
    return bits;
  }
#pragma unroll 1
  for (int c = 0; c < kBlockN / 4; ++c) {
    const int col = col0 + 8 * (c >> 1) + (c & 1);
    while (col >= next) {
      ++kb;
      next += block_k;
    }
    if ((kb >> 5) >= words) break;
    bits |= ((listed[kb >> 5] >> (kb & 31)) & 1u) << c;
  }
  return bits;
}

// Key tile n listed in part by the block mask: scores of this thread's two
// rows at keys of blocks the row's query block does not list -> -inf.
template <int kBlockN>
__device__ __forceinline__ void drop_unlisted_keys(float (&s)[kBlockN / 2], const AttentionParams& p,
                                                   const BlockTiles& tiles, const RowTile& t, int n, int lane) {
  const BlockMaskView& m = p.block_mask;
  const int64_t list_row = BlockTiles::list_row(m, t.w.b, t.w.h);
  const int col0 = n * kBlockN + 2 * (lane % 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = t.row0 + 8 * r;
    // (Rows past the sequence are never stored.)
    const uint32_t bits = row < t.rows_end ? listed_key_bits<kBlockN>(tiles.blocks.row_bits(m, list_row, row),
                                                                      tiles.blocks.words, col0, m.block_k)
                                           : ~0u;
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (((bits >> (2 * i + e)) & 1u) == 0) s[4 * i + 2 * r + e] = -INFINITY;
      }
    }
  }
}

}  // namespace flashattn::cuda::sm90
