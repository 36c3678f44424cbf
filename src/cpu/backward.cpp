// CPU FlashAttention-2 backward by recomputation from the logsumexp.
//
// NOTES: Two passes instead of atomics, so gradients are deterministic and no
// two threads write the same row:
//   - dK/dV pass: one work item per (sequence, kv head, key tile); it walks the
//     query tiles (of every query head in its group) that can see the tile.
//   - dQ pass: one work item per (sequence, query head, query tile); it walks
//     the key tiles it can see.
// Each pass recomputes P = exp(S - lse) and dP = dO V^T; the extra FLOPs buy
// freedom from synchronization. D = rowsum(dO * O) is computed first.
#include <cmath>
#include <memory>
#include <vector>

#include "core/backends.h"
#include "core/parallel.h"
#include "cpu/block_sparse.h"
#include "cpu/tiles.h"

namespace flashattn::cpu {
namespace {

struct BackwardScratch {
  std::vector<float> q, dout, kt, vt, k, s, dp, pt, dst, grad, grad2, lse, row_d;
  bool has_empty_row = false;  // some loaded query row has lse = -inf (sees no key)
  BlockScratch blocks;
  explicit BackwardScratch(int d)
      : q(kBlockQ * d), dout(kBlockQ * d), kt(d * kBlockK), vt(d * kBlockK), k(kBlockK * d),
        s(kBlockQ * kBlockK), dp(kBlockQ * kBlockK), pt(kBlockK * kBlockQ), dst(kBlockK * kBlockQ),
        grad(kBlockK * d), grad2(kBlockK * d), lse(kBlockQ), row_d(kBlockQ) {}
};

// dst[j][i] = src[i][j] for the first `rows` rows of a kBlockQ x kBlockK tile.
void transpose_tile(const float* src, int rows, float* dst) {
  static_assert(kBlockQ == kBlockK, "square tiles");
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < kBlockK; ++j) dst[j * kBlockQ + i] = src[i * kBlockK + j];
}

RowTensor dout_rows(const AttentionParams& p) {
  return {p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride};
}

// D[h][row] = rowsum(dO * O), in the same (heads_q, total_q) layout for every batch kind.
void compute_row_d(const AttentionParams& p, float* row_d) {
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_q, p.num_threads, [&](int64_t item, int) {
    const int b = static_cast<int>(item / p.heads_q), h = static_cast<int>(item % p.heads_q);
    const SequenceInfo seq = sequence_info(p, b);
    for (int i = 0; i < seq.seqlen_q; ++i) {
      const int64_t o = row_offset(b, seq.row_q, i, h, p.o_batch_stride, p.o_row_stride,
                                   p.o_head_stride, p.is_varlen());
      const int64_t g = row_offset(b, seq.row_q, i, h, p.do_batch_stride, p.do_row_stride,
                                   p.do_head_stride, p.is_varlen());
      float sum = 0.0f;
      for (int c = 0; c < p.head_dim; ++c) {
        sum += load_as_float(p.out, o + c, p.dtype) * load_as_float(p.dout, g + c, p.dtype);
      }
      row_d[static_cast<int64_t>(h) * p.total_q + seq.row_q + i] = sum;
    }
  });
}

// dL/dsinks[h] = sum over the head's rows of -exp(sink - lse) * D (score_mod.h),
// summed in double in row order: deterministic.
void compute_dsinks(const AttentionParams& p, const float* row_d) {
  parallel_for(p.heads_q, p.num_threads, [&](int64_t h, int) {
    const AttentionSink sink{p.sinks[h]};
    double sum = 0.0;
    for (int b = 0; b < p.batch; ++b) {
      const SequenceInfo seq = sequence_info(p, b);
      for (int i = 0; i < seq.seqlen_q; ++i) {
        const double lse = p.lse[lse_offset(p, b, seq.row_q, i, static_cast<int>(h))];
        sum += sink.grad_term(lse, static_cast<double>(row_d[h * p.total_q + seq.row_q + i]));
      }
    }
    p.dsinks[h] = static_cast<float>(sum);
  });
}

// For a (query tile, key tile) pair with Q, dO, K^T, V^T, lse and D loaded:
// s <- P z = exp(S - lse) z (0 where masked or the row sees nothing; z the
// dropout factor, 1 without), dp <- dS = P * (z dP - D) * softcap'(S) * scale,
// with dP = dO V^T; bh = b * heads_q + h (the dropout coordinates). Both P and
// dS are exactly 0 at masked pairs (where exp(-inf - lse) is NaN for a NaN lse
// and dP is NaN for a masked key's NaN V: neither may leak).
void recompute_p_and_ds(const AttentionParams& p, const TileMask& tile, const AlibiScore& alibi,
                        int bh, int rows, int cols, BackwardScratch& w) {
  const int d = p.head_dim, q0 = tile.q0, k0 = tile.k0;
  matmul_a_bt(w.q.data(), w.kt.data(), rows, d, w.s.data());  // S = scale * Q K^T
  for (int i = 0; i < rows * kBlockK; ++i) w.s[i] *= p.scale;
  finish_scores(p, tile, alibi, rows, cols, w.s.data());
  matmul_a_bt(w.dout.data(), w.vt.data(), rows, d, w.dp.data());  // dP = dO V^T
  const SoftcapScore cap{p.softcap};
  float softcap_grad[kBlockK];  // d/du [c tanh(u/c)] per key of one row (score_mod.h)
  for (int i = 0; i < rows; ++i) {
    float* s = &w.s[i * kBlockK];
    float* dp = &w.dp[i * kBlockK];
    if (w.lse[i] == kNegInf) {  // the row sees no key: zero gradients
      std::fill(s, s + kBlockK, 0.0f);
      std::fill(dp, dp + kBlockK, 0.0f);
      continue;
    }
    if (p.softcap > 0) {
      // softcap's derivative is a function of the capped score, before the ALiBi term.
      for (int j = 0; j < kBlockK; ++j) {
        const float capped = s[j] - alibi.bias<float>(q0 + i, k0 + j);
        softcap_grad[j] = s[j] == kNegInf ? 0.0f : cap.grad(capped);
      }
    }
    exp_shifted(s, w.lse[i]);  // P = exp(S - lse); masked scores (-inf) give 0
    // Dropout (attention/dropout.h): dS = P (z dP - D), and dV takes P z.
    float z[kBlockK];
    if (p.has_dropout()) dropout_factors(p.dropout, bh, q0 + i, k0, z);
    for (int j = 0; j < kBlockK; ++j) {
      const float zj = p.has_dropout() ? z[j] : 1.0f;
      float ds = s[j] * (dp[j] * zj - w.row_d[i]);
      if (p.softcap > 0) ds *= softcap_grad[j];
      dp[j] = ds * p.scale;
      s[j] *= zj;
    }
  }
  if (tile.full()) return;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < kBlockK; ++j)
      if (j >= cols || !tile.visible(i, j)) w.s[i * kBlockK + j] = w.dp[i * kBlockK + j] = 0.0f;
}

// Whether the products of a (query tile, key tile) pair must skip masked
// pairs (tiles.h, accumulate_p_b): some pair is masked or some row sees no
// key, and the operand `b` of rows x d values is not all finite.
bool needs_exact(const TileMask& tile, const BackwardScratch& w, const float* b, int b_rows, int d) {
  const bool partly_masked = !tile.full() || w.has_empty_row;
  return partly_masked && !all_finite(b, b_rows * d);
}

void load_query_side(const AttentionParams& p, const float* row_d_all, int b,
                     const SequenceInfo& seq, int h, int q0, int rows, BackwardScratch& w) {
  load_tile(p, q_rows(p), b, seq.row_q, q0, rows, kBlockQ, h, 1.0f, w.q.data());
  load_tile(p, dout_rows(p), b, seq.row_q, q0, rows, kBlockQ, h, 1.0f, w.dout.data());
  w.has_empty_row = false;
  for (int i = 0; i < rows; ++i) {
    w.lse[i] = p.lse[lse_offset(p, b, seq.row_q, q0 + i, h)];
    w.row_d[i] = row_d_all[static_cast<int64_t>(h) * p.total_q + seq.row_q + q0 + i];
    w.has_empty_row |= w.lse[i] == kNegInf;
  }
}

void store_rows(const AttentionParams& p, void* base, int64_t batch_stride, int64_t row_stride,
                int64_t head_stride, int b, int64_t seq_first_row, int row0, int rows, int h,
                const float* src) {
  for (int r = 0; r < rows; ++r) {
    const int64_t off = row_offset(b, seq_first_row, row0 + r, h, batch_stride, row_stride,
                                   head_stride, p.is_varlen());
    for (int c = 0; c < p.head_dim; ++c) store_from_float(base, off + c, p.dtype, src[r * p.head_dim + c]);
  }
}

// dV = sum P^T dO ; dK = sum dS^T (scale folded into dS) Q, over the group's query heads.
void dkdv_tile(const AttentionParams& p, const BlockLists& blocks, const float* row_d_all, int b, int hk,
               int k_tile, BackwardScratch& w) {
  const SequenceInfo seq = sequence_info(p, b);
  const MaskPolicy mask = mask_for(p, seq);
  const int d = p.head_dim;
  const int k0 = k_tile * kBlockK;
  const int cols = std::min(kBlockK, seq.seqlen_k - k0);
  if (cols <= 0) return;
  // With a block mask, keys no query block of the group lists are not read
  // (zeros; their dK, dV rows stay 0: no query tile sees them).
  const uint8_t* keys = blocks.listed_keys(b, hk * p.group_size(), p.group_size(), k0, cols, w.blocks);
  load_tile_transposed(p, k_rows(p), b, seq.row_k, k0, cols, hk, w.kt.data(), keys);
  load_tile_transposed(p, v_rows(p), b, seq.row_k, k0, cols, hk, w.vt.data(), keys);
  std::vector<float>& dk = w.grad;
  std::vector<float>& dv = w.grad2;
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
    const AlibiScore alibi = alibi_for(p, seq, b, h);
    for_each_query_tile(blocks, b, h, mask, k0, cols, w.blocks, [&](int q0, int rows, const TileMask& tile) {
      load_query_side(p, row_d_all, b, seq, h, q0, rows, w);
      recompute_p_and_ds(p, tile, alibi, b * p.heads_q + h, rows, cols, w);
      // dV += P^T dO ; dK += dS^T Q (the transposes make them the forward's P V product)
      transpose_tile(w.s.data(), rows, w.pt.data());
      transpose_tile(w.dp.data(), rows, w.dst.data());
      // Transposed products: row j of P^T is key k0 + j, column i is query q0 + i.
      const auto visible = [&](int j, int i) { return w.lse[i] != kNegInf && tile.visible(i, j); };
      accumulate_p_b(w.pt.data(), w.dout.data(), cols, rows, d, dv.data(),
                     needs_exact(tile, w, w.dout.data(), rows, d), visible);
      accumulate_p_b(w.dst.data(), w.q.data(), cols, rows, d, dk.data(), needs_exact(tile, w, w.q.data(), rows, d),
                     visible);
    });
  }
  store_rows(p, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, b, seq.row_k, k0, cols,
             hk, dk.data());
  store_rows(p, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, b, seq.row_k, k0, cols,
             hk, dv.data());
}

// dQ = sum dS K (scale folded into dS).
void dq_tile(const AttentionParams& p, const BlockLists& blocks, const float* row_d_all, int b, int h,
             int q_tile, BackwardScratch& w) {
  const SequenceInfo seq = sequence_info(p, b);
  const MaskPolicy mask = mask_for(p, seq);
  const AlibiScore alibi = alibi_for(p, seq, b, h);
  const int d = p.head_dim, hk = h / p.group_size();
  const int q0 = q_tile * kBlockQ;
  const int rows = std::min(kBlockQ, seq.seqlen_q - q0);
  if (rows <= 0) return;
  load_query_side(p, row_d_all, b, seq, h, q0, rows, w);
  std::vector<float>& dq = w.grad;  // kBlockQ == kBlockK rows
  std::fill(dq.begin(), dq.end(), 0.0f);
  for_each_key_tile(blocks, b, h, mask, q0, rows, w.blocks, [&](int k0, int cols, const TileMask& tile) {
    load_tile_transposed(p, k_rows(p), b, seq.row_k, k0, cols, hk, w.kt.data(), tile.keys);
    load_tile_transposed(p, v_rows(p), b, seq.row_k, k0, cols, hk, w.vt.data(), tile.keys);
    load_tile(p, k_rows(p), b, seq.row_k, k0, cols, kBlockK, hk, 1.0f, w.k.data(), tile.keys);
    recompute_p_and_ds(p, tile, alibi, b * p.heads_q + h, rows, cols, w);
    accumulate_p_b(w.dp.data(), w.k.data(), rows, cols, d, dq.data(), needs_exact(tile, w, w.k.data(), cols, d),
                   [&](int i, int j) { return w.lse[i] != kNegInf && tile.visible(i, j); });
  });
  store_rows(p, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, b, seq.row_q, q0, rows,
             h, dq.data());
}

static_assert(kBlockQ == kBlockK, "dq_tile reuses the key-tile gradient buffer");

}  // namespace

size_t backward_workspace_size(const AttentionParams& p) {
  return sizeof(float) * static_cast<size_t>(p.heads_q) * static_cast<size_t>(p.total_q);
}

fa_status backward(const AttentionParams& p) {
  std::unique_ptr<float[]> owned;
  float* row_d = static_cast<float*>(p.workspace);
  if (row_d == nullptr) {
    owned.reset(new float[std::max<size_t>(1, backward_workspace_size(p) / sizeof(float))]);
    row_d = owned.get();
  }
  compute_row_d(p, row_d);
  if (p.has_sinks()) compute_dsinks(p, row_d);

  const int threads = resolve_thread_count(p.num_threads);
  const BlockLists blocks(p, true);
  std::vector<BackwardScratch> scratch(static_cast<size_t>(threads), BackwardScratch(p.head_dim));
  const int k_tiles = ceil_div(p.seqlen_k, kBlockK);
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_kv * k_tiles, threads,
               [&](int64_t item, int t) {
                 const int64_t bh = item / k_tiles;
                 dkdv_tile(p, blocks, row_d, static_cast<int>(bh / p.heads_kv),
                           static_cast<int>(bh % p.heads_kv), static_cast<int>(item % k_tiles),
                           scratch[t]);
               });
  const int q_tiles = ceil_div(p.seqlen_q, kBlockQ);
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_q * q_tiles, threads,
               [&](int64_t item, int t) {
                 const int64_t bh = item / q_tiles;
                 dq_tile(p, blocks, row_d, static_cast<int>(bh / p.heads_q),
                         static_cast<int>(bh % p.heads_q), static_cast<int>(item % q_tiles),
                         scratch[t]);
               });
  return FA_OK;
}

}  // namespace flashattn::cpu
