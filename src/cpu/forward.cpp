// CPU FlashAttention-2 forward: Q tiles outer (one work item each, spread over
// threads), K/V tiles inner, online softmax in f32, logsumexp written out.
// Extra memory: a few tiles per thread, never seqlen^2.
#include <cmath>
#include <vector>

#include "core/backends.h"
#include "core/parallel.h"
#include "cpu/tiles.h"

namespace flashattn::cpu {
namespace {

struct ForwardScratch {
  std::vector<float> q, kt, v, s, acc, row_max, row_sum;
  explicit ForwardScratch(int d)
      : q(kBlockQ * d), kt(d * kBlockK), v(kBlockK * d), s(kBlockQ * kBlockK), acc(kBlockQ * d),
        row_max(kBlockQ), row_sum(kBlockQ) {}
  static size_t bytes(int d) {
    return sizeof(float) * (3 * kBlockQ * d + 2 * kBlockK * d + kBlockQ * kBlockK);
  }
};

// O = O / l ; L = m + log(l); a row that saw no key gets O = 0, L = -inf.
// With a sink (score_mod.h): L = logaddexp(L, sink), O *= exp(L_keys - L).
void store_tile(const AttentionParams& p, int b, int h, const SequenceInfo& seq, int q0, int rows,
                const ForwardScratch& w) {
  const int d = p.head_dim;
  for (int i = 0; i < rows; ++i) {
    const float l = w.row_sum[i];
    float lse = l > 0.0f ? w.row_max[i] + std::log(l) : kNegInf;
    float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    if (p.has_sinks()) {
      const AttentionSink sink{p.sinks[h]};
      const float lse_keys = lse;
      lse = sink.lse(lse_keys);
      inv_l *= sink.output_factor(lse_keys, lse);
    }
    const int64_t off = row_offset(b, seq.row_q, q0 + i, h, p.o_batch_stride, p.o_row_stride,
                                   p.o_head_stride, p.is_varlen());
    for (int c = 0; c < d; ++c) store_from_float(p.out, off + c, p.dtype, w.acc[i * d + c] * inv_l);
    if (p.lse != nullptr) p.lse[lse_offset(p, b, seq.row_q, q0 + i, h)] = lse;
  }
}

void forward_tile(const AttentionParams& p, int b, int h, int q_tile, ForwardScratch& w) {
  const SequenceInfo seq = sequence_info(p, b);
  const MaskPolicy mask = mask_for(p, seq);
  const AlibiScore alibi = alibi_for(p, seq, b, h);
  const int d = p.head_dim, hk = h / p.group_size();
  const int q0 = q_tile * kBlockQ;
  const int rows = std::min(kBlockQ, seq.seqlen_q - q0);
  if (rows <= 0) return;

  load_tile(p, q_rows(p), b, seq.row_q, q0, rows, kBlockQ, h, p.scale, w.q.data());
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.row_max.begin(), w.row_max.end(), kNegInf);
  std::fill(w.row_sum.begin(), w.row_sum.end(), 0.0f);

  // Only key tiles some row of this tile can see; the rest are skipped.
  const int k_begin = mask.key_begin(q0), k_end = mask.key_end(q0 + rows);
  for (int k0 = k_begin / kBlockK * kBlockK; k0 < k_end; k0 += kBlockK) {
    const int cols = std::min(kBlockK, seq.seqlen_k - k0);
    load_tile_transposed(p, k_rows(p), b, seq.row_k, k0, cols, hk, w.kt.data());
    load_tile(p, v_rows(p), b, seq.row_k, k0, cols, kBlockK, hk, 1.0f, w.v.data());
    // S = (scale * Q) K^T, softcapped and masked
    matmul_a_bt(w.q.data(), w.kt.data(), rows, d, w.s.data());
    finish_scores(p, mask, alibi, q0, rows, k0, cols, w.s.data());
    for (int i = 0; i < rows; ++i) {
      float* si = &w.s[i * kBlockK];
      // m_new = max(m, rowmax(S))
      float m_new = w.row_max[i];
      for (int j = 0; j < kBlockK; ++j) m_new = std::max(m_new, si[j]);
      if (m_new == kNegInf) continue;  // nothing visible yet in this row
      // P = exp(S - m_new); l = l * exp(m - m_new) + rowsum(P); O *= exp(m - m_new)
      const float correction = std::exp(w.row_max[i] - m_new);
      const float sum = exp_shifted(si, m_new);
      w.row_sum[i] = w.row_sum[i] * correction + sum;
      if (p.has_dropout()) {  // after the sum: l is the normalizer before dropout
        float z[kBlockK];
        dropout_factors(p.dropout, b * p.heads_q + h, q0 + i, k0, z);
        for (int j = 0; j < kBlockK; ++j) si[j] *= z[j];
      }
      w.row_max[i] = m_new;
      float* acc = &w.acc[i * d];
      for (int c = 0; c < d; ++c) acc[c] *= correction;
    }
    // O += P V (rows with nothing visible have P = 0 from exp(-inf))
    for (int i = 0; i < rows; ++i) {
      if (w.row_max[i] == kNegInf) std::fill(&w.s[i * kBlockK], &w.s[(i + 1) * kBlockK], 0.0f);
    }
    matmul_acc_p_b(w.s.data(), w.v.data(), rows, cols, d, w.acc.data());
  }

  store_tile(p, b, h, seq, q0, rows, w);
}

}  // namespace

size_t forward_workspace_size(const AttentionParams& p) {
  const int threads = resolve_thread_count(p.num_threads);
  return static_cast<size_t>(threads) * ForwardScratch::bytes(p.head_dim);
}

fa_status forward(const AttentionParams& p) {
  const int q_tiles = ceil_div(p.seqlen_q, kBlockQ);
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads_q * q_tiles;
  const int threads = resolve_thread_count(p.num_threads);
  std::vector<ForwardScratch> scratch(static_cast<size_t>(std::min<int64_t>(threads, std::max<int64_t>(items, 1))),
                                      ForwardScratch(p.head_dim));
  parallel_for(items, static_cast<int>(scratch.size()), [&](int64_t item, int thread) {
    const int q_tile = static_cast<int>(item % q_tiles);
    const int64_t bh = item / q_tiles;
    forward_tile(p, static_cast<int>(bh / p.heads_q), static_cast<int>(bh % p.heads_q), q_tile,
                 scratch[thread]);
  });
  return FA_OK;
}

}  // namespace flashattn::cpu
