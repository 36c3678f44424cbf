// The CUDA backend against the NaN/Inf semantics of flashattn.h (the cases of
// tests/common/nan_semantics.h): planted NaN/Inf reach exactly the results
// the fp64 reference says, masked keys never contribute, rows that see
// nothing give 0 / -inf. Runs on every kernel family the dispatcher picks for
// the case's head dim (sm80 everywhere, sm90 on Hopper). Skips without a GPU.
#include <gtest/gtest.h>

#include "backward_check.h"
#include "common/nan_semantics.h"
#include "device.h"

namespace flashattn::testing {
namespace {

class CudaNanSemantics : public ::testing::TestWithParam<NanCase> {};

TEST_P(CudaNanSemantics, Forward) {
  FA_REQUIRE_GPU();
  Problem p = make_problem(GetParam().c);
  plant(p, GetParam().plants);
  DeviceProblem d(p);
  DeviceTensor out = DeviceTensor::upload(p.poisoned_like_q()), lse = DeviceTensor::upload(p.poisoned_lse());
  const fa_options o = d.options();
  ASSERT_TRUE(call_completed(
      fa_forward(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &lse.desc, d.varlen_ptr(), &o)));
  expect_forward_semantics(p, out.download(p.q), lse.download(p.poisoned_lse()));
}

TEST_P(CudaNanSemantics, Backward) {
  FA_REQUIRE_GPU();
  Problem p = make_problem(GetParam().c);
  plant(p, GetParam().plants);
  HostTensor out_h, lse_h;
  ASSERT_TRUE(cpu_forward(p, &out_h, &lse_h));  // the CPU backend follows the semantics
  DeviceProblem d(p);
  DeviceTensor out = DeviceTensor::upload(out_h), lse = DeviceTensor::upload(lse_h);
  DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q()), dk = DeviceTensor::upload(p.poisoned_like_k()),
               dv = DeviceTensor::upload(p.poisoned_like_k());
  const fa_options o = d.options();
  ASSERT_TRUE(call_completed(fa_backward(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &d.dout.desc,
                                         &lse.desc, &dq.desc, &dk.desc, &dv.desc, d.varlen_ptr(), &o,
                                         nullptr, 0)));
  expect_backward_semantics(p, dq.download(p.q), dk.download(p.k), dv.download(p.k));
}

std::vector<NanCase> gpu_cases() {
  std::vector<NanCase> cases;
  for (auto [dt, d] : {std::pair{FA_BF16, 64}, std::pair{FA_F16, 128}}) {
    for (NanCase nc : nan_semantics_cases(dt, d)) {
      nc.name += std::string("_") + fa_dtype_name(dt) + "_d" + std::to_string(d);
      cases.push_back(nc);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaNanSemantics, ::testing::ValuesIn(gpu_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashattn::testing
