#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/rotary.h"
#include "core/dtype.h"
#include "core/layout.h"
#include "core/parallel.h"

namespace flashattn::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Rounder {
  fa_dtype dtype;
  bool exact;
  double operator()(double x) const {
    return exact ? x : static_cast<double>(round_to_dtype(static_cast<float>(x), dtype));
  }
};

// Rows of one (sequence, head) as doubles: rows x head_dim.
std::vector<double> load_rows(const void* base, fa_dtype dtype, const AttentionParams& p, int b,
                              int64_t first_row, int rows, int head, int64_t batch_stride,
                              int64_t row_stride, int64_t head_stride) {
  const int d = p.head_dim;
  std::vector<double> m(static_cast<size_t>(rows) * d);
  for (int r = 0; r < rows; ++r) {
    const int64_t off = row_offset(b, first_row, r, head, batch_stride, row_stride, head_stride,
                                   p.is_varlen());
    for (int c = 0; c < d; ++c) m[static_cast<size_t>(r) * d + c] = load_as_float(base, off + c, dtype);
  }
  return m;
}

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Which (i, j) of one (sequence b, query head h) are visible: the element
// mask, and with a block mask (fa_block_mask) only where block
// (i / block_q, j / block_k) is listed, as partial or as full.
struct Visibility {
  MaskPolicy mask;
  bool blocked = false;      // a block mask applies
  int block_q = 1, block_k = 1, k_blocks = 0;
  std::vector<char> listed;  // [q_blocks][k_blocks], when blocked
  bool operator()(int i, int j) const {
    if (!mask.visible(i, j)) return false;
    return !blocked || listed[static_cast<size_t>(i / block_q) * k_blocks + j / block_k] != 0;
  }
};

// Marks the blocks one list names for (b, h) (broadcast dimensions of size 1
// read their only row).
void mark_listed(const BlockMaskView& m, const BlockList& l, int b, int h, std::vector<char>& listed) {
  if (l.counts == nullptr) return;
  const int lb = m.batch == 1 ? 0 : b, lh = m.heads == 1 ? 0 : h;
  for (int qb = 0; qb < m.q_blocks; ++qb) {
    for (int n = 0; n < l.count(lb, lh, qb); ++n) {
      listed[static_cast<size_t>(qb) * m.k_blocks + l.index(lb, lh, qb, n)] = 1;
    }
  }
}

Visibility visibility_of(const AttentionParams& p, const MaskPolicy& mask, int b, int h) {
  Visibility v;
  v.mask = mask;
  const BlockMaskView& m = p.block_mask;
  if (!p.has_block_mask()) return v;
  v.blocked = true;
  v.block_q = m.block_q;
  v.block_k = m.block_k;
  v.k_blocks = m.k_blocks;
  v.listed.assign(static_cast<size_t>(m.q_blocks) * m.k_blocks, 0);
  mark_listed(m, m.partial, b, h, v.listed);
  mark_listed(m, m.full, b, h, v.listed);
  return v;
}

// Scores of query row i against every key: softcap(scale * q.k) minus the
// ALiBi distance penalty, -inf where masked; capped[j] gets the score before
// the ALiBi term (softcap's derivative is a function of it). Returns the
// number of visible keys.
int score_row(const AttentionParams& p, const Visibility& visible_at, double alibi_slope,
              const Rounder& round, const double* q_row, const std::vector<double>& k, int i,
              std::vector<double>& s, std::vector<double>& capped) {
  const MaskPolicy& mask = visible_at.mask;
  const int d = p.head_dim;
  int visible = 0;
  for (int j = 0; j < mask.seqlen_k; ++j) {
    if (!visible_at(i, j)) {
      s[j] = kNegInf;
      continue;
    }
    double x = round(round(dot(q_row, &k[static_cast<size_t>(j) * d], d)) * p.scale);
    if (p.softcap > 0) x = round(p.softcap * std::tanh(x / p.softcap));
    capped[j] = x;
    if (p.has_alibi()) x = round(x - alibi_slope * std::abs(i + mask.seqlen_k - mask.seqlen_q - j));
    s[j] = x;
    ++visible;
  }
  return visible;
}

// p_j = exp(s_j - lse), with lse = log(exp(sink) + sum_j exp(s_j)) (sink =
// -inf when there is none); returns lse (-inf for a row with no key and no
// sink, or only -inf scores). A NaN score makes the max, lse and every p_j NaN
// (std::max would drop it).
double softmax_row(const std::vector<double>& s, int n, double sink, std::vector<double>& prob) {
  double m = sink;
  for (int j = 0; j < n; ++j) m = (s[j] > m || std::isnan(s[j])) ? s[j] : m;
  if (m == kNegInf) {
    std::fill(prob.begin(), prob.begin() + n, 0.0);
    return kNegInf;
  }
  double sum = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (int j = 0; j < n; ++j) sum += s[j] == kNegInf ? 0.0 : std::exp(s[j] - m);
  const double lse = m + std::log(sum);
  for (int j = 0; j < n; ++j) prob[j] = s[j] == kNegInf ? 0.0 : std::exp(s[j] - lse);
  return lse;
}

double sink_of(const AttentionParams& p, int h) {
  return p.has_sinks() ? static_cast<double>(p.sinks[h]) : kNegInf;
}

// The dropout factor z_ij of (sequence b, head h): 1/(1-p8) kept, 0 dropped,
// 1 without dropout, p8 = p rounded to 8 bits. The keep bits are the
// library's (attention/dropout.h: the RNG is part of the definition; keep()
// reads the byte straight from the Philox output, not the kernels' fragment
// path); what is done with them is written out here.
double dropout_factor(const AttentionParams& p, int b, int h, int i, int j) {
  if (!p.has_dropout()) return 1.0;
  return p.dropout.keep(b * p.heads_q + h, i, j) ? 1.0 / (1.0 - p.dropout.rounded_p()) : 0.0;
}

double slope_of(const AttentionParams& p, int b, int h) {
  return p.has_alibi() ? static_cast<double>(p.alibi_slope(b, h)) : 0.0;
}

}  // namespace

double default_atol(fa_dtype dtype) {
  switch (dtype) {
    case FA_BF16: return 1e-3;
    case FA_F16: return 2e-4;
    default: return 2e-5;
  }
}

namespace {

// Rows i = 0, row_stride, ... of one (sequence, query head h): q (seqlen_q x d),
// k and v (seqlen_k x d) in double; output row i goes to canonical row first_row + i.
void attend_head(const AttentionParams& p, const MaskPolicy& mask, const Rounder& round,
                 const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, int b, int64_t first_row, int h, int row_stride,
                 ForwardResult& r) {
  const int d = p.head_dim;
  std::vector<double> s(mask.seqlen_k), capped(mask.seqlen_k), prob(mask.seqlen_k);
  const double sink = sink_of(p, h), slope = slope_of(p, b, h);
  const Visibility visible = visibility_of(p, mask, b, h);
  for (int i = 0; i < mask.seqlen_q; i += row_stride) {
    const int64_t row = first_row + i;
    score_row(p, visible, slope, round, &q[static_cast<size_t>(i) * d], k, i, s, capped);
    const double lse = softmax_row(s, mask.seqlen_k, sink, prob);
    if (lse == kNegInf) continue;  // no visible key (or only -inf scores) and no sink: out 0
    r.lse[static_cast<size_t>(h) * p.total_q + row] = lse;
    double* o = &r.out[(static_cast<size_t>(row) * p.heads_q + h) * d];
    // Every visible key enters, even at weight 0 (0 x NaN = NaN); masked keys never do.
    for (int j = 0; j < mask.seqlen_k; ++j) {
      if (!visible(i, j)) continue;
      const double pj = round(round(prob[j]) * dropout_factor(p, b, h, i, j));
      for (int c = 0; c < d; ++c) o[c] += pj * v[static_cast<size_t>(j) * d + c];
    }
    for (int c = 0; c < d; ++c) o[c] = round(o[c]);
  }
}

ForwardResult empty_result(const AttentionParams& p) {
  ForwardResult r;
  r.out.assign(static_cast<size_t>(p.total_q) * p.heads_q * p.head_dim, 0.0);
  r.lse.assign(static_cast<size_t>(p.total_q) * p.heads_q, kNegInf);
  return r;
}

}  // namespace

ForwardResult forward(const AttentionParams& p, Precision precision, int row_stride) {
  const Rounder round{p.dtype, precision == Precision::kFloat64};
  ForwardResult r = empty_result(p);
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_q, p.num_threads, [&](int64_t item, int) {
    const int b = static_cast<int>(item / p.heads_q), h = static_cast<int>(item % p.heads_q);
    const int hk = h / p.group_size();
    const SequenceInfo seq = sequence_info(p, b);
    const auto q = load_rows(p.q, p.dtype, p, b, seq.row_q, seq.seqlen_q, h, p.q_batch_stride,
                             p.q_row_stride, p.q_head_stride);
    const auto k = load_rows(p.k, p.dtype, p, b, seq.row_k, seq.seqlen_k, hk, p.k_batch_stride,
                             p.k_row_stride, p.k_head_stride);
    const auto v = load_rows(p.v, p.dtype, p, b, seq.row_k, seq.seqlen_k, hk, p.v_batch_stride,
                             p.v_row_stride, p.v_head_stride);
    attend_head(p, mask_for(p, seq), round, q, k, v, b, seq.row_q, h, row_stride, r);
  });
  return r;
}

namespace {

// x rotated (in double) at `position` with the call's tables; rounded as stored.
void rotate_row(const KvCacheParams& kp, const Rounder& round, int position, double* x) {
  const fa_dtype t = kp.attn.dtype;
  const int64_t cos_row = position * kp.cos_row_stride, sin_row = position * kp.sin_row_stride;
  rotate(x, kp.rotary_dim, kp.rotary_interleaved,
         [&](int i) { return static_cast<double>(load_as_float(kp.rotary_cos, cos_row + i, t)); },
         [&](int i) { return static_cast<double>(load_as_float(kp.rotary_sin, sin_row + i, t)); });
  for (int c = 0; c < kp.attn.head_dim; ++c) x[c] = round(x[c]);
}

// New keys (rotated) and values of every sequence, [batch][seqlen_new][heads_kv][d].
void appended_rows(const KvCacheParams& kp, const Rounder& round, KvCacheResult& r) {
  const AttentionParams& p = kp.attn;
  const int d = p.head_dim;
  const size_t n = static_cast<size_t>(p.batch) * kp.seqlen_new * p.heads_kv * d;
  r.k_appended.assign(n, 0.0);
  r.v_appended.assign(n, 0.0);
  for (int b = 0; b < p.batch; ++b) {
    for (int i = 0; i < kp.seqlen_new; ++i) {
      for (int hk = 0; hk < p.heads_kv; ++hk) {
        const size_t at = ((static_cast<size_t>(b) * kp.seqlen_new + i) * p.heads_kv + hk) * d;
        const int64_t kn = b * kp.kn_batch_stride + i * kp.kn_row_stride + hk * kp.kn_head_stride;
        const int64_t vn = b * kp.vn_batch_stride + i * kp.vn_row_stride + hk * kp.vn_head_stride;
        for (int c = 0; c < d; ++c) {
          r.k_appended[at + c] = load_as_float(kp.k_new, kn + c, p.dtype);
          r.v_appended[at + c] = load_as_float(kp.v_new, vn + c, p.dtype);
        }
        if (kp.has_rotary()) rotate_row(kp, round, kp.cached_tokens(b) + i, &r.k_appended[at]);
      }
    }
  }
}

// Keys (or values) of sequence b, head hk: the cache's rows, then the appended ones.
std::vector<double> sequence_keys(const KvCacheParams& kp, int b, int hk, bool values,
                                  const std::vector<double>& appended) {
  const AttentionParams& p = kp.attn;
  const int d = p.head_dim, cached = kp.cached_tokens(b);
  std::vector<double> rows(static_cast<size_t>(kp.keys(b)) * d);
  for (int j = 0; j < cached; ++j) {
    const int64_t off = values ? v_cache_offset(kp, b, j, hk) : k_cache_offset(kp, b, j, hk);
    for (int c = 0; c < d; ++c) {
      rows[static_cast<size_t>(j) * d + c] = load_as_float(values ? p.v : p.k, off + c, p.dtype);
    }
  }
  for (int i = 0; i < kp.seqlen_new; ++i) {
    const size_t at = ((static_cast<size_t>(b) * kp.seqlen_new + i) * p.heads_kv + hk) * d;
    std::copy(&appended[at], &appended[at] + d, &rows[static_cast<size_t>(cached + i) * d]);
  }
  return rows;
}

}  // namespace

KvCacheResult forward_kvcache(const KvCacheParams& kp, Precision precision) {
  const AttentionParams& p = kp.attn;
  const Rounder round{p.dtype, precision == Precision::kFloat64};
  KvCacheResult r;
  r.attention = empty_result(p);
  appended_rows(kp, round, r);
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_q, p.num_threads, [&](int64_t item, int) {
    const int b = static_cast<int>(item / p.heads_q), h = static_cast<int>(item % p.heads_q);
    const int hk = h / p.group_size(), d = p.head_dim;
    auto q = load_rows(p.q, p.dtype, p, b, 0, p.seqlen_q, h, p.q_batch_stride, p.q_row_stride,
                       p.q_head_stride);
    if (kp.has_rotary()) {
      for (int i = 0; i < p.seqlen_q; ++i) {
        rotate_row(kp, round, kp.query_position(b, i), &q[static_cast<size_t>(i) * d]);
      }
    }
    const auto k = sequence_keys(kp, b, hk, false, r.k_appended);
    const auto v = sequence_keys(kp, b, hk, true, r.v_appended);
    attend_head(p, kp.mask(b), round, q, k, v, b, int64_t{b} * p.seqlen_q, h, 1, r.attention);
  });
  return r;
}

BackwardResult backward(const AttentionParams& p, Precision precision) {
  const Rounder round{p.dtype, precision == Precision::kFloat64};
  const int d = p.head_dim;
  BackwardResult r;
  r.dq.assign(static_cast<size_t>(p.total_q) * p.heads_q * d, 0.0);
  r.dk.assign(static_cast<size_t>(p.total_k) * p.heads_kv * d, 0.0);
  r.dv.assign(static_cast<size_t>(p.total_k) * p.heads_kv * d, 0.0);
  // dL/dsink per (sequence, head), summed over sequences at the end.
  std::vector<double> dsink_parts(static_cast<size_t>(p.batch) * p.heads_q, 0.0);
  // One item per (sequence, kv head): the query heads of a group add into the
  // same dk/dv rows, so they stay in one thread.
  parallel_for(static_cast<int64_t>(p.batch) * p.heads_kv, p.num_threads, [&](int64_t item, int) {
    const int b = static_cast<int>(item / p.heads_kv), hk = static_cast<int>(item % p.heads_kv);
    const SequenceInfo seq = sequence_info(p, b);
    const MaskPolicy mask = mask_for(p, seq);
    const int sk = seq.seqlen_k;
    const auto k = load_rows(p.k, p.dtype, p, b, seq.row_k, sk, hk, p.k_batch_stride,
                             p.k_row_stride, p.k_head_stride);
    const auto v = load_rows(p.v, p.dtype, p, b, seq.row_k, sk, hk, p.v_batch_stride,
                             p.v_row_stride, p.v_head_stride);
    std::vector<double> dk(static_cast<size_t>(sk) * d, 0.0), dv(static_cast<size_t>(sk) * d, 0.0);
    std::vector<double> s(sk), capped(sk), prob(sk), dp(sk);
    for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
      const double sink = sink_of(p, h), slope = slope_of(p, b, h);
      const Visibility visible = visibility_of(p, mask, b, h);
      const auto q = load_rows(p.q, p.dtype, p, b, seq.row_q, seq.seqlen_q, h, p.q_batch_stride,
                               p.q_row_stride, p.q_head_stride);
      const auto dout = load_rows(p.dout, p.dtype, p, b, seq.row_q, seq.seqlen_q, h,
                                  p.do_batch_stride, p.do_row_stride, p.do_head_stride);
      for (int i = 0; i < seq.seqlen_q; ++i) {
        const double* qi = &q[static_cast<size_t>(i) * d];
        const double* doi = &dout[static_cast<size_t>(i) * d];
        if (score_row(p, visible, slope, round, qi, k, i, s, capped) == 0) continue;  // no key: zero gradients
        const double lse = softmax_row(s, sk, sink, prob);
        if (lse == kNegInf) continue;  // only -inf scores and no sink: likewise
        // dP = dO V^T, through dropout z dP; D = rowsum(P * z * dP) (= rowsum(dO * O)),
        // over visible keys only (every one enters, even at weight 0: 0 x NaN = NaN)
        double row_d = 0;
        for (int j = 0; j < sk; ++j) {
          if (!visible(i, j)) continue;
          prob[j] = round(prob[j]);
          dp[j] = round(dot(doi, &v[static_cast<size_t>(j) * d], d) * dropout_factor(p, b, h, i, j));
          row_d += prob[j] * dp[j];
        }
        // The sink's probability exp(sink - lse); d lse / d sink = P_sink, so
        // dL/dsink = sum_j dL/dP_j dP_j/dsink = -P_sink sum_j P_j dP_j = -P_sink D.
        if (p.has_sinks()) {
          dsink_parts[static_cast<size_t>(b) * p.heads_q + h] -= std::exp(sink - lse) * row_d;
        }
        double* dqi = &r.dq[(static_cast<size_t>(seq.row_q + i) * p.heads_q + h) * d];
        for (int j = 0; j < sk; ++j) {
          if (!visible(i, j)) continue;
          // dS = P * (dP - D); through softcap: d/du [c tanh(u/c)] = 1 - (s/c)^2; then scale.
          double ds = round(prob[j] * (dp[j] - row_d));
          if (p.softcap > 0) {
            const double t = capped[j] / p.softcap;
            ds = round(ds * (1.0 - t * t));
          }
          ds = round(ds * p.scale);
          const double* kj = &k[static_cast<size_t>(j) * d];
          const double dropped_prob = round(prob[j] * dropout_factor(p, b, h, i, j));
          for (int c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            dk[static_cast<size_t>(j) * d + c] += ds * qi[c];
            dv[static_cast<size_t>(j) * d + c] += dropped_prob * doi[c];
          }
        }
        for (int c = 0; c < d; ++c) dqi[c] = round(dqi[c]);
      }
    }
    for (int j = 0; j < sk; ++j) {
      double* dkj = &r.dk[(static_cast<size_t>(seq.row_k + j) * p.heads_kv + hk) * d];
      double* dvj = &r.dv[(static_cast<size_t>(seq.row_k + j) * p.heads_kv + hk) * d];
      for (int c = 0; c < d; ++c) {
        dkj[c] = round(dk[static_cast<size_t>(j) * d + c]);
        dvj[c] = round(dv[static_cast<size_t>(j) * d + c]);
      }
    }
  });
  if (p.has_sinks()) {
    r.dsinks.assign(static_cast<size_t>(p.heads_q), 0.0);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads_q; ++h) r.dsinks[h] += dsink_parts[static_cast<size_t>(b) * p.heads_q + h];
  }
  return r;
}

}  // namespace flashattn::reference
