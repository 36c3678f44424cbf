// The reference is what every backend is judged by, so it is tested itself:
// hand-computed values, and gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "common/harness.h"
#include "core/dtype.h"

namespace flashattn::testing {
namespace {

TEST(Reference, HandComputedSingleQuery) {
  Case c;
  c.seqlen_q = 1;
  c.seqlen_k = 2;
  c.head_dim = 8;
  c.scale = 1.0f;
  Problem p = make_problem(c);
  // Only the first two features are non-zero: q = (1, 0), k0 = (1, 0), k1 = (0, 1).
  const float q[8] = {1, 0}, k[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1}, v[16] = {1, 2, 0, 0, 0, 0, 0, 0, 3, 4};
  std::memcpy(p.q.bytes.data(), q, sizeof q);
  std::memcpy(p.k.bytes.data(), k, sizeof k);
  std::memcpy(p.v.bytes.data(), v, sizeof v);
  const auto r = reference::forward(p.host_params(), reference::Precision::kFloat64);
  const double e = std::exp(1.0);
  const double p0 = e / (e + 1), p1 = 1 / (e + 1);
  EXPECT_NEAR(r.out[0], p0 * 1 + p1 * 3, 1e-12);
  EXPECT_NEAR(r.out[1], p0 * 2 + p1 * 4, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(e + 1), 1e-12);
}

TEST(Reference, CausalBottomRightAndFullyMaskedRows) {
  Case c;
  c.seqlen_q = 3;
  c.seqlen_k = 1;
  c.head_dim = 8;
  c.causal = true;
  Problem p = make_problem(c);
  const auto r = reference::forward(p.host_params(), reference::Precision::kFloat64);
  // Rows 0 and 1 see no key: output 0, lse -inf. Row 2 sees key 0 only: out = v0.
  for (int col = 0; col < 8; ++col) {
    EXPECT_EQ(r.out[col], 0.0);
    EXPECT_EQ(r.out[8 + col], 0.0);
    EXPECT_NEAR(r.out[16 + col], read_row_element(p.v, 0, 0, col), 1e-12);
  }
  EXPECT_TRUE(std::isinf(r.lse[0]) && r.lse[0] < 0);
  EXPECT_TRUE(std::isinf(r.lse[1]) && r.lse[1] < 0);
  const auto g = reference::backward(p.host_params(), reference::Precision::kFloat64);
  for (int col = 0; col < 16; ++col) EXPECT_EQ(g.dq[col], 0.0);
}

TEST(Reference, SoftcapLimitsScores) {
  Case c;
  c.seqlen_q = 1;
  c.seqlen_k = 2;
  c.head_dim = 8;
  c.scale = 100.0f;  // huge scores, capped to +-2
  c.softcap = 2.0f;
  Problem p = make_problem(c);
  const auto r = reference::forward(p.host_params(), reference::Precision::kFloat64);
  // Both keys' scores lie in [-2, 2], so lse <= 2 + log 2.
  EXPECT_LE(r.lse[0], 2.0 + std::log(2.0) + 1e-12);
}

// loss = sum(out * dout); its gradient must match central differences.
double loss(const Problem& p) {
  const auto r = reference::forward(p.host_params(), reference::Precision::kFloat64);
  double s = 0;
  for (int64_t row = 0; row < p.q.desc.shape[0] * (p.q.desc.ndim == 4 ? p.q.desc.shape[1] : 1); ++row)
    for (int h = 0; h < p.c.heads_q; ++h)
      for (int col = 0; col < p.c.head_dim; ++col)
        s += r.out[(static_cast<size_t>(row) * p.c.heads_q + h) * p.c.head_dim + col] *
             read_row_element(p.dout, row, h, col);
  return s;
}

void check_gradient(Problem& p, HostTensor& input, const std::vector<double>& analytic,
                    const char* name) {
  const double h = 1e-2;
  float* data = reinterpret_cast<float*>(input.bytes.data());
  const size_t n = input.bytes.size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    const float saved = data[i];
    data[i] = saved + static_cast<float>(h);
    const double up = loss(p);
    data[i] = saved - static_cast<float>(h);
    const double down = loss(p);
    data[i] = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 * (1 + std::abs(numeric))) << name << "[" << i << "]";
  }
}

class ReferenceGradient : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceGradient, MatchesFiniteDifferences) {
  Problem p = make_problem(GetParam());
  const auto g = reference::backward(p.host_params(), reference::Precision::kFloat64);
  check_gradient(p, p.q, g.dq, "dq");
  check_gradient(p, p.k, g.dk, "dk");
  check_gradient(p, p.v, g.dv, "dv");
}

Case small(bool causal, int left, float softcap, int hq, int hkv) {
  Case c;
  c.seqlen_q = 3;
  c.seqlen_k = 5;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = 8;
  c.causal = causal;
  c.window_left = left;
  c.softcap = softcap;
  return c;
}

INSTANTIATE_TEST_SUITE_P(Options, ReferenceGradient,
                         ::testing::Values(small(false, -1, 0, 1, 1), small(true, -1, 0, 1, 1),
                                           small(false, 1, 0, 1, 1), small(false, -1, 1.5f, 1, 1),
                                           small(true, -1, 0, 4, 2)),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flashattn::testing
