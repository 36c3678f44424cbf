// The CPU backend and the fp64 reference follow the NaN/Inf semantics of
// flashattn.h: planted NaN/Inf reach exactly the results that depend on them,
// masked keys never contribute, rows that see nothing give 0 / -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/nan_semantics.h"
#include "core/dtype.h"
#include "core/layout.h"

namespace flashattn::testing {
namespace {

struct CpuRun {
  HostTensor out, lse, dq, dk, dv;
};

// Forward and backward with the problem's extras (ALiBi, sinks and their
// gradient, dropout, block mask; none for the shared cases).
CpuRun run_cpu(const Problem& p) {
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  CpuRun r{p.poisoned_like_q(), p.poisoned_lse(), p.poisoned_like_q(), p.poisoned_like_k(),
           p.poisoned_like_k()};
  HostTensor dsinks = p.poisoned_dsinks();
  fa_extras x = p.extras();
  EXPECT_EQ(fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &r.lse.desc, p.varlen_ptr(), &o, &x),
            FA_OK)
      << fa_last_error();
  if (p.c.sinks) x.dsinks = &dsinks.desc;
  EXPECT_EQ(fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &p.dout.desc, &r.lse.desc, &r.dq.desc,
                           &r.dk.desc, &r.dv.desc, p.varlen_ptr(), &o, &x, nullptr, 0),
            FA_OK)
      << fa_last_error();
  return r;
}

class CpuNanSemantics : public ::testing::TestWithParam<NanCase> {};

TEST_P(CpuNanSemantics, ForwardAndBackwardMatchReference) {
  const NanCase& nc = GetParam();
  Problem p = make_nan_problem(nc);
  const CpuRun r = run_cpu(p);
  expect_forward_semantics(p, r.out, r.lse);
  expect_backward_semantics(p, r.dq, r.dk, r.dv);
}

std::vector<NanCase> all_cases() {
  std::vector<NanCase> cases;
  for (fa_dtype dt : {FA_F32, FA_BF16, FA_F16}) {
    for (NanCase nc : nan_semantics_cases(dt, 16)) {
      nc.name += std::string("_") + fa_dtype_name(dt);
      cases.push_back(nc);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuNanSemantics, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

// The CUDA suite's kernel-path cases (GQA groups, deterministic, d96 / d256,
// softcap + ALiBi + sinks, dropout, block masks) on the CPU backend: the same
// rules, and every plant of the GPU suite under the ASan job.
INSTANTIATE_TEST_SUITE_P(Paths, CpuNanSemantics, ::testing::ValuesIn(nan_semantics_path_cases()),
                         [](const auto& info) { return info.param.name; });

// Independent of the reference: a NaN in v[j][c] reaches out[i][c] exactly for
// the rows i that see key j, and nothing else (no lse, no other column).
TEST(CpuNanSemanticsDirect, ValueNanReachesExactlyItsColumnOfSeeingRows) {
  for (const NanCase& nc : nan_semantics_cases(FA_F32, 16)) {
    if (nc.name != "v_visible_nan") continue;
    Problem p = make_problem(nc.c);
    plant(p, nc.plants);
    const Plant& x = nc.plants[0];
    const CpuRun r = run_cpu(p);
    const AttentionParams params = p.host_params();
    const MaskPolicy mask = mask_for(params, sequence_info(params, 0));
    for (int i = 0; i < nc.c.seqlen_q; ++i) {
      for (int h = 0; h < nc.c.heads_q; ++h) {
        const float lse = static_cast<const float*>(r.lse.desc.data)[h * nc.c.seqlen_q + i];
        EXPECT_FALSE(std::isnan(lse)) << "row " << i;
        for (int c = 0; c < nc.c.head_dim; ++c) {
          const bool want_nan = h / params.group_size() == x.head && c == x.col &&
                                mask.visible(i, static_cast<int>(x.row));
          EXPECT_EQ(std::isnan(read_row_element(r.out, i, h, c)), want_nan)
              << "row " << i << " head " << h << " col " << c;
        }
      }
    }
  }
}

// Keys no row can see hold NaN and Inf: every result is finite and a row that
// sees nothing gets 0 and -inf.
TEST(CpuNanSemanticsDirect, MaskedKeysNeverContribute) {
  for (const NanCase& nc : nan_semantics_cases(FA_BF16, 64)) {
    if (nc.name != "masked_keys_nan_inf" && nc.name != "unseeing_row_q_nan_inf") continue;
    Problem p = make_problem(nc.c);
    plant(p, nc.plants);
    const CpuRun r = run_cpu(p);
    for (const HostTensor* t : {&r.out, &r.dq, &r.dk, &r.dv}) {
      const int64_t n = static_cast<int64_t>(t->bytes.size() / 2);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(load_as_float(t->bytes.data(), i, FA_BF16))) << nc.name << " element " << i;
      }
    }
    if (nc.name == "unseeing_row_q_nan_inf") {
      EXPECT_EQ(read_row_element(r.out, 10, 0, 5), 0.0);
      EXPECT_EQ(static_cast<const float*>(r.lse.desc.data)[10], -std::numeric_limits<float>::infinity());
    }
  }
}

}  // namespace
}  // namespace flashattn::testing
