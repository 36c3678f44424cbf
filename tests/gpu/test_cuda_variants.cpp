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

// The problem's extras on the device (alibi slopes, sinks, a poisoned dsinks).
struct DeviceExtras {
  DeviceTensor alibi, sinks, dsinks;
  HostTensor dsinks_host;
  explicit DeviceExtras(const Problem& p) : dsinks_host(p.poisoned_dsinks()) {
    if (p.c.alibi != Case::Alibi::kOff) alibi = DeviceTensor::upload(p.alibi_slopes);
    if (p.c.sinks) {
      sinks = DeviceTensor::upload(p.sinks);
      dsinks = DeviceTensor::upload(dsinks_host);
    }
  }
  fa_extras forward(const Problem& p) const {
    fa_extras e = fa_default_extras();
    if (p.c.alibi != Case::Alibi::kOff) e.alibi_slopes = &alibi.desc;
    if (p.c.sinks) e.sinks = &sinks.desc;
    return e;
  }
  fa_extras backward(const Problem& p) {
    fa_extras e = forward(p);
    if (p.c.sinks) e.dsinks = &dsinks.desc;
    return e;
  }
};

struct VariantRun {
  HostTensor out, lse, dq, dk, dv, dsinks;
};

::testing::AssertionResult run_cuda(const Problem& p, bool backward, VariantRun& r) {
  DeviceProblem d(p);
  DeviceExtras x(p);
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  DeviceTensor dout_ = DeviceTensor::upload(out), dlse = DeviceTensor::upload(lse);
  const fa_options o = d.options();
  const fa_extras fx = x.forward(p);
  if (auto done = call_completed(fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &dlse.desc,
                                               d.varlen_ptr(), &o, &fx));
      !done)
    return done;
  r.out = dout_.download(out);
  r.lse = dlse.download(lse);
  if (!backward) return ::testing::AssertionSuccess();
  HostTensor gq = p.poisoned_like_q(), gk = p.poisoned_like_k(), gv = p.poisoned_like_k();
  DeviceTensor dq = DeviceTensor::upload(gq), dk = DeviceTensor::upload(gk), dv = DeviceTensor::upload(gv);
  const fa_extras bx = x.backward(p);
  if (auto done = call_completed(fa_backward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &d.dout.desc,
                                                &dlse.desc, &dq.desc, &dk.desc, &dv.desc, d.varlen_ptr(),
                                                &o, &bx, nullptr, 0));
      !done)
    return done;
  r.dq = dq.download(gq);
  r.dk = dk.download(gk);
  r.dv = dv.download(gv);
  if (p.c.sinks) r.dsinks = x.dsinks.download(x.dsinks_host);
  return ::testing::AssertionSuccess();
}

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

// Block masks have no CUDA kernels yet: the forward and the backward refuse
// them (FA_ERROR_UNSUPPORTED, docs/variants.md) before reading the lists, and
// write nothing.
TEST(CudaBlockSparse, IsRefusedAsUnsupported) {
  FA_REQUIRE_GPU();
  Case c = make_case(FA_BF16, 40, 50, 64, 7);
  c.block_q = 16;
  c.block_k = 16;
  c.block_density = 0.5;
  const Problem p = make_problem(c);
  DeviceProblem d(p);
  const HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse(), dq = p.poisoned_like_q();
  DeviceTensor dout_ = DeviceTensor::upload(out), dlse = DeviceTensor::upload(lse);
  DeviceTensor gq = DeviceTensor::upload(dq), gk = DeviceTensor::upload(p.poisoned_like_k()),
               gv = DeviceTensor::upload(p.poisoned_like_k());
  const fa_options o = d.options();
  const fa_extras x = p.extras();  // host lists, as the CPU backend takes them
  EXPECT_EQ(fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &dlse.desc, nullptr, &o, &x),
            FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("no block-sparse kernels"), std::string::npos) << fa_last_error();
  EXPECT_EQ(fa_backward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &d.dout.desc, &dlse.desc, &gq.desc,
                           &gk.desc, &gv.desc, nullptr, &o, &x, nullptr, 0),
            FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("no block-sparse kernels"), std::string::npos) << fa_last_error();
  EXPECT_EQ(dout_.download(out).bytes, out.bytes) << "out written";
  EXPECT_EQ(gq.download(dq).bytes, dq.bytes) << "dq written";
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
