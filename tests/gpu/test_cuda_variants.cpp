// ALiBi and attention sinks on the CUDA kernels against the fp64 reference:
// the forward through the Hopper kernel (head dims it has, on a 9.0 GPU) and
// through the sm80 kernel (FLASHATTN_DISABLE_SM90), the backward (always the
// sm80 kernel for these, dispatch.cu) with the sinks' gradient.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>

#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "device.h"
#include "forward_check.h"
#include "variants_run.h"

namespace flashattn::testing {
namespace {

enum class Path { kDefault, kSm80 };

// Routes the forward: the dispatcher reads FLASHATTN_DISABLE_SM90 on every call.
struct PathGuard {
  explicit PathGuard(Path path) {
    if (path == Path::kSm80) setenv("FLASHATTN_DISABLE_SM90", "1", 1);
    else unsetenv("FLASHATTN_DISABLE_SM90");
  }
  ~PathGuard() { unsetenv("FLASHATTN_DISABLE_SM90"); }
};

class CudaVariants : public ::testing::TestWithParam<std::tuple<Case, Path>> {};

TEST_P(CudaVariants, ForwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const auto& [c, path] = GetParam();
  const PathGuard guard(path);
  const Problem p = make_problem(c);
  VariantRun r;
  ASSERT_TRUE(run_cuda(p, false, r));
  expect_forward_matches_reference(p, ForwardRun{r.out, r.lse});
}

TEST_P(CudaVariants, BackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const auto& [c, path] = GetParam();
  if (path != Path::kDefault) GTEST_SKIP() << "the backward of these runs on sm80 on every path";
  const Problem p = make_problem(c);
  VariantRun r;
  ASSERT_TRUE(run_cuda(p, true, r));
  expect_backward_matches(p, r.dq, r.dk, r.dv, r.dsinks);
}

// The sinks' gradient is a fixed-order reduction: bitwise the same run to run.
TEST(CudaVariantsDeterminism, SinkGradientIsBitwiseStable) {
  FA_REQUIRE_GPU();
  Case c = make_case(FA_BF16, 203, 113, 64, 5);
  c.sinks = true;
  c.alibi = Case::Alibi::kPerBatchHead;
  c.batch = 2;
  c.causal = true;
  const Problem p = make_problem(c);
  VariantRun a, b;
  ASSERT_TRUE(run_cuda(p, true, a));
  ASSERT_TRUE(run_cuda(p, true, b));
  EXPECT_EQ(a.dsinks.bytes, b.dsinks.bytes);
  EXPECT_EQ(a.out.bytes, b.out.bytes);
}

// Dropout has no CUDA kernel yet: refused with a message that says so, never run.
TEST(CudaVariantsDropout, IsRefusedAsUnsupported) {
  FA_REQUIRE_GPU();
  Case c = make_case(FA_BF16, 17, 19, 64, 6);
  c.dropout_p = 0.1f;
  const Problem p = make_problem(c);
  DeviceProblem d(p);
  HostTensor out = p.poisoned_like_q();
  DeviceTensor dout_ = DeviceTensor::upload(out);
  const fa_options o = d.options();
  const fa_extras x = p.extras();
  EXPECT_EQ(fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, nullptr, nullptr, &o, &x),
            FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("dropout"), std::string::npos) << fa_last_error();
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<Case, Path>>& info) {
  return std::get<0>(info.param).name() + (std::get<1>(info.param) == Path::kSm80 ? "_sm80" : "_auto");
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaVariants,
                         ::testing::Combine(::testing::ValuesIn(variants_suite(
                                                {FA_F16, FA_BF16}, {32, 40, 64, 72, 96, 128, 160, 192, 256})),
                                            ::testing::Values(Path::kDefault, Path::kSm80)),
                         name_of);

}  // namespace
}  // namespace flashattn::testing
