// fa_forward_kvcache on the CPU backend against the float64 reference, and its
// argument checks: bad indices are clear errors and never touch the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/kvcache_harness.h"
#include "common/nan_semantics.h"
#include "core/dtype.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {
namespace {

struct CpuCall {
  HostTensor out, lse, k_cache, v_cache;
  fa_status status;
};

// Runs the call on copies of the problem's caches, with poisoned outputs.
CpuCall run_cpu(const KvProblem& p, int trust_indices = 0) {
  CpuCall r{p.poisoned_out(), p.poisoned_lse(), p.k_cache, p.v_cache, FA_OK};
  r.k_cache.rebind();
  r.v_cache.rebind();
  fa_kvcache d = p.describe(&r.k_cache.desc, &r.v_cache.desc, &p.k_new.desc, &p.v_new.desc,
                            &p.cos.desc, &p.sin.desc, p.block_table.data(),
                            p.cache_seqlens.data(), p.cache_batch_idx.data());
  d.trust_indices = trust_indices;
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  const fa_extras e = p.extras(&p.slopes.desc, &p.sinks.desc);
  r.status = fa_forward_kvcache_ex(&p.q.desc, &d, &r.out.desc, &r.lse.desc, &o, &e, nullptr, 0);
  return r;
}

class CpuKvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(CpuKvCache, MatchesFloat64ReferenceAndAppends) {
  const KvProblem p = make_kv_problem(GetParam());
  const KvExpected e = expected_kvcache(p);
  const CpuCall r = run_cpu(p);
  ASSERT_EQ(r.status, FA_OK) << fa_last_error();
  EXPECT_TRUE(kvcache_call_matches(p, e, r.out, r.lse, r.k_cache, r.v_cache));
}

INSTANTIATE_TEST_SUITE_P(Bf16, CpuKvCache, ::testing::ValuesIn(kvcache_suite(FA_BF16)),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(F32, CpuKvCache, ::testing::ValuesIn(kvcache_suite(FA_F32)),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(ExtrasBf16, CpuKvCache, ::testing::ValuesIn(kvcache_extras_suite(FA_BF16)),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(ExtrasF32, CpuKvCache, ::testing::ValuesIn(kvcache_extras_suite(FA_F32)),
                         [](const auto& info) { return info.param.name(); });

// NaN/Inf planted in q and the caches reach exactly the rows the reference
// says (tests/common/nan_semantics.h).
class CpuKvCacheNan : public ::testing::TestWithParam<KvNanCase> {};

TEST_P(CpuKvCacheNan, PlantedValuesReachExactlyTheirRows) {
  const KvProblem p = make_kv_nan_problem(GetParam());
  // The plants land where the cases say: some outputs NaN, most not.
  const std::vector<double>& exact = expected_kvcache(p).exact.attention.out;
  const auto nans = std::count_if(exact.begin(), exact.end(), [](double x) { return std::isnan(x); });
  EXPECT_GT(nans, 0);
  EXPECT_LT(nans, static_cast<long>(exact.size()) / 4);
  const CpuCall r = run_cpu(p);
  ASSERT_EQ(r.status, FA_OK) << fa_last_error();
  EXPECT_TRUE(kvcache_semantics_match(p, r.out, r.lse, r.k_cache, r.v_cache));
}

INSTANTIATE_TEST_SUITE_P(Bf16, CpuKvCacheNan, ::testing::ValuesIn(kvcache_nan_cases(FA_BF16)),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(F32, CpuKvCacheNan, ::testing::ValuesIn(kvcache_nan_cases(FA_F32)),
                         [](const auto& info) { return info.param.name; });

// ALiBi and sinks change the answer (the suite above would pass a call that
// ignored them only if the reference ignored them too).
TEST(KvCacheExtras, AlibiAndSinksChangeTheAnswer) {
  KvCase c{.heads_q = 4, .heads_kv = 1, .cached = {300, 17}, .alibi = true, .sinks = true};
  const KvProblem with = make_kv_problem(c);
  KvProblem without = with;
  without.c.alibi = without.c.sinks = false;
  const CpuCall a = run_cpu(with), b = run_cpu(without);
  ASSERT_EQ(a.status, FA_OK) << fa_last_error();
  ASSERT_EQ(b.status, FA_OK) << fa_last_error();
  EXPECT_NE(a.out.bytes, b.out.bytes);
  EXPECT_NE(a.lse.bytes, b.lse.bytes);
}

// Dropout, dsinks and block masks have no meaning in a KV-cache call.
TEST(KvCacheExtras, DropoutDsinksAndBlockMasksRefused) {
  KvCase c{.heads_q = 4, .heads_kv = 1, .cached = {30, 17}, .sinks = true};
  const KvProblem p = make_kv_problem(c);
  HostTensor out = p.poisoned_out();
  fa_tensor kd = p.k_cache.desc, vd = p.v_cache.desc;
  fa_kvcache d = p.describe(&kd, &vd, nullptr, nullptr, nullptr, nullptr, nullptr, p.cache_seqlens.data(), nullptr);
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  HostTensor dsinks = make_host_tensor(FA_F32, {c.heads_q});
  fa_block_mask bm{};
  for (int k = 0; k < 3; ++k) {
    fa_extras e = p.extras(&p.slopes.desc, &p.sinks.desc);
    const char* words = k == 0 ? "dropout_p" : k == 1 ? "dsinks" : "block_mask";
    if (k == 0) e.dropout_p = 0.1f;
    if (k == 1) e.dsinks = &dsinks.desc;
    if (k == 2) e.block_mask = &bm;
    EXPECT_EQ(fa_forward_kvcache_ex(&p.q.desc, &d, &out.desc, nullptr, &o, &e, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fa_last_error()).find(words), std::string::npos) << fa_last_error();
  }
}

KvCase small_paged() {
  return {.seqlen_q = 2, .heads_q = 4, .heads_kv = 2, .head_dim = 64, .cached = {20, 5},
          .seqlen_new = 2, .page_size = 16};
}

// The call fails with `status` and a message containing `words`, and leaves the caches as they were.
void expect_rejected(const KvProblem& p, const char* words) {
  const CpuCall r = run_cpu(p);
  EXPECT_EQ(r.status, FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find(words), std::string::npos) << fa_last_error();
  EXPECT_EQ(r.k_cache.bytes, p.k_cache.bytes);
  EXPECT_EQ(r.v_cache.bytes, p.v_cache.bytes);
}

TEST(KvCacheErrors, BlockTableOutsideThePool) {
  KvProblem p = make_kv_problem(small_paged());
  p.block_table[1] = static_cast<int32_t>(p.k_cache.desc.shape[0]);  // one past the pool
  expect_rejected(p, "outside the pool");
  p.block_table[1] = -1;
  expect_rejected(p, "outside the pool");
}

TEST(KvCacheErrors, LengthsBeyondTheCache) {
  KvProblem p = make_kv_problem(small_paged());
  p.cache_seqlens[1] = static_cast<int32_t>(p.max_blocks * 16 - 1);  // + 2 new tokens > capacity
  expect_rejected(p, "exceeds the cache's capacity");
}

TEST(KvCacheErrors, NegativeLengths) {
  KvProblem p = make_kv_problem(small_paged());
  p.cache_seqlens[0] = -3;
  expect_rejected(p, "negative");
  KvCase one = small_paged();
  one.one_length = true;
  KvProblem q = make_kv_problem(one);
  fa_kvcache d = q.describe(&q.k_cache.desc, &q.v_cache.desc, &q.k_new.desc, &q.v_new.desc,
                            nullptr, nullptr, q.block_table.data(), nullptr, nullptr);
  d.cache_seqlen = -1;
  HostTensor out = q.poisoned_out();
  EXPECT_EQ(fa_forward_kvcache(&q.q.desc, &d, &out.desc, nullptr, &q.options, nullptr, 0),
            FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("cache_seqlen"), std::string::npos);
}

TEST(KvCacheErrors, CacheRowsOutOfRangeOrRepeated) {
  KvCase c{.heads_q = 2, .heads_kv = 1, .cached = {3, 4}, .seqlen_new = 1, .batch_idx = true};
  KvProblem p = make_kv_problem(c);
  p.cache_batch_idx[0] = static_cast<int32_t>(p.k_cache.desc.shape[0]);
  expect_rejected(p, "cache_batch_idx[0]");
  p.cache_batch_idx[0] = p.cache_batch_idx[1];
  expect_rejected(p, "twice");
}

TEST(KvCacheErrors, OptionalTensorsComeInPairs) {
  KvProblem p = make_kv_problem(small_paged());
  HostTensor out = p.poisoned_out();
  fa_kvcache d = p.describe(&p.k_cache.desc, &p.v_cache.desc, &p.k_new.desc, &p.v_new.desc,
                            nullptr, nullptr, p.block_table.data(), p.cache_seqlens.data(), nullptr);
  d.v_new = nullptr;
  EXPECT_EQ(fa_forward_kvcache(&p.q.desc, &d, &out.desc, nullptr, &p.options, nullptr, 0),
            FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("k_new and v_new"), std::string::npos);
  KvCase rc = small_paged();
  rc.rotary_dim = 16;
  KvProblem r = make_kv_problem(rc);
  d = r.describe(&r.k_cache.desc, &r.v_cache.desc, nullptr, nullptr, &r.cos.desc, &r.sin.desc,
                 r.block_table.data(), r.cache_seqlens.data(), nullptr);
  d.k_new = d.v_new = nullptr;
  EXPECT_EQ(fa_forward_kvcache(&r.q.desc, &d, &out.desc, nullptr, &r.options, nullptr, 0),
            FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("rotary"), std::string::npos);
}

TEST(KvCacheErrors, WorkspaceTooSmall) {
  const KvProblem p = make_kv_problem(small_paged());
  HostTensor kc = p.k_cache, vc = p.v_cache, out = p.poisoned_out();
  kc.rebind();
  vc.rebind();
  const fa_kvcache d = p.describe(&kc.desc, &vc.desc, &p.k_new.desc, &p.v_new.desc, nullptr,
                                  nullptr, p.block_table.data(), p.cache_seqlens.data(), nullptr);
  size_t bytes = 0;
  ASSERT_EQ(fa_forward_kvcache_workspace_size(&p.q.desc, &d, &p.options, &bytes), FA_OK);
  EXPECT_GT(bytes, 0u);
  std::vector<uint8_t> ws(bytes);
  EXPECT_EQ(fa_forward_kvcache(&p.q.desc, &d, &out.desc, nullptr, &p.options, ws.data(), bytes - 1),
            FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fa_forward_kvcache(&p.q.desc, &d, &out.desc, nullptr, &p.options, ws.data(), bytes), FA_OK)
      << fa_last_error();
}

// With trust_indices the host check is skipped: a bad sequence gets NaN and
// nothing of it is written, the good one is still right.
TEST(KvCacheErrors, TrustedBadIndicesPoisonOnlyTheirSequence) {
  KvProblem p = make_kv_problem(small_paged());
  const KvExpected e = expected_kvcache(p);
  const int32_t saved = p.block_table[p.max_blocks];
  p.block_table[p.max_blocks] = 1 << 20;  // sequence 1's first page
  const CpuCall r = run_cpu(p, 1);
  ASSERT_EQ(r.status, FA_OK) << fa_last_error();
  p.block_table[p.max_blocks] = saved;
  const int64_t per_seq = int64_t{p.c.seqlen_q} * p.c.heads_q * p.c.head_dim;
  for (int64_t i = 0; i < 2 * per_seq; ++i) {
    const double got = load_as_float(r.out.bytes.data(), i, p.c.dtype);
    if (i < per_seq) {
      const double want = e.exact.attention.out[static_cast<size_t>(i)];
      EXPECT_NEAR(got, want, 0.05) << i;
    } else {
      EXPECT_TRUE(std::isnan(got)) << i;
    }
  }
  // Sequence 0's appended tokens are in; sequence 1 wrote nothing.
  KvCacheParams kp = p.host_params();
  for (int i = 0; i < p.c.seqlen_new; ++i) {
    const int64_t off = v_cache_offset(kp, 1, p.c.cached[1] + i, 0);
    EXPECT_EQ(std::memcmp(&r.v_cache.bytes[off * 2], &p.v_cache.bytes[off * 2], 2 * p.c.head_dim), 0);
  }
}

TEST(KvCacheCppApi, RunsAndThrowsOnBadInput) {
  KvProblem p = make_kv_problem(small_paged());
  const KvExpected e = expected_kvcache(p);
  HostTensor kc = p.k_cache, vc = p.v_cache, out = p.poisoned_out(), lse = p.poisoned_lse();
  kc.rebind();
  vc.rebind();
  const fa_kvcache d = p.describe(&kc.desc, &vc.desc, &p.k_new.desc, &p.v_new.desc, nullptr,
                                  nullptr, p.block_table.data(), p.cache_seqlens.data(), nullptr);
  const auto options = flashattn::Options().with_backend(FA_BACKEND_CPU);
  std::vector<uint8_t> ws(flashattn::kvcache_workspace_size(p.q.desc, d, options));
  flashattn::forward_kvcache(p.q.desc, d, out.desc, &lse.desc, options, ws.data(), ws.size());
  EXPECT_TRUE(kvcache_call_matches(p, e, out, lse, kc, vc));
  p.block_table[0] = -5;
  EXPECT_THROW(flashattn::forward_kvcache(p.q.desc, d, out.desc, nullptr, options), flashattn::Error);
}

}  // namespace
}  // namespace flashattn::testing
