// ALiBi, attention sinks and dropout on the CUDA kernels against the fp64
// reference: the forward through the Hopper kernel (head dims it has, on a 9.0
// GPU; dropout always takes the sm80 kernel) and through the sm80 kernel
// (FLASHATTN_DISABLE_SM90), the backward (always the sm80 kernel for these,
// dispatch.cu) with the sinks' gradient. Dropout: the reference applies the
// library's keep bits itself, so a kernel with another mask fails; the mask
// the kernel applied is also read off its output and compared with
// fa_dropout_mask, and the kept fraction checked against the binomial.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

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

// The keep mask as fa_dropout_mask shows it: (batch, heads, seqlen_q, seqlen_k) f32.
HostTensor dropout_mask_of(const Problem& p) {
  HostTensor m = make_host_tensor(FA_F32, {p.c.batch, p.c.heads_q, p.c.seqlen_q, p.c.seqlen_k});
  const fa_extras x = p.extras();
  if (fa_dropout_mask(&x, &m.desc) != FA_OK) ADD_FAILURE() << fa_last_error();
  return m;
}

// The mask the kernel applies, read off its output: with V_j the unit vector
// e_j (seqlen_k <= head_dim), out_ij = P_ij z_ij, and P_ij > 0 everywhere (no
// mask), so out_ij == 0 exactly where key j of row i was dropped. It must be
// fa_dropout_mask's, and the kept fraction within 6 standard deviations of
// the binomial's mean. Odd sizes, GQA, two sequences, offsets past 2^32 (the
// offset's high word enters the Philox key), every sm80 forward tile shape
// (head dims 64, 128, 256 take their own dropout tiles, tuning.h).
TEST(CudaDropout, KernelMaskIsTheVisibleMaskWithinBinomialBounds) {
  FA_REQUIRE_GPU();
  const PathGuard guard(Path::kDefault);
  uint64_t seed = 3000;
  for (const int d : {32, 64, 96, 128, 192, 256})
    for (const float drop : {0.1f, 0.5f}) {
      Case c = make_case(d % 64 == 0 ? FA_BF16 : FA_F16, 203, d - 25, d, seed++);
      c.batch = 2;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.dropout_p = drop;
      c.dropout_offset = (uint64_t{5} << 32) + 12345 + static_cast<uint64_t>(d);
      SCOPED_TRACE(c.name());
      Problem p = make_problem(c);
      for (int j = 0; j < c.seqlen_k; ++j)
        for (int h = 0; h < c.heads_kv; ++h)
          for (int col = 0; col < d; ++col)
            for (int b = 0; b < c.batch; ++b) write_row_element(p.v, b * c.seqlen_k + j, h, col, col == j ? 1.0f : 0.0f);
      VariantRun r;
      ASSERT_TRUE(run_cuda(p, false, r));
      const HostTensor m = dropout_mask_of(p);
      const float* z = reinterpret_cast<const float*>(m.bytes.data());
      int64_t kept = 0, n = 0, mismatched = 0;
      for (int b = 0; b < c.batch; ++b)
        for (int h = 0; h < c.heads_q; ++h)
          for (int i = 0; i < c.seqlen_q; ++i)
            for (int j = 0; j < c.seqlen_k; ++j, ++n) {
              const double out = read_row_element(r.out, b * c.seqlen_q + i, h, j);
              ASSERT_FALSE(std::isnan(out)) << "out NaN at " << b << "," << h << "," << i << "," << j;
              const bool kernel_kept = out != 0.0;
              kept += kernel_kept;
              mismatched += kernel_kept != (z[n] != 0.0f);
            }
      EXPECT_EQ(mismatched, 0) << "of " << n << " elements";
      const double mean = n * (1.0 - drop), sd = std::sqrt(n * drop * (1.0 - drop));
      EXPECT_LE(std::abs(static_cast<double>(kept) - mean), 6.0 * sd) << "kept " << kept << " of " << n;
    }
}

// The deterministic backward with dropout is bitwise the same run to run.
TEST(CudaDropout, DeterministicBackwardIsBitwiseStable) {
  FA_REQUIRE_GPU();
  for (const int d : {64, 128}) {
    Case c = make_case(FA_BF16, 203, 333, d, 3100 + d);
    c.batch = 2;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    c.dropout_p = 0.1f;
    c.dropout_offset = uint64_t{1} << 33;
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
