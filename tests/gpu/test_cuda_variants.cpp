// ALiBi, attention sinks and dropout on the CUDA kernels against the fp64
// reference: the forward and the backward (with the sinks' gradient) through
// the Hopper kernels (head dims and options they have, on a 9.0 GPU; dropout
// too: test_sm90_dropout.cpp calls them directly) and through the sm80
// kernels (FLASHATTN_DISABLE_SM90). Dropout: the reference applies the
// library's keep bits itself, so a kernel with another mask fails; the mask
// the kernel applied is also read off its output and compared with
// fa_dropout_mask, and the kept fraction checked against the binomial.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "core/extras.h"
#include "core/validate.h"
#include "cuda/sm90/bwd/api.h"
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

// Both paths: on a 9.0 GPU the default one runs the Hopper backward where it
// takes the case (dropout included), the other the sm80 backward.
TEST_P(CudaVariants, BackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const auto& [c, path] = GetParam();
  const PathGuard guard(path);
  const Problem p = make_problem(c);
  VariantRun r;
  ASSERT_TRUE(run_cuda(p, true, r));
  expect_backward_matches(p, r.dq, r.dk, r.dv, r.dsinks);
}

// Softcap with ALiBi: the Hopper backward's kernel of SoftcapAlibiMods takes
// the call (supports_backward, on params built as fa_backward_ex builds them),
// at every backward head dim (96 padded onto 128): tiles on both sides of the
// diagonal (the bias's linear form) and across it, causal, a window, GQA +
// varlen, ALiBi per head and per (sequence, head), sinks, a cap small enough
// that tanh saturates; deterministic once. Against the reference on the
// default path (the Hopper kernels on a 9.0 GPU).
TEST(CudaVariantsSoftcapAlibi, HopperBackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const PathGuard guard(Path::kDefault);
  uint64_t seed = 5600;
  std::vector<Case> cases;
  for (const int d : {64, 96, 128, 256}) {
    Case c = make_case(d == 128 ? FA_F16 : FA_BF16, 1023, 700, d, seed++);
    c.softcap = 5.0f;
    c.alibi = Case::Alibi::kPerHead;
    cases.push_back(c);
    c.causal = true;
    c.softcap = 1.5f;
    c.alibi = Case::Alibi::kPerBatchHead;
    c.batch = 2;
    cases.push_back(c);
  }
  Case w = make_case(FA_BF16, 300, 517, 128, seed++);
  w.window_left = 70;
  w.window_right = 5;
  w.softcap = 20.0f;
  w.alibi = Case::Alibi::kPerHead;
  w.sinks = true;
  cases.push_back(w);
  Case v = make_case(FA_F16, 0, 0, 64, seed++);
  v.varlen_q = {130, 1, 257, 0, 200};
  v.varlen_k = {300, 77, 257, 3, 129};
  v.heads_q = 6;
  v.heads_kv = 2;
  v.causal = true;
  v.softcap = 5.0f;
  v.alibi = Case::Alibi::kPerBatchHead;
  cases.push_back(v);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const Problem p = make_problem(c);
    if (device_is_sm90()) {
      DeviceProblem d(p);
      DeviceExtras x(p);
      DeviceTensor out = DeviceTensor::upload(p.poisoned_like_q()), lse = DeviceTensor::upload(p.poisoned_lse());
      DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q()), dk = DeviceTensor::upload(p.poisoned_like_k());
      DeviceTensor dv = DeviceTensor::upload(p.poisoned_like_k());
      const fa_options o = d.options();
      const fa_extras bx = x.backward(p);
      const BackwardArgs args{&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &d.dout.desc, &lse.desc,
                              &dq.desc,  &dk.desc,  &dv.desc, d.varlen_ptr(), &o};
      AttentionParams params;
      ASSERT_EQ(make_backward_params(args, &params), FA_OK) << fa_last_error();
      ASSERT_EQ(apply_extras(&bx, d.q.desc, Pass::kBackward, &params), FA_OK) << fa_last_error();
      EXPECT_TRUE(cuda::sm90::supports_backward(params));
    }
    VariantRun r;
    ASSERT_TRUE(run_cuda(p, true, r));
    expect_backward_matches(p, r.dq, r.dk, r.dv, r.dsinks);
  }
  // Deterministic mode on the d64 causal case (per (sequence, head) slopes):
  // the same bits twice, and right.
  const Case& det_case = cases[1];
  SCOPED_TRACE(det_case.name() + " deterministic");
  Problem det = make_problem(det_case);
  det.options.deterministic = 1;
  VariantRun a, b;
  ASSERT_TRUE(run_cuda(det, true, a));
  ASSERT_TRUE(run_cuda(det, true, b));
  EXPECT_EQ(a.dq.bytes, b.dq.bytes);
  expect_backward_matches(det, a.dq, a.dk, a.dv, a.dsinks);
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

// The mask the sm80 forward applies, read off its output
// (expect_output_shows_the_dropout_mask, variants_run.h). Odd sizes, GQA, two
// sequences, offsets past 2^32 (the offset's high word enters the Philox key),
// every sm80 forward tile shape (head dims 64, 128, 256 take their own dropout
// tiles, tuning.h; d 256's pair split gives a warp half a 32-key block).
TEST(CudaDropout, KernelMaskIsTheVisibleMaskWithinBinomialBounds) {
  FA_REQUIRE_GPU();
  const PathGuard guard(Path::kSm80);
  uint64_t seed = 3000;
  for (const int d : {32, 64, 96, 128, 192, 256})
    for (const float drop : {0.1f, 0.5f}) {
      const Case c = dropout_mask_case(d % 64 == 0 ? FA_BF16 : FA_F16, d, drop, seed++);
      SCOPED_TRACE(c.name());
      Problem p = make_problem(c);
      unit_vector_values(p);
      VariantRun r;
      ASSERT_TRUE(run_cuda(p, false, r));
      expect_output_shows_the_dropout_mask(p, r.out);
    }
}

// The deterministic backward with dropout is bitwise the same run to run, on
// both paths (the Hopper backward's own test is test_sm90_dropout.cpp's).
TEST(CudaDropout, DeterministicBackwardIsBitwiseStable) {
  FA_REQUIRE_GPU();
  for (const Path path : {Path::kDefault, Path::kSm80}) {
    for (const int d : {64, 128}) {
      const PathGuard guard(path);
      SCOPED_TRACE(path == Path::kSm80 ? "sm80" : "default");
      const Case c = dropout_determinism_case(d, 3100 + d);
      SCOPED_TRACE(c.name());
      Problem p = make_problem(c);
      p.options.deterministic = 1;
      VariantRun a, b;
      ASSERT_TRUE(run_cuda(p, true, a));
      ASSERT_TRUE(run_cuda(p, true, b));
      EXPECT_EQ(a.dq.bytes, b.dq.bytes);
      EXPECT_EQ(a.dk.bytes, b.dk.bytes);
      EXPECT_EQ(a.dv.bytes, b.dv.bytes);
      expect_backward_matches(p, a.dq, a.dk, a.dv, a.dsinks);
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<Case, Path>>& info) {
  return std::get<0>(info.param).name() + (std::get<1>(info.param) == Path::kSm80 ? "_sm80" : "_auto");
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaVariants,
                         ::testing::Combine(::testing::ValuesIn(variants_suite(
                                                {FA_F16, FA_BF16}, {32, 40, 64, 72, 96, 128, 160, 192, 256})),
                                            ::testing::Values(Path::kDefault, Path::kSm80)),
                         name_of);

// Dropout (p 0.17, 0.5, 0.3; dropout_suite) alone and with causal, window,
// softcap, GQA, varlen, ALiBi and sinks, odd sizes, every head dim; p 0.1
// with offsets past 2^32 below.
std::vector<Case> cuda_dropout_cases() {
  std::vector<Case> cases = dropout_suite({FA_F16, FA_BF16}, {32, 40, 64, 72, 96, 128, 160, 192, 256});
  uint64_t seed = 3300;
  for (fa_dtype dt : {FA_F16, FA_BF16})
    for (const int d : {64, 128, 256}) {
      Case c = make_case(dt, 113, 203, d, seed++);  // every row sees >= 51 keys (dropout_suite)
      c.heads_q = 4;
      c.heads_kv = 1;
      c.window_left = 50;
      c.window_right = 7;
      c.dropout_p = 0.1f;
      c.dropout_offset = (uint64_t{0xffffffff} << 32) | 0xfffffff0u;
      cases.push_back(c);
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Dropout, CudaVariants,
                         ::testing::Combine(::testing::ValuesIn(cuda_dropout_cases()),
                                            ::testing::Values(Path::kDefault, Path::kSm80)),
                         name_of);

}  // namespace
}  // namespace flashattn::testing
