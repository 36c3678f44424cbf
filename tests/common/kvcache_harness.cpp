#include "common/kvcache_harness.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/dtype.h"
#include "core/error.h"
#include "core/extras.h"
#include "core/validate.h"

namespace flashattn::testing {
namespace {

constexpr int kCapacitySlack = 3;   // spare slots past the longest sequence (odd on purpose)
constexpr int kSparePages = 2;      // pages in the pool no sequence owns
constexpr int kSpareCacheRows = 2;  // cache rows no sequence owns (cache_batch_idx cases)
constexpr double kRotaryBase = 10000.0;

int64_t elements(const HostTensor& t) { return static_cast<int64_t>(t.bytes.size() / dtype_size(t.desc.dtype)); }

void fill_normal(HostTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < elements(t); ++i) store_from_float(t.bytes.data(), i, t.desc.dtype, normal(rng));
}

void fill_nan(HostTensor& t) {
  for (int64_t i = 0; i < elements(t); ++i) {
    store_from_float(t.bytes.data(), i, t.desc.dtype, std::numeric_limits<float>::quiet_NaN());
  }
}

// cos/sin of angle position * base^(-2i / rotary_dim), as in RoPE.
void fill_rotary(KvProblem& p, int seqlen_ro) {
  const int half = p.c.rotary_dim / 2;
  p.cos = make_host_tensor(p.c.dtype, {seqlen_ro, half});
  p.sin = make_host_tensor(p.c.dtype, {seqlen_ro, half});
  for (int t = 0; t < seqlen_ro; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = t * std::pow(kRotaryBase, -2.0 * i / p.c.rotary_dim);
      store_from_float(p.cos.bytes.data(), int64_t{t} * half + i, p.c.dtype, static_cast<float>(std::cos(angle)));
      store_from_float(p.sin.bytes.data(), int64_t{t} * half + i, p.c.dtype, static_cast<float>(std::sin(angle)));
    }
  }
}

// Every sequence owns max_blocks distinct pages of a shuffled pool.
void make_block_table(KvProblem& p, int capacity, std::mt19937_64& rng) {
  const int batch = p.c.batch();
  p.max_blocks = (capacity + p.c.page_size - 1) / p.c.page_size;
  const int pages = batch * p.max_blocks + kSparePages;
  std::vector<int32_t> pool(pages);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.block_table.assign(pool.begin(), pool.begin() + int64_t{batch} * p.max_blocks);
}

// Which appended token (b, i, hk) a cache element offset belongs to, computed
// from the problem's own tables (not the library's addressing), so a wrong
// page or row mapping in the library shows up as a misplaced write.
using SlotMap = std::map<int64_t, std::array<int, 3>>;
SlotMap appended_slots(const KvProblem& p) {
  SlotMap slots;
  const int64_t slots_per_row = p.k_cache.desc.shape[1], head_elems = p.c.head_dim;
  for (int b = 0; b < p.c.batch(); ++b)
    for (int i = 0; i < p.c.seqlen_new; ++i) {
      const int pos = (p.c.one_length ? p.c.cached[0] : p.c.cached[b]) + i;
      int64_t row = b, slot = pos;
      if (p.c.page_size > 0) {
        row = p.block_table[static_cast<size_t>(b) * p.max_blocks + pos / p.c.page_size];
        slot = pos % p.c.page_size;
      } else if (p.c.batch_idx) {
        row = p.cache_batch_idx[b];
      }
      for (int hk = 0; hk < p.c.heads_kv; ++hk) {
        slots[((row * slots_per_row + slot) * p.c.heads_kv + hk) * head_elems] = {b, i, hk};
      }
    }
  return slots;
}

// The cache after the call: appended slots within tolerance of the reference
// (exact for values, which are copied), every other element bit-identical.
::testing::AssertionResult cache_matches(const KvProblem& p, const HostTensor& before,
                                         const HostTensor& after, bool values,
                                         const KvExpected& e) {
  const SlotMap slots = appended_slots(p);
  const int d = p.c.head_dim, heads = p.c.heads_kv;
  const std::vector<double>& exact = values ? e.exact.v_appended : e.exact.k_appended;
  const std::vector<double>& naive = values ? e.naive.v_appended : e.naive.k_appended;
  const size_t esize = dtype_size(p.c.dtype);
  const int64_t row_elems = int64_t{heads} * d;
  Comparison cmp;
  const int64_t rows = elements(before) / row_elems;
  for (int64_t r = 0; r < rows; ++r) {
    for (int hk = 0; hk < heads; ++hk) {
      const int64_t off = r * row_elems + int64_t{hk} * d;
      const auto slot = slots.find(off);
      if (slot == slots.end()) {
        if (std::memcmp(&before.bytes[off * esize], &after.bytes[off * esize], d * esize) != 0) {
          return ::testing::AssertionFailure() << (values ? "v" : "k") << "_cache element at offset "
                                               << off << " changed but is no appended slot";
        }
        continue;
      }
      const auto [b, i, h] = slot->second;
      const size_t at = ((static_cast<size_t>(b) * p.c.seqlen_new + i) * heads + h) * d;
      for (int c = 0; c < d; ++c) {
        const double g = load_as_float(after.bytes.data(), off + c, p.c.dtype);
        if (std::isnan(g)) ++cmp.nan_count;
        cmp.max_error = std::max(cmp.max_error, std::abs(g - exact[at + c]));
        cmp.baseline_error = std::max(cmp.baseline_error, std::abs(naive[at + c] - exact[at + c]));
      }
    }
  }
  // Values are copied: no error at all. Keys may round once more after rotation.
  const double tolerance = values ? 0.0 : 2.0 * cmp.baseline_error + default_atol(p.c.dtype);
  if (cmp.nan_count > 0 || cmp.max_error > tolerance) {
    return ::testing::AssertionFailure() << (values ? "v" : "k") << "_cache appended rows: max error "
                                         << cmp.max_error << " vs tolerance " << tolerance << ", "
                                         << cmp.nan_count << " NaN";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

std::string KvCase::name() const {
  std::ostringstream s;
  s << fa_dtype_name(dtype) << "_b" << batch() << "_sq" << seqlen_q << "_kv";
  for (size_t i = 0; i < cached.size() && i < 3; ++i) s << (i ? "x" : "") << cached[i];
  if (cached.size() > 3) s << "x_";
  if (one_length) s << "_one";
  s << "_new" << seqlen_new << "_h" << heads_q << "x" << heads_kv << "_d" << head_dim;
  if (page_size) s << "_page" << page_size;
  if (batch_idx) s << "_bidx";
  if (rotary_dim) s << "_rot" << rotary_dim << (interleaved ? "i" : "n");
  if (causal) s << "_causal";
  if (window_left >= 0 || window_right >= 0) s << "_win" << window_left << "_" << window_right;
  if (softcap > 0) s << "_softcap";
  if (softmax_scale > 0) s << "_scale";
  if (num_splits) s << "_split" << num_splits;
  if (alibi) s << (slopes_per_head ? "_alibiH" : "_alibi");
  if (sinks) s << "_sinks";
  s << "_s" << seed;
  std::string name = s.str();
  for (char& ch : name) {
    if (ch == '-') ch = 'm';
  }
  return name;
}

KvProblem make_kv_problem(const KvCase& c) {
  KvProblem p;
  p.c = c;
  const int batch = c.batch();
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 777);
  const int longest = batch ? *std::max_element(c.cached.begin(), c.cached.end()) : 0;
  const int capacity = longest + c.seqlen_new + kCapacitySlack;
  p.q = make_host_tensor(c.dtype, {batch, c.seqlen_q, c.heads_q, c.head_dim});
  int64_t cache_rows = batch, slots = capacity;
  if (c.page_size > 0) {
    make_block_table(p, capacity, rng);
    cache_rows = int64_t{batch} * p.max_blocks + kSparePages;
    slots = c.page_size;
  } else if (c.batch_idx) {
    cache_rows = batch + kSpareCacheRows;
    std::vector<int32_t> rows(cache_rows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    p.cache_batch_idx.assign(rows.begin(), rows.begin() + batch);
  }
  p.k_cache = make_host_tensor(c.dtype, {cache_rows, slots, c.heads_kv, c.head_dim});
  p.v_cache = make_host_tensor(c.dtype, {cache_rows, slots, c.heads_kv, c.head_dim});
  for (HostTensor* t : {&p.q, &p.k_cache, &p.v_cache}) fill_normal(*t, rng);
  if (c.seqlen_new > 0) {
    p.k_new = make_host_tensor(c.dtype, {batch, c.seqlen_new, c.heads_kv, c.head_dim});
    p.v_new = make_host_tensor(c.dtype, {batch, c.seqlen_new, c.heads_kv, c.head_dim});
    fill_normal(p.k_new, rng);
    fill_normal(p.v_new, rng);
  }
  if (c.rotary_dim > 0) fill_rotary(p, capacity + c.seqlen_q);
  if (c.alibi) {
    // Slopes of either sign up to ~0.1 (ALiBi's are 2^-8 .. 2^-1): over a
    // few thousand keys the bias spans hundreds of logits.
    const int64_t rows = c.slopes_per_head ? 1 : batch;
    p.slopes = c.slopes_per_head ? make_host_tensor(FA_F32, {c.heads_q}) : make_host_tensor(FA_F32, {batch, c.heads_q});
    fill_normal(p.slopes, rng);
    float* slope = reinterpret_cast<float*>(p.slopes.bytes.data());
    for (int64_t i = 0; i < rows * c.heads_q; ++i) slope[i] *= 0.05f;
  }
  if (c.sinks) {
    p.sinks = make_host_tensor(FA_F32, {c.heads_q});
    fill_normal(p.sinks, rng);
  }
  p.cache_seqlens.assign(c.cached.begin(), c.cached.end());
  p.options = fa_default_options();
  p.options.causal = c.causal;
  p.options.window_left = c.window_left;
  p.options.window_right = c.window_right;
  p.options.softcap = c.softcap;
  p.options.softmax_scale = c.softmax_scale;
  return p;
}

fa_kvcache KvProblem::describe(fa_tensor* kc, fa_tensor* vc, const fa_tensor* kn,
                               const fa_tensor* vn, const fa_tensor* cs, const fa_tensor* sn,
                               const int32_t* table, const int32_t* lens,
                               const int32_t* rows) const {
  fa_kvcache d = fa_default_kvcache();
  d.k_cache = kc;
  d.v_cache = vc;
  if (c.page_size > 0) {
    d.block_table = table;
    d.max_blocks = max_blocks;
    d.block_table_stride = max_blocks;
  }
  if (c.one_length) {
    d.cache_seqlen = c.cached.empty() ? 0 : c.cached[0];
  } else {
    d.cache_seqlens = lens;
  }
  if (c.batch_idx) d.cache_batch_idx = rows;
  if (c.seqlen_new > 0) {
    d.k_new = kn;
    d.v_new = vn;
  }
  if (c.rotary_dim > 0) {
    d.rotary_cos = cs;
    d.rotary_sin = sn;
    d.rotary_interleaved = c.interleaved;
  }
  d.num_splits = c.num_splits;
  return d;
}

fa_extras KvProblem::extras(const fa_tensor* slopes_t, const fa_tensor* sinks_t) const {
  fa_extras e{};
  e.alibi_slopes = c.alibi ? slopes_t : nullptr;
  e.sinks = c.sinks ? sinks_t : nullptr;
  return e;
}

KvCacheParams KvProblem::host_params() const {
  fa_tensor kd = k_cache.desc, vd = v_cache.desc;
  const fa_kvcache d = describe(&kd, &vd, &k_new.desc, &v_new.desc, &cos.desc, &sin.desc,
                                block_table.data(), cache_seqlens.data(), cache_batch_idx.data());
  fa_options o = options;
  o.backend = FA_BACKEND_CPU;
  KvCacheParams kp;
  const fa_extras e = extras(&slopes.desc, &sinks.desc);
  if (make_kvcache_params({&q.desc, &d, nullptr, nullptr, &o}, &kp) != FA_OK ||
      apply_kvcache_extras(&e, q.desc, &kp.attn) != FA_OK) {
    throw std::runtime_error(std::string("invalid kvcache case: ") + last_error());
  }
  return kp;
}

HostTensor KvProblem::poisoned_out() const {
  HostTensor t = make_host_tensor(c.dtype, {c.batch(), c.seqlen_q, c.heads_q, c.head_dim});
  fill_nan(t);
  return t;
}

HostTensor KvProblem::poisoned_lse() const {
  HostTensor t = make_host_tensor(FA_F32, {c.batch(), c.heads_q, c.seqlen_q});
  fill_nan(t);
  return t;
}

KvExpected expected_kvcache(const KvProblem& p) {
  const KvCacheParams kp = p.host_params();
  return {reference::forward_kvcache(kp, reference::Precision::kFloat64),
          reference::forward_kvcache(kp, reference::Precision::kInput)};
}

::testing::AssertionResult kvcache_call_matches(const KvProblem& p, const KvExpected& e,
                                                const HostTensor& out, const HostTensor& lse,
                                                const HostTensor& k_after,
                                                const HostTensor& v_after, bool nan_exact) {
  const Comparison co = compare_rows(out, e.exact.attention.out, e.naive.attention.out,
                                     default_atol(p.c.dtype), nan_exact);
  if (!co.ok) return ::testing::AssertionFailure() << co.describe("out");
  const Comparison cl = compare_lse(lse, e.exact.attention.lse, e.naive.attention.lse, 1e-4, nan_exact);
  if (!cl.ok) return ::testing::AssertionFailure() << cl.describe("lse");
  auto k_ok = cache_matches(p, p.k_cache, k_after, false, e);
  if (!k_ok) return k_ok;
  return cache_matches(p, p.v_cache, v_after, true, e);
}

std::vector<KvCase> kvcache_suite(fa_dtype dtype) {
  std::vector<KvCase> cases;
  auto add = [&](KvCase c) {
    c.dtype = dtype;
    c.seed = cases.size() + 1;
    cases.push_back(c);
  };
  // KV lengths that are multiples of no tile or page, GQA 4, decode (seqlen_q 1).
  for (int len : {1, 7, 113, 1023, 4097}) add({.heads_q = 8, .heads_kv = 2, .cached = {len}});
  // Ragged lengths (one empty) with an append, every page size, shuffled tables.
  for (int page : {0, 1, 16, 64, 256}) {
    add({.seqlen_q = 1, .heads_q = 4, .heads_kv = 1, .cached = {0, 300, 17, 129}, .seqlen_new = 1,
         .page_size = page});
  }
  // Appends of several tokens that cross a page boundary (15 + 5 over 16-token pages).
  add({.seqlen_q = 5, .heads_q = 8, .heads_kv = 8, .cached = {15, 60, 3}, .seqlen_new = 5,
       .page_size = 16, .causal = true});
  // Speculative decoding and chunked prefill: seqlen_q 2, 5, 16, 300 with masks and softcap.
  add({.seqlen_q = 2, .heads_q = 8, .heads_kv = 1, .cached = {500, 33}, .seqlen_new = 2, .causal = true});
  add({.seqlen_q = 5, .heads_q = 4, .heads_kv = 4, .cached = {77, 200}, .page_size = 64,
       .window_left = 40, .window_right = 2});
  add({.seqlen_q = 16, .heads_q = 8, .heads_kv = 2, .cached = {1000, 5}, .seqlen_new = 16,
       .page_size = 16, .causal = true, .softcap = 30.0f});
  add({.seqlen_q = 300, .heads_q = 2, .heads_kv = 1, .cached = {203, 0}, .seqlen_new = 300,
       .page_size = 64, .causal = true});
  add({.seqlen_q = 300, .heads_q = 2, .heads_kv = 2, .cached = {411}, .window_left = 100,
       .window_right = 0, .softcap = 10.0f});
  // GQA 8 and MQA, head dims 64, 128, 256, one length for the batch.
  add({.heads_q = 8, .heads_kv = 1, .head_dim = 128, .cached = {257, 257}, .one_length = true,
       .seqlen_new = 1, .page_size = 16});
  add({.heads_q = 16, .heads_kv = 2, .head_dim = 256, .cached = {1500, 9}, .seqlen_new = 1,
       .page_size = 64});
  add({.heads_q = 1, .heads_kv = 1, .head_dim = 128, .cached = {64, 2}, .seqlen_new = 3,
       .batch_idx = true, .causal = true});
  // Rotary, both layouts, partial and full rotary_dim, paged and contiguous.
  add({.seqlen_q = 3, .heads_q = 4, .heads_kv = 2, .head_dim = 64, .cached = {20, 0, 70},
       .seqlen_new = 3, .page_size = 16, .rotary_dim = 64, .interleaved = false, .causal = true});
  add({.seqlen_q = 1, .heads_q = 4, .heads_kv = 2, .head_dim = 128, .cached = {31, 5},
       .seqlen_new = 1, .rotary_dim = 32, .interleaved = true});
  add({.seqlen_q = 4, .heads_q = 2, .heads_kv = 1, .head_dim = 64, .cached = {9, 100},
       .seqlen_new = 2, .batch_idx = true, .rotary_dim = 16, .interleaved = true,
       .window_left = 8, .window_right = 0});
  // Forced split counts (the CUDA split-KV path; the CPU ignores them).
  add({.heads_q = 32, .heads_kv = 8, .head_dim = 128, .cached = {4097, 1, 0}, .seqlen_new = 1,
       .page_size = 64, .num_splits = 7});
  // Plain decoding (seqlen_q 1) with softcap, a causal sliding window of 37
  // keys and both; contiguous and over pages of 16 and 64 (each mask and each
  // cache at d 64 and 128), GQA 4; ragged key counts of no tile's multiple:
  // 1, 113, 1023 (the paged cases append the last token).
  for (int form = 0; form < 3; ++form) {
    const bool softcap = form != 1, window = form != 0;
    for (int j = 0; j < 3; ++j) {
      const int page = std::array<int, 3>{0, 16, 64}[j];
      const bool append = page > 0;
      add({.heads_q = 8, .heads_kv = 2, .head_dim = (form + j) % 2 == 0 ? 128 : 64,
           .cached = append ? std::vector<int>{0, 112, 1022} : std::vector<int>{1, 113, 1023},
           .seqlen_new = append ? 1 : 0, .page_size = page, .causal = window,
           .window_left = window ? 37 : -1, .window_right = window ? 0 : -1,
           .softcap = softcap ? 30.0f : 0.0f});
    }
  }
  return cases;
}

std::vector<KvCase> kvcache_extras_suite(fa_dtype dtype) {
  std::vector<KvCase> cases;
  auto add = [&](KvCase c) {
    c.dtype = dtype;
    c.seed = 500 + cases.size();
    cases.push_back(c);
  };
  // Decoding with ALiBi, sinks and both; ragged lengths (one empty: lse = sink).
  add({.heads_q = 8, .heads_kv = 2, .cached = {1023, 0, 7}, .alibi = true});
  add({.heads_q = 8, .heads_kv = 2, .cached = {1023, 0, 7}, .sinks = true});
  add({.heads_q = 4, .heads_kv = 1, .cached = {300, 17}, .seqlen_new = 1, .page_size = 16, .alibi = true,
       .sinks = true});
  // Speculative decoding and chunked prefill: the bias and the diagonal follow each sequence's keys.
  add({.seqlen_q = 5, .heads_q = 8, .heads_kv = 8, .cached = {15, 60}, .seqlen_new = 5, .page_size = 16,
       .causal = true, .alibi = true, .sinks = true});
  add({.seqlen_q = 300, .heads_q = 2, .heads_kv = 1, .cached = {203, 0}, .seqlen_new = 300, .page_size = 64,
       .causal = true, .alibi = true});
  add({.seqlen_q = 5, .heads_q = 4, .heads_kv = 4, .cached = {77, 200}, .window_left = 40, .window_right = 2,
       .softcap = 10.0f, .alibi = true, .sinks = true});
  add({.heads_q = 16, .heads_kv = 2, .head_dim = 128, .cached = {4097, 9}, .seqlen_new = 1, .batch_idx = true,
       .rotary_dim = 32, .interleaved = true, .sinks = true});
  // One slope per head, shared by the sequences.
  add({.seqlen_q = 2, .heads_q = 8, .heads_kv = 2, .cached = {129, 0, 40}, .seqlen_new = 2, .page_size = 16,
       .causal = true, .alibi = true, .slopes_per_head = true, .sinks = true});
  return cases;
}

}  // namespace flashattn::testing
