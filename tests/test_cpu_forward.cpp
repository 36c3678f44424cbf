#include <gtest/gtest.h>

#include "common/harness.h"
#include "common/suites.h"

namespace flashattn::testing {
namespace {

class CpuForward : public ::testing::TestWithParam<Case> {};

TEST_P(CpuForward, MatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  HostTensor out = p.poisoned_like_q();
  HostTensor lse = p.poisoned_lse();
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  ASSERT_EQ(fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, p.varlen_ptr(), &o),
            FA_OK)
      << fa_last_error();
  const Expected e = expected_forward(p);
  const double atol = default_atol(p.c.dtype);
  const Comparison co = compare_rows(out, e.exact.out, e.naive.out, atol);
  EXPECT_TRUE(co.ok) << co.describe("out");
  const Comparison cl = compare_lse(lse, e.exact.lse, e.naive.lse, 1e-4);
  EXPECT_TRUE(cl.ok) << cl.describe("lse");
}

TEST_P(CpuForward, LseIsOptional) {
  const Problem p = make_problem(GetParam());
  HostTensor out = p.poisoned_like_q();
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  o.num_threads = 1;
  ASSERT_EQ(fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, nullptr, p.varlen_ptr(), &o),
            FA_OK)
      << fa_last_error();
  const Expected e = expected_forward(p);
  const Comparison co = compare_rows(out, e.exact.out, e.naive.out, default_atol(p.c.dtype));
  EXPECT_TRUE(co.ok) << co.describe("out");
}

INSTANTIATE_TEST_SUITE_P(Suite, CpuForward,
                         ::testing::ValuesIn(attention_suite({FA_F32, FA_F16, FA_BF16},
                                                             suite_head_dims(), true)),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flashattn::testing
