// The CPU forward's work item: one query tile of one (sequence, head), K/V
// tiles inner, online softmax in f32. Where rows live is a policy (`Rows`), so
// the plain forward and the KV-cache forward (paged keys, rotated queries)
// share the loop:
//   Rows::q_base / k_base / v_base          tensors the rows are read from
//   Rows::q(i) / k(j) / v(j)                element offset of row i / key j's head
//   Rows::o(i) / lse(i)                     where row i's output and lse go
//   Rows::mask                              the sequence's MaskPolicy
#pragma once

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "cpu/block_sparse.h"
#include "cpu/tiles.h"

namespace flashattn::cpu {

struct ForwardScratch {
  std::vector<float> q, kt, v, s, acc, row_max, row_sum;
  BlockScratch blocks;
  explicit ForwardScratch(int d)
      : q(kBlockQ * d), kt(d * kBlockK), v(kBlockK * d), s(kBlockQ * kBlockK), acc(kBlockQ * d),
        row_max(kBlockQ), row_sum(kBlockQ) {}
  static size_t bytes(int d) {
    return sizeof(float) * (3 * kBlockQ * d + 2 * kBlockK * d + kBlockQ * kBlockK);
  }
};

// P = exp(S - m_new) per row, with the running max and sum updated and the
// accumulator rescaled by exp(m - m_new); rows with nothing visible get P = 0.
// With dropout, P is multiplied by the keep factors after the sum (l is the
// normalizer before dropout); bh = b * heads_q + h, the dropout coordinates.
inline void online_softmax_step(const AttentionParams& p, int bh, int q0, int k0, int rows, int d,
                                ForwardScratch& w) {
  for (int i = 0; i < rows; ++i) {
    float* si = &w.s[i * kBlockK];
    float m_new = w.row_max[i];
    for (int j = 0; j < kBlockK; ++j) m_new = max_keep_nan(m_new, si[j]);
    if (m_new == kNegInf) {  // nothing visible (or only -inf scores) yet in this row
      std::fill(si, si + kBlockK, 0.0f);
      continue;
    }
    const float correction = std::exp(w.row_max[i] - m_new);
    const float sum = exp_shifted(si, m_new);
    w.row_sum[i] = w.row_sum[i] * correction + sum;
    if (p.has_dropout()) {
      float z[kBlockK];
      dropout_factors(p.dropout, bh, q0 + i, k0, z);
      for (int j = 0; j < kBlockK; ++j) si[j] *= z[j];
    }
    w.row_max[i] = m_new;
    float* acc = &w.acc[i * d];
    for (int c = 0; c < d; ++c) acc[c] *= correction;
  }
}

// O = O / l ; L = m + log(l); a row that saw no key (its max is still -inf)
// gets O = 0, L = -inf; a NaN max or sum makes O and L NaN (docs/semantics.md).
// With a sink (score_mod.h): L = logaddexp(L, sink), O *= exp(L_keys - L).
template <typename Rows>
void store_tile(const AttentionParams& p, const Rows& rows_of, int q0, int rows, ForwardScratch& w) {
  const int d = p.head_dim;
  for (int i = 0; i < rows; ++i) {
    const float l = w.row_sum[i];
    const bool empty = w.row_max[i] == kNegInf;
    float lse = empty ? kNegInf : w.row_max[i] + std::log(l);
    float inv_l = empty ? 0.0f : 1.0f / l;
    if (p.has_sinks()) {
      const AttentionSink sink{p.sinks[rows_of.h]};
      const float lse_keys = lse;
      lse = sink.lse(lse_keys);
      inv_l *= sink.output_factor(lse_keys, lse);
    }
    const int64_t off = rows_of.o(q0 + i);
    for (int c = 0; c < d; ++c) store_from_float(p.out, off + c, p.dtype, empty ? 0.0f : w.acc[i * d + c] * inv_l);
    if (p.lse != nullptr) p.lse[rows_of.lse(q0 + i)] = lse;
  }
}

// `blocks`: the call's block mask (disabled when it has none, as on the KV-cache path).
template <typename Rows>
void forward_tile(const AttentionParams& p, const Rows& rows_of, int q_tile, ForwardScratch& w,
                  const BlockLists& blocks) {
  const MaskPolicy& mask = rows_of.mask;
  const AlibiScore alibi{p.has_alibi() ? p.alibi_slope(rows_of.b, rows_of.h) : 0.0f, mask.diagonal_offset()};
  const int d = p.head_dim;
  const int q0 = q_tile * kBlockQ;
  const int rows = std::min(kBlockQ, mask.seqlen_q - q0);
  if (rows <= 0) return;

  load_rows(p, rows_of.q_base, [&](int i) { return rows_of.q(i); }, q0, rows, kBlockQ, p.scale,
            w.q.data());
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.row_max.begin(), w.row_max.end(), kNegInf);
  std::fill(w.row_sum.begin(), w.row_sum.end(), 0.0f);

  // Only key tiles some row of this tile can see; the rest are skipped.
  for_each_key_tile(blocks, rows_of.b, rows_of.h, mask, q0, rows, w.blocks, [&](int k0, int cols, const TileMask& tile) {
    // Keys of blocks nobody here lists (tile.keys) are not read: zeros, masked below.
    load_rows_transposed(p, rows_of.k_base, [&](int j) { return rows_of.k(j); }, k0, cols, w.kt.data(), tile.keys);
    load_rows(p, rows_of.v_base, [&](int j) { return rows_of.v(j); }, k0, cols, kBlockK, 1.0f,
              w.v.data(), tile.keys);
    // S = (scale * Q) K^T, softcapped and masked
    matmul_a_bt(w.q.data(), w.kt.data(), rows, d, w.s.data());
    finish_scores(p, tile, alibi, rows, cols, w.s.data());
    online_softmax_step(p, rows_of.b * p.heads_q + rows_of.h, q0, k0, rows, d, w);
    // O += P V; over visible pairs only where the tile is partly masked and V
    // holds a non-finite value (0 x NaN at a masked key would leak: tiles.h).
    const bool exact = !tile.full() && !all_finite(w.v.data(), cols * d);
    accumulate_p_b(w.s.data(), w.v.data(), rows, cols, d, w.acc.data(), exact,
                   [&](int i, int j) { return tile.visible(i, j); });
  });
  store_tile(p, rows_of, q0, rows, w);
}

// Runs fn(item, scratch) over `items` work items on per-thread scratch.
template <typename Fn>
void for_each_tile(const AttentionParams& p, int64_t items, Fn&& fn) {
  const int threads = resolve_thread_count(p.num_threads);
  std::vector<ForwardScratch> scratch(
      static_cast<size_t>(std::min<int64_t>(threads, std::max<int64_t>(items, 1))),
      ForwardScratch(p.head_dim));
  parallel_for(items, static_cast<int>(scratch.size()),
               [&](int64_t item, int thread) { fn(item, scratch[thread]); });
}

}  // namespace flashattn::cpu
