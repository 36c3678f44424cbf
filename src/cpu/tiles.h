// CPU backend: tile sizes and the small dense kernels both passes share.
//
// NOTES: 64x64 tiles keep Q, K^T, V, S and the accumulator of one work item
// (5 * 64 * 256 * 4 B = 320 KiB at head_dim 256, 80 KiB at 64) near the L2 of
// a core; inner loops run over a contiguous dimension so the compiler
// vectorizes them without reassociating sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/layout.h"
#include "attention/score_mod.h"
#include "core/params.h"

namespace flashattn::cpu {

constexpr int kBlockQ = 64;  // query rows per tile (B_r)
constexpr int kBlockK = 64;  // key rows per tile (B_c)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A tensor of rows (q, k, v, out, dout and their gradients) seen through its strides.
struct RowTensor {
  const void* data;
  int64_t batch_stride, row_stride, head_stride;
};

inline RowTensor q_rows(const AttentionParams& p) {
  return {p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride};
}
inline RowTensor k_rows(const AttentionParams& p) {
  return {p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride};
}
inline RowTensor v_rows(const AttentionParams& p) {
  return {p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride};
}

// Calls fn(load) with load(base, index) -> float for the dtype: the switch on
// the dtype happens once per tile, not per element, so row loops vectorize.
template <typename Fn>
inline void with_loader(fa_dtype dtype, Fn&& fn) {
  switch (dtype) {
    case FA_F16:
      fn([](const void* base, int64_t i) { return fp16_to_float(static_cast<const uint16_t*>(base)[i]); });
      break;
    case FA_BF16:
      fn([](const void* base, int64_t i) { return bf16_to_float(static_cast<const uint16_t*>(base)[i]); });
      break;
    default:
      fn([](const void* base, int64_t i) { return static_cast<const float*>(base)[i]; });
      break;
  }
}

// dst[r][c] = base[offset(row0 + r) + c] * multiplier, rows beyond `rows`
// zero-filled to `tile_rows`; offset(row) is the element offset of a row's head.
// With `keep`, a row r with keep[r] == 0 is zero-filled and never read (keys
// of blocks a block mask leaves out: no memory traffic).
template <typename OffsetFn>
inline void load_rows(const AttentionParams& p, const void* base, OffsetFn offset, int row0,
                      int rows, int tile_rows, float multiplier, float* dst, const uint8_t* keep = nullptr) {
  const int d = p.head_dim;
  with_loader(p.dtype, [&](auto load) {
    for (int r = 0; r < rows; ++r) {
      if (keep != nullptr && keep[r] == 0) {
        std::fill(dst + r * d, dst + (r + 1) * d, 0.0f);
        continue;
      }
      const int64_t off = offset(row0 + r);
      for (int c = 0; c < d; ++c) dst[r * d + c] = load(base, off + c) * multiplier;
    }
  });
  std::fill(dst + rows * d, dst + tile_rows * d, 0.0f);
}

// dst[c][r] = base[offset(row0 + r) + c]: K^T, so S = Q K^T runs its inner loop
// over keys; `keep` as for load_rows.
template <typename OffsetFn>
inline void load_rows_transposed(const AttentionParams& p, const void* base, OffsetFn offset,
                                 int row0, int rows, float* dst, const uint8_t* keep = nullptr) {
  const int d = p.head_dim;
  with_loader(p.dtype, [&](auto load) {
    for (int r = 0; r < rows; ++r) {
      const bool skip = keep != nullptr && keep[r] == 0;
      const int64_t off = skip ? 0 : offset(row0 + r);
      for (int c = 0; c < d; ++c) dst[c * kBlockK + r] = skip ? 0.0f : load(base, off + c);
    }
  });
  for (int c = 0; c < d; ++c) std::fill(dst + c * kBlockK + rows, dst + (c + 1) * kBlockK, 0.0f);
}

// Row offsets of a RowTensor's (sequence b, head) rows.
inline auto row_offsets(const AttentionParams& p, const RowTensor& t, int b, int64_t seq_first_row,
                        int head) {
  return [&p, t, b, seq_first_row, head](int r) {
    return row_offset(b, seq_first_row, r, head, t.batch_stride, t.row_stride, t.head_stride,
                      p.is_varlen());
  };
}

inline void load_tile(const AttentionParams& p, const RowTensor& t, int b, int64_t seq_first_row,
                      int row0, int rows, int tile_rows, int head, float multiplier, float* dst,
                      const uint8_t* keep = nullptr) {
  load_rows(p, t.data, row_offsets(p, t, b, seq_first_row, head), row0, rows, tile_rows,
            multiplier, dst, keep);
}

inline void load_tile_transposed(const AttentionParams& p, const RowTensor& t, int b,
                                 int64_t seq_first_row, int row0, int rows, int head, float* dst,
                                 const uint8_t* keep = nullptr) {
  load_rows_transposed(p, t.data, row_offsets(p, t, b, seq_first_row, head), row0, rows, dst, keep);
}

// The dense inner loops, in kernels.cpp (compiled for AVX2+FMA where the CPU has
// it, baseline x86-64 otherwise).

// C[rows][kBlockK] = A[rows][d] * Bt[d][kBlockK]
void matmul_a_bt(const float* a, const float* bt, int rows, int d, float* c);

// C[rows][d] += P[rows][kBlockK] * B[cols][d]
void matmul_acc_p_b(const float* p, const float* b, int rows, int cols, int d, float* c);

// s[j] = exp(s[j] - shift) over one row of kBlockK scores (exp(-inf) = 0, and so is
// anything below 2^-126); returns their sum.
float exp_shifted(float* s, float shift);

// The visibility of the pairs of one (query tile at q0, key tile at k0):
// the element mask, and where `allowed` is set, only the pairs it marks
// ([kBlockQ][kBlockK], 1 = block listed).
struct TileMask {
  const MaskPolicy* mask;
  int q0, k0;
  TileClass cls;                    // kFull: every pair visible, no per-element test
  const uint8_t* allowed = nullptr;  // null: every pair's block is listed
  const uint8_t* keys = nullptr;     // null: every key is read; else keys[j] = 0: key k0 + j is in no listed block

  bool full() const { return cls == TileClass::kFull; }
  bool visible(int i, int j) const {
    return mask->visible(q0 + i, k0 + j) && (allowed == nullptr || allowed[i * kBlockK + j] != 0);
  }
};

// The tile with the element mask alone.
inline TileMask element_tile(const MaskPolicy& mask, int q0, int rows, int k0) {
  const bool full = mask.tile_fully_visible(q0, q0 + rows, k0, k0 + kBlockK);
  return {&mask, q0, k0, full ? TileClass::kFull : TileClass::kPartial, nullptr};
}

// Scores in place: softcap, the ALiBi term, then -inf outside the mask.
// Partially visible tiles pay for the mask; fully visible ones skip it.
inline void finish_scores(const AttentionParams& p, const TileMask& tile, const AlibiScore& alibi, int rows,
                          int cols, float* s) {
  if (p.softcap > 0) {
    const SoftcapScore cap{p.softcap};
    for (int i = 0; i < rows * kBlockK; ++i) s[i] = cap(s[i]);
  }
  if (p.has_alibi()) {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < kBlockK; ++j)
        s[i * kBlockK + j] = alibi(s[i * kBlockK + j], tile.q0 + i, tile.k0 + j);
  }
  if (tile.full()) return;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < kBlockK; ++j)
      if (j >= cols || !tile.visible(i, j)) s[i * kBlockK + j] = kNegInf;
}

// z[j] = the dropout factor of row i for keys k0 .. k0 + kBlockK - 1 (1 / (1 - p)
// kept, 0 dropped; attention/dropout.h). A Philox call (Dropout::fragment)
// covers rows {g, g + 8} x 8 keys of a 32-key block; a row takes its 8 bits
// (half hf) of the 4 calls (t) of each block the tile touches.
inline void dropout_factors(const Dropout& d, int bh, int i, int k0, float* z) {
  const int rb = i / dropout::kBlockRows, g = i % 8, hf = (i % dropout::kBlockRows) / 8;
  const int kb_end = (k0 + kBlockK + dropout::kBlockKeys - 1) / dropout::kBlockKeys;
  for (int kb = k0 / dropout::kBlockKeys; kb < kb_end; ++kb) {
    for (int t = 0; t < 4; ++t) {
      const uint32_t bits = d.fragment(bh, rb, g, kb, t);
      for (int n = 0; n < 4; ++n)
        for (int e = 0; e < 2; ++e) {
          const int j = kb * dropout::kBlockKeys + 8 * n + 2 * t + e - k0;
          if (j >= 0 && j < kBlockK) z[j] = (bits >> dropout::fragment_bit(hf, n, e)) & 1u ? d.scale : 0.0f;
        }
    }
  }
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// max(a, b) that keeps a NaN: once a row's running max is NaN it stays NaN,
// so a NaN score reaches the row's output and lse (std::max(m, NaN) == m).
inline float max_keep_nan(float m, float x) { return (x > m || x != x) ? x : m; }

// True when all n values are finite (not NaN, not +-inf), by the exponent bits.
inline bool all_finite(const float* x, int n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t any = 0;
  for (int i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return any == 0;
}

// NOTES: masked pairs weigh exactly 0, but a dense product still adds
// 0 x operand, which is NaN where the operand is NaN or Inf: a non-finite value
// at a masked key (or a masked row's query) would leak into rows that cannot
// see it. When a tile is partly masked and the operand is not all finite, the
// product walks the visible pairs only: C[r][:] += P[r][j] * B[j][:] for
// visible(r, j). Rare (non-finite inputs), so plain scalar loops.
template <typename Visible>
void matmul_acc_p_b_visible(const float* p, const float* b, int rows, int cols, int d, float* c,
                            Visible&& visible) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      if (!visible(r, j)) continue;
      const float prj = p[r * kBlockK + j];
      for (int k = 0; k < d; ++k) c[r * d + k] += prj * b[j * d + k];
    }
  }
}

// C += P B (matmul_acc_p_b), restricted to visible pairs when `exact` (a
// partly masked tile with a non-finite operand B).
template <typename Visible>
void accumulate_p_b(const float* p, const float* b, int rows, int cols, int d, float* c,
                    bool exact, Visible&& visible) {
  if (exact) {
    matmul_acc_p_b_visible(p, b, rows, cols, d, c, visible);
  } else {
    matmul_acc_p_b(p, b, rows, cols, d, c);
  }
}

}  // namespace flashattn::cpu
