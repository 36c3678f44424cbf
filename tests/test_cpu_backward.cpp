#include <gtest/gtest.h>

#include <cstring>

#include "common/harness.h"
#include "common/suites.h"

namespace flashattn::testing {
namespace {

class CpuBackward : public ::testing::TestWithParam<Case> {};

TEST_P(CpuBackward, MatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  ASSERT_EQ(fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, p.varlen_ptr(), &o),
            FA_OK)
      << fa_last_error();
  HostTensor dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
  size_t bytes = 0;
  ASSERT_EQ(fa_backward_workspace_size(&p.q.desc, &p.k.desc, &p.v.desc, p.varlen_ptr(), &o, &bytes),
            FA_OK);
  std::vector<uint8_t> workspace(bytes);
  ASSERT_EQ(fa_backward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &p.dout.desc, &lse.desc,
                        &dq.desc, &dk.desc, &dv.desc, p.varlen_ptr(), &o, workspace.data(), bytes),
            FA_OK)
      << fa_last_error();
  const Expected e = expected_all(p);
  for (const auto& [name, c] : compare_gradients(dq, dk, dv, e, default_atol(p.c.dtype))) {
    EXPECT_TRUE(c.ok) << c.describe(name);
  }
}

TEST(CpuBackwardDeterminism, BitwiseIdenticalAcrossRuns) {
  Case c = make_case(FA_BF16, 203, 113, 64, 7);
  c.heads_q = 4;
  c.heads_kv = 1;
  c.causal = true;
  const Problem p = make_problem(c);
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  o.deterministic = 1;
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  ASSERT_EQ(fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, nullptr, &o), FA_OK);
  std::vector<uint8_t> first;
  for (int run = 0; run < 5; ++run) {
    HostTensor dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
    ASSERT_EQ(fa_backward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &p.dout.desc, &lse.desc,
                          &dq.desc, &dk.desc, &dv.desc, nullptr, &o, nullptr, 0),
              FA_OK);
    std::vector<uint8_t> all = dq.bytes;
    all.insert(all.end(), dk.bytes.begin(), dk.bytes.end());
    all.insert(all.end(), dv.bytes.begin(), dv.bytes.end());
    if (run == 0) first = all;
    EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size()), 0) << "run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(Suite, CpuBackward,
                         ::testing::ValuesIn(attention_suite({FA_F32, FA_BF16, FA_F16},
                                                             suite_head_dims(), false)),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flashattn::testing
