#include "common/harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <algorithm>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "core/extras.h"
#include "core/validate.h"

namespace flashattn::testing {
namespace {

// A tensor of `rows` rows (4-D (batch, seqlen, heads, dim) or 3-D (total, heads, dim)),
// contiguous except for row_pad extra elements per row.
HostTensor make_rows_tensor(const Case& c, fa_dtype dtype, int batch, int seqlen, int64_t total,
                            int heads, int dim) {
  HostTensor t;
  const int64_t row_stride = static_cast<int64_t>(heads) * dim + c.row_pad;
  t.desc.dtype = dtype;
  t.desc.device = FA_DEVICE_CPU;
  if (c.is_varlen()) {
    t.desc.ndim = 3;
    const int64_t shape[] = {total, heads, dim};
    const int64_t strides[] = {row_stride, dim, 1};
    std::memcpy(t.desc.shape, shape, sizeof shape);
    std::memcpy(t.desc.strides, strides, sizeof strides);
  } else {
    t.desc.ndim = 4;
    const int64_t shape[] = {batch, seqlen, heads, dim};
    const int64_t strides[] = {seqlen * row_stride, row_stride, dim, 1};
    std::memcpy(t.desc.shape, shape, sizeof shape);
    std::memcpy(t.desc.strides, strides, sizeof strides);
  }
  t.bytes.assign(static_cast<size_t>(total * row_stride) * dtype_size(dtype), 0);
  t.rebind();
  return t;
}

void fill(HostTensor& t, std::mt19937_64& rng, double scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = static_cast<int64_t>(t.bytes.size() / dtype_size(t.desc.dtype));
  for (int64_t i = 0; i < n; ++i) store_from_float(t.bytes.data(), i, t.desc.dtype, normal(rng) * scale);
}

void poison(HostTensor& t) {
  const int64_t n = static_cast<int64_t>(t.bytes.size() / dtype_size(t.desc.dtype));
  for (int64_t i = 0; i < n; ++i) {
    store_from_float(t.bytes.data(), i, t.desc.dtype, std::numeric_limits<float>::quiet_NaN());
  }
}

int64_t tensor_offset_of_row(const fa_tensor& d, int64_t row, int head) {
  if (d.ndim == 3) return row * d.strides[0] + head * d.strides[1];
  const int64_t b = row / d.shape[1], r = row % d.shape[1];
  return b * d.strides[0] + r * d.strides[1] + head * d.strides[2];
}

// One element into a comparison. With nan_exact a NaN must appear exactly
// where the fp64 reference has one (a mismatch counts in nan_count);
// otherwise any NaN counts. Infinities must match exactly.
void add_element(Comparison& c, double got, double exact, double naive, bool nan_exact) {
  if (nan_exact && (std::isnan(exact) || std::isnan(got))) {
    if (std::isnan(exact) != std::isnan(got)) ++c.nan_count;
  } else if (std::isnan(got)) {
    ++c.nan_count;
  } else if (std::isinf(exact) || std::isinf(got)) {
    if (got != exact) c.max_error = std::numeric_limits<double>::infinity();
  } else {
    c.max_error = std::max(c.max_error, std::abs(got - exact));
    c.baseline_error = std::max(c.baseline_error, std::abs(naive - exact));
  }
}

// An f32 tensor of shape (heads) or (batch, heads), contiguous.
HostTensor make_per_head(int batch, int heads, bool batched) {
  return batched ? make_host_tensor(FA_F32, {batch, heads}) : make_host_tensor(FA_F32, {heads});
}

void fill_uniform(HostTensor& t, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  float* x = reinterpret_cast<float*>(t.bytes.data());
  for (size_t i = 0; i < t.bytes.size() / sizeof(float); ++i) x[i] = u(rng);
}

// Random classes for c's block mask (Case::block_density).
BlockClasses random_block_classes(const Case& c, std::mt19937_64& rng) {
  BlockClasses bc(c.block_q, c.block_k, c.block_shared ? 1 : c.batch, c.block_shared ? 1 : c.heads_q, c.seqlen_q,
                  c.seqlen_k);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint8_t& x : bc.cls) {
    const bool listed = u(rng) < c.block_density;  // density 1 lists every pair, 0 none
    x = listed ? (u(rng) < 0.5 ? 2 : 1) : 0;
  }
  return bc;
}

// An int32 (batch, heads, q_blocks[, capacity]) host tensor of the lists.
HostTensor make_list_tensor(const BlockClasses& bc, int capacity) {
  return capacity < 0 ? make_host_tensor(FA_I32, {bc.batch, bc.heads, bc.q_blocks})
                      : make_host_tensor(FA_I32, {bc.batch, bc.heads, bc.q_blocks, capacity});
}

// Fills counts and indices with the blocks of class `kind`, shuffled; the
// slots past a count get values outside [0, k_blocks).
void fill_lists(const BlockClasses& bc, uint8_t kind, std::mt19937_64& rng, HostTensor& counts, HostTensor& indices) {
  int32_t* n = reinterpret_cast<int32_t*>(counts.bytes.data());
  int32_t* idx = reinterpret_cast<int32_t*>(indices.bytes.data());
  const int capacity = static_cast<int>(indices.desc.shape[3]);
  for (int64_t row = 0; row < int64_t{bc.batch} * bc.heads * bc.q_blocks; ++row) {
    std::vector<int32_t> listed;
    for (int kb = 0; kb < bc.k_blocks; ++kb)
      if (bc.cls[static_cast<size_t>(row) * bc.k_blocks + kb] == kind) listed.push_back(kb);
    std::shuffle(listed.begin(), listed.end(), rng);
    n[row] = static_cast<int32_t>(listed.size());
    for (int e = 0; e < capacity; ++e) {
      idx[row * capacity + e] = e < n[row] ? listed[e] : (e % 2 ? -1 - e : bc.k_blocks + e);
    }
  }
}

Comparison finish(Comparison c, double atol) {
  c.tolerance = 2.0 * c.baseline_error + atol;  // reference::tolerance with a chosen atol
  c.ok = c.nan_count == 0 && c.max_error <= c.tolerance;
  return c;
}

}  // namespace

std::string Case::name() const {
  std::ostringstream s;
  s << fa_dtype_name(dtype) << "_b" << batch << "_sq" << seqlen_q << "_sk" << seqlen_k << "_h"
    << heads_q << "x" << heads_kv << "_d" << head_dim;
  if (causal) s << "_causal";
  if (window_left >= 0 || window_right >= 0) s << "_win" << window_left << "_" << window_right;
  if (softcap > 0) s << "_softcap" << softcap;
  if (scale > 0) s << "_scale" << scale;
  if (is_varlen()) s << "_varlen";
  if (row_pad) s << "_pad" << row_pad;
  if (alibi != Alibi::kOff) s << (alibi == Alibi::kPerHead ? "_alibi" : "_alibib");
  if (sinks) s << "_sinks";
  if (dropout_p > 0) s << "_drop" << dropout_p;
  if (dropout_p > 0 && dropout_offset != Case{}.dropout_offset) s << "_off" << dropout_offset;
  if (block_q > 0) s << "_bs" << block_q << "x" << block_k << "_dens" << block_density << (block_shared ? "_shared" : "");
  s << "_s" << seed;
  // Test names allow only letters, digits and '_'.
  std::string name = s.str();
  for (char& ch : name) {
    if (ch == '-') ch = 'm';
    if (ch == '.') ch = 'p';
  }
  return name;
}

double read_row_element(const HostTensor& t, int64_t row, int head, int col) {
  return load_as_float(t.bytes.data(), tensor_offset_of_row(t.desc, row, head) + col, t.desc.dtype);
}

// NOTES: the coordinates are checked first: a plant outside the tensor once
// wrote past a test's K buffer into whatever the heap held next (in the GPU
// suite, now and then the CUDA driver's own state: docs/hardening.md).
void write_row_element(HostTensor& t, int64_t row, int head, int col, float value) {
  const fa_tensor& d = t.desc;
  int64_t rows = 1;
  for (int i = 0; i + 2 < d.ndim; ++i) rows *= d.shape[i];
  if (d.ndim < 3 || row < 0 || row >= rows || head < 0 || head >= d.shape[d.ndim - 2] || col < 0 ||
      col >= d.shape[d.ndim - 1]) {
    std::ostringstream msg;
    msg << "write_row_element: (row " << row << ", head " << head << ", col " << col << ") outside a tensor of "
        << rows << " rows";
    throw std::out_of_range(msg.str());
  }
  store_from_float(t.bytes.data(), tensor_offset_of_row(d, row, head) + col, d.dtype, value);
}

Problem make_problem(const Case& c_in) {
  Problem p;
  p.c = c_in;
  Case& c = p.c;
  if (c.is_varlen()) {
    c.batch = static_cast<int>(c.varlen_q.size());
    c.seqlen_q = c.varlen_q.empty() ? 0 : *std::max_element(c.varlen_q.begin(), c.varlen_q.end());
    c.seqlen_k = c.varlen_k.empty() ? 0 : *std::max_element(c.varlen_k.begin(), c.varlen_k.end());
    p.cu_seqlens_q.assign(1, 0);
    p.cu_seqlens_k.assign(1, 0);
    for (int n : c.varlen_q) p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + n);
    for (int n : c.varlen_k) p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + n);
  }
  const int64_t total_q = c.is_varlen() ? p.cu_seqlens_q.back() : int64_t{c.batch} * c.seqlen_q;
  const int64_t total_k = c.is_varlen() ? p.cu_seqlens_k.back() : int64_t{c.batch} * c.seqlen_k;
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 12345);
  p.q = make_rows_tensor(c, c.dtype, c.batch, c.seqlen_q, total_q, c.heads_q, c.head_dim);
  p.k = make_rows_tensor(c, c.dtype, c.batch, c.seqlen_k, total_k, c.heads_kv, c.head_dim);
  p.v = make_rows_tensor(c, c.dtype, c.batch, c.seqlen_k, total_k, c.heads_kv, c.head_dim);
  p.dout = make_rows_tensor(c, c.dtype, c.batch, c.seqlen_q, total_q, c.heads_q, c.head_dim);
  fill(p.q, rng, 1.0);
  fill(p.k, rng, 1.0);
  fill(p.v, rng, 1.0);
  fill(p.dout, rng, 1.0);
  if (c.alibi != Case::Alibi::kOff) {
    p.alibi_slopes = make_per_head(c.batch, c.heads_q, c.alibi == Case::Alibi::kPerBatchHead);
    fill_uniform(p.alibi_slopes, rng, 0.01f, 0.3f);
  }
  if (c.sinks) {
    p.sinks = make_per_head(c.batch, c.heads_q, false);
    fill(p.sinks, rng, 2.0);
  }
  if (c.block_q > 0) set_block_mask(p, random_block_classes(c, rng));
  p.varlen.cu_seqlens_q = p.cu_seqlens_q.data();
  p.varlen.cu_seqlens_k = p.cu_seqlens_k.data();
  p.varlen.batch = c.batch;
  p.varlen.max_seqlen_q = c.seqlen_q;
  p.varlen.max_seqlen_k = c.seqlen_k;
  p.options = fa_default_options();
  p.options.softmax_scale = c.scale;
  p.options.causal = c.causal;
  p.options.window_left = c.window_left;
  p.options.window_right = c.window_right;
  p.options.softcap = c.softcap;
  return p;
}

fa_extras Problem::extras() const {
  fa_extras e = fa_default_extras();
  if (c.alibi != Case::Alibi::kOff) e.alibi_slopes = &alibi_slopes.desc;
  if (c.sinks) e.sinks = &sinks.desc;
  e.dropout_p = c.dropout_p;
  e.dropout_seed = c.seed * 0x9e3779b97f4a7c15ull;  // both key words vary with the case
  e.dropout_offset = c.dropout_offset;
  if (use_block_mask) {
    block_mask.kv_num_blocks = &kv_num_blocks.desc;
    block_mask.kv_indices = &kv_indices.desc;
    block_mask.full_kv_num_blocks = &full_kv_num_blocks.desc;
    block_mask.full_kv_indices = &full_kv_indices.desc;
    e.block_mask = &block_mask;
  }
  return e;
}

HostTensor Problem::poisoned_dsinks() const {
  HostTensor t = make_per_head(c.batch, c.heads_q, false);
  poison(t);
  return t;
}

HostTensor Problem::poisoned_like_q() const {
  HostTensor t = q;
  t.rebind();
  poison(t);
  return t;
}

HostTensor Problem::poisoned_like_k() const {
  HostTensor t = k;
  t.rebind();
  poison(t);
  return t;
}

HostTensor Problem::poisoned_lse() const {
  HostTensor t;
  t.desc.dtype = FA_F32;
  t.desc.device = FA_DEVICE_CPU;
  if (c.is_varlen()) {
    const int64_t total = cu_seqlens_q.back();
    t.desc.ndim = 2;
    t.desc.shape[0] = c.heads_q;
    t.desc.shape[1] = total;
    t.desc.strides[0] = total;
    t.desc.strides[1] = 1;
    t.bytes.resize(static_cast<size_t>(c.heads_q * total) * 4);
  } else {
    t.desc.ndim = 3;
    t.desc.shape[0] = c.batch;
    t.desc.shape[1] = c.heads_q;
    t.desc.shape[2] = c.seqlen_q;
    t.desc.strides[0] = int64_t{c.heads_q} * c.seqlen_q;
    t.desc.strides[1] = c.seqlen_q;
    t.desc.strides[2] = 1;
    t.bytes.resize(static_cast<size_t>(int64_t{c.batch} * c.heads_q * c.seqlen_q) * 4);
  }
  t.rebind();
  poison(t);
  return t;
}

AttentionParams Problem::host_params() const {
  // Built by the library's own validation, so the reference sees exactly the
  // normalized options (default scale, causal as window) that backends see.
  fa_options o = options;
  o.backend = FA_BACKEND_CPU;
  AttentionParams params;
  if (make_shape_params(&q.desc, &k.desc, &v.desc, varlen_ptr(), &o, &params) != FA_OK) {
    throw std::runtime_error(std::string("invalid test case: ") + last_error());
  }
  const fa_extras e = extras();
  if (apply_extras(&e, q.desc, Pass::kForward, &params) != FA_OK) {
    throw std::runtime_error(std::string("invalid test extras: ") + last_error());
  }
  params.dout = dout.desc.data;  // laid out exactly like q
  params.do_batch_stride = params.q_batch_stride;
  params.do_row_stride = params.q_row_stride;
  params.do_head_stride = params.q_head_stride;
  return params;
}

Expected expected_forward(const Problem& p) {
  const AttentionParams params = p.host_params();
  Expected e;
  e.exact = reference::forward(params, reference::Precision::kFloat64);
  e.naive = reference::forward(params, reference::Precision::kInput);
  return e;
}

Expected expected_all(const Problem& p) {
  Expected e = expected_forward(p);
  const AttentionParams params = p.host_params();
  e.exact_grad = reference::backward(params, reference::Precision::kFloat64);
  e.naive_grad = reference::backward(params, reference::Precision::kInput);
  return e;
}

double default_atol(fa_dtype dtype) { return reference::default_atol(dtype); }

std::string Comparison::describe(const char* what) const {
  std::ostringstream s;
  s << what << ": max error " << max_error << " vs tolerance " << tolerance
    << " (naive-in-dtype error " << baseline_error << ")";
  if (nan_count) s << ", " << nan_count << " NaN";
  return s.str();
}

Comparison compare_rows(const HostTensor& got, const std::vector<double>& exact,
                        const std::vector<double>& naive, double atol, bool nan_exact) {
  const fa_tensor& d = got.desc;
  const int heads = static_cast<int>(d.shape[d.ndim - 2]);
  const int dim = static_cast<int>(d.shape[d.ndim - 1]);
  const int64_t rows = d.ndim == 3 ? d.shape[0] : d.shape[0] * d.shape[1];
  Comparison c;
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int col = 0; col < dim; ++col) {
        const size_t i = (static_cast<size_t>(r) * heads + h) * dim + col;
        add_element(c, read_row_element(got, r, h, col), exact[i], naive[i], nan_exact);
      }
    }
  }
  return finish(c, atol);
}

std::vector<std::pair<const char*, Comparison>> compare_gradients(const HostTensor& dq, const HostTensor& dk,
                                                                  const HostTensor& dv, const Expected& e,
                                                                  double atol) {
  return {{"dq", compare_rows(dq, e.exact_grad.dq, e.naive_grad.dq, atol)},
          {"dk", compare_rows(dk, e.exact_grad.dk, e.naive_grad.dk, atol)},
          {"dv", compare_rows(dv, e.exact_grad.dv, e.naive_grad.dv, atol)}};
}

Comparison compare_lse(const HostTensor& got, const std::vector<double>& exact,
                       const std::vector<double>& naive, double atol, bool nan_exact) {
  const fa_tensor& d = got.desc;
  Comparison c;
  const int heads = static_cast<int>(d.ndim == 2 ? d.shape[0] : d.shape[1]);
  const int64_t total = static_cast<int64_t>(exact.size()) / std::max(heads, 1);
  for (int h = 0; h < heads; ++h) {
    for (int64_t row = 0; row < total; ++row) {
      int64_t off;
      if (d.ndim == 2) {
        off = h * d.strides[0] + row * d.strides[1];
      } else {
        const int64_t b = row / d.shape[2], r = row % d.shape[2];
        off = b * d.strides[0] + h * d.strides[1] + r * d.strides[2];
      }
      const size_t i = static_cast<size_t>(h) * total + row;
      add_element(c, static_cast<const float*>(got.desc.data)[off], exact[i], naive[i], nan_exact);
    }
  }
  return finish(c, atol);
}

void expect_gradients_match(const Problem& p, const HostTensor& dq, const HostTensor& dk,
                            const HostTensor& dv, bool nan_exact) {
  const Expected e = expected_all(p);
  const double atol = default_atol(p.c.dtype);
  for (auto [got, exact, naive, name] :
       {std::tuple{&dq, &e.exact_grad.dq, &e.naive_grad.dq, "dq"},
        std::tuple{&dk, &e.exact_grad.dk, &e.naive_grad.dk, "dk"},
        std::tuple{&dv, &e.exact_grad.dv, &e.naive_grad.dv, "dv"}}) {
    const Comparison c = compare_rows(*got, *exact, *naive, atol, nan_exact);
    EXPECT_TRUE(c.ok) << c.describe(name);
  }
}

BlockClasses::BlockClasses(int bq, int bk, int b, int h, int seqlen_q, int seqlen_k)
    : block_q(bq), block_k(bk), batch(b), heads(h), q_blocks((seqlen_q + bq - 1) / bq),
      k_blocks((seqlen_k + bk - 1) / bk),
      cls(static_cast<size_t>(b) * h * q_blocks * k_blocks, 0) {}

void set_block_mask(Problem& p, const BlockClasses& bc) {
  std::mt19937_64 rng(p.c.seed * 31 + 17);
  p.kv_num_blocks = make_list_tensor(bc, -1);
  p.kv_indices = make_list_tensor(bc, bc.k_blocks + 2);
  p.full_kv_num_blocks = make_list_tensor(bc, -1);
  p.full_kv_indices = make_list_tensor(bc, bc.k_blocks);
  fill_lists(bc, 1, rng, p.kv_num_blocks, p.kv_indices);
  fill_lists(bc, 2, rng, p.full_kv_num_blocks, p.full_kv_indices);
  p.block_mask = fa_block_mask{};
  p.block_mask.block_q = bc.block_q;
  p.block_mask.block_k = bc.block_k;
  p.use_block_mask = true;
}

HostTensor make_host_tensor(fa_dtype dtype, const std::vector<int64_t>& shape) {
  HostTensor t;
  t.desc.dtype = dtype;
  t.desc.device = FA_DEVICE_CPU;
  t.desc.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.desc.ndim - 1; i >= 0; --i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = stride;
    stride *= shape[i];
  }
  t.bytes.assign(static_cast<size_t>(stride) * dtype_size(dtype), 0);
  t.rebind();
  return t;
}

}  // namespace flashattn::testing
