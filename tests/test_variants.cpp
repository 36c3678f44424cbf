// ALiBi and attention sinks (fa_extras): the CPU backend against the float64
// reference, the reference against finite differences and hand-computed
// answers, and the validation of the extras.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "attention/dropout.h"
#include "attention/philox.h"
#include "core/extras.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {
namespace {

fa_options cpu_options(const Problem& p) {
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  return o;
}

// out and lse of the CPU forward with the problem's extras, from poisoned tensors.
struct CpuRun {
  HostTensor out, lse;
};
::testing::AssertionResult cpu_forward(const Problem& p, CpuRun& r) {
  const fa_options o = cpu_options(p);
  const fa_extras x = p.extras();
  r.out = p.poisoned_like_q();
  r.lse = p.poisoned_lse();
  const fa_status s = fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &r.lse.desc, p.varlen_ptr(), &o, &x);
  if (s != FA_OK) return ::testing::AssertionFailure() << fa_last_error();
  return ::testing::AssertionSuccess();
}

class CpuVariants : public ::testing::TestWithParam<Case> {};

TEST_P(CpuVariants, ForwardMatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  CpuRun r;
  ASSERT_TRUE(cpu_forward(p, r));
  expect_forward_matches(p, r.out, r.lse);
}

TEST_P(CpuVariants, BackwardMatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  const fa_options o = cpu_options(p);
  fa_extras x = p.extras();
  CpuRun r;
  ASSERT_TRUE(cpu_forward(p, r));
  HostTensor dsinks = p.poisoned_dsinks();
  if (p.c.sinks) x.dsinks = &dsinks.desc;
  HostTensor dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
  ASSERT_EQ(fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &p.dout.desc, &r.lse.desc, &dq.desc,
                           &dk.desc, &dv.desc, p.varlen_ptr(), &o, &x, nullptr, 0),
            FA_OK)
      << fa_last_error();
  expect_backward_matches(p, dq, dk, dv, dsinks);
}

INSTANTIATE_TEST_SUITE_P(Suite, CpuVariants,
                         ::testing::ValuesIn(variants_suite({FA_F32, FA_F16, FA_BF16}, suite_head_dims())),
                         [](const auto& info) { return info.param.name(); });

INSTANTIATE_TEST_SUITE_P(Dropout, CpuVariants,
                         ::testing::ValuesIn(dropout_suite({FA_F32, FA_F16, FA_BF16}, suite_head_dims())),
                         [](const auto& info) { return info.param.name(); });

// L = sum(out * dout) by the float64 reference.
double reference_loss(const Problem& p) {
  const AttentionParams params = p.host_params();
  const reference::ForwardResult r = reference::forward(params, reference::Precision::kFloat64);
  double loss = 0;
  const int d = p.c.head_dim;
  for (int64_t row = 0; row < params.total_q; ++row)
    for (int h = 0; h < p.c.heads_q; ++h)
      for (int c = 0; c < d; ++c)
        loss += r.out[(static_cast<size_t>(row) * p.c.heads_q + h) * d + c] * read_row_element(p.dout, row, h, c);
  return loss;
}

float& f32_at(HostTensor& t, int64_t i) { return reinterpret_cast<float*>(t.bytes.data())[i]; }

// Central differences of L, with the step actually taken (the f32 value
// after the move minus before) as the denominator.
double central_difference(Problem& p, float& x, float step) {
  const float x0 = x;
  x = x0 + step;
  const float up = x;
  const double l_up = reference_loss(p);
  x = x0 - step;
  const float down = x;
  const double l_down = reference_loss(p);
  x = x0;
  return (l_up - l_down) / (static_cast<double>(up) - static_cast<double>(down));
}

Case gradient_case() {
  Case c = make_case(FA_F32, 37, 53, 16, 77);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = true;  // with seqlen_q < seqlen_k no row is empty; see EmptyRows below
  c.softcap = 3.0f;
  c.alibi = Case::Alibi::kPerBatchHead;
  c.sinks = true;
  c.batch = 2;
  return c;
}

TEST(ReferenceVariants, SinkGradientMatchesFiniteDifferences) {
  Problem p = make_problem(gradient_case());
  const reference::BackwardResult g = reference::backward(p.host_params(), reference::Precision::kFloat64);
  ASSERT_EQ(g.dsinks.size(), 4u);
  for (int h = 0; h < 4; ++h) {
    const double fd = central_difference(p, f32_at(p.sinks, h), 1e-2f);
    EXPECT_NEAR(g.dsinks[h], fd, 1e-5 * (1.0 + std::abs(fd))) << "head " << h;
  }
}

// dq through softcap and ALiBi (and the sink's share of the denominator).
TEST(ReferenceVariants, QueryGradientMatchesFiniteDifferences) {
  Problem p = make_problem(gradient_case());
  const reference::BackwardResult g = reference::backward(p.host_params(), reference::Precision::kFloat64);
  float* q = reinterpret_cast<float*>(p.q.bytes.data());
  for (int64_t row : {0, 36, 37 + 20}) {
    for (int h : {0, 3}) {
      const int c = 5;
      const int64_t off = (row / 37) * p.q.desc.strides[0] + (row % 37) * p.q.desc.strides[1] +
                          h * p.q.desc.strides[2] + c;
      const double fd = central_difference(p, q[off], 1e-2f);
      const double an = g.dq[(static_cast<size_t>(row) * 4 + h) * 16 + c];
      EXPECT_NEAR(an, fd, 1e-5 * (1.0 + std::abs(fd))) << "row " << row << " head " << h;
    }
  }
}

// One query, one key: out = v * sigmoid(s - z), lse = log(e^s + e^z) with
// s = scale q.k - slope |0 + 1 - 1 - 0|; here with 2 keys to see the ALiBi term.
TEST(ReferenceVariants, HandComputedAnswer) {
  Case c = make_case(FA_F32, 1, 2, 8, 3);
  c.heads_q = c.heads_kv = 1;
  c.alibi = Case::Alibi::kPerHead;
  c.sinks = true;
  Problem p = make_problem(c);
  const float slope = f32_at(p.alibi_slopes, 0), z = f32_at(p.sinks, 0);
  const AttentionParams params = p.host_params();
  double s[2];
  for (int j = 0; j < 2; ++j) {
    double dot = 0;
    for (int col = 0; col < 8; ++col) dot += read_row_element(p.q, 0, 0, col) * read_row_element(p.k, j, 0, col);
    s[j] = dot * params.scale - slope * std::abs(0 + 2 - 1 - j);
  }
  const double denom = std::exp(s[0]) + std::exp(s[1]) + std::exp(static_cast<double>(z));
  const reference::ForwardResult r = reference::forward(params, reference::Precision::kFloat64);
  EXPECT_NEAR(r.lse[0], std::log(denom), 1e-12);
  for (int col = 0; col < 8; ++col) {
    const double want = (std::exp(s[0]) * read_row_element(p.v, 0, 0, col) +
                         std::exp(s[1]) * read_row_element(p.v, 1, 0, col)) / denom;
    EXPECT_NEAR(r.out[col], want, 1e-12);
  }
}

// With causal and seqlen_q > seqlen_k the leading rows see no key: out 0, lse
// = the sink, and no share in any gradient.
TEST(CpuVariantsEdges, EmptyRowsGetTheSinkAsLse) {
  Case c = make_case(FA_F32, 20, 5, 32, 9);
  c.causal = true;
  c.sinks = true;
  const Problem p = make_problem(c);
  CpuRun r;
  ASSERT_TRUE(cpu_forward(p, r));
  const HostTensor& out = r.out;
  const float* l = reinterpret_cast<const float*>(r.lse.bytes.data());
  const float* z = reinterpret_cast<const float*>(p.sinks.bytes.data());
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 15; ++i) {  // rows 0..14 see no key (i + 5 - 20 < 0)
      EXPECT_EQ(l[h * 20 + i], z[h]);
      for (int col = 0; col < 32; ++col) EXPECT_EQ(read_row_element(out, i, h, col), 0.0);
    }
    EXPECT_NE(l[h * 20 + 15], z[h]);
  }
}

// A slope of 0 and a sink of -inf are exact no-ops: bitwise the plain forward.
TEST(CpuVariantsEdges, NeutralExtrasAreBitwiseNoOps) {
  Case c = make_case(FA_BF16, 113, 203, 64, 11);
  c.causal = true;
  c.alibi = Case::Alibi::kPerHead;
  c.sinks = true;
  Problem p = make_problem(c);
  for (int h = 0; h < 2; ++h) {
    f32_at(p.alibi_slopes, h) = 0.0f;
    f32_at(p.sinks, h) = -std::numeric_limits<float>::infinity();
  }
  const fa_options o = cpu_options(p);
  CpuRun r;
  ASSERT_TRUE(cpu_forward(p, r));
  HostTensor plain = p.poisoned_like_q(), plain_lse = p.poisoned_lse();
  ASSERT_EQ(fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &plain.desc, &plain_lse.desc, nullptr, &o), FA_OK);
  EXPECT_EQ(r.out.bytes, plain.bytes);
  EXPECT_EQ(r.lse.bytes, plain_lse.bytes);
}

// Each extra is checked before any memory is touched; the message names it.
class ExtrasValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    Case c = make_case(FA_F32, 7, 9, 16, 5);
    c.batch = 2;
    c.alibi = Case::Alibi::kPerBatchHead;
    c.sinks = true;
    p = make_problem(c);
    o = cpu_options(p);
    out = p.poisoned_like_q();
    lse = p.poisoned_lse();
    dq = p.poisoned_like_q();
    dk = p.poisoned_like_k();
    dv = p.poisoned_like_k();
    dsinks = p.poisoned_dsinks();
  }
  fa_status forward(const fa_extras& x) {
    return fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, nullptr, &o, &x);
  }
  fa_status backward(const fa_extras& x) {
    return fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &p.dout.desc, &lse.desc, &dq.desc,
                          &dk.desc, &dv.desc, nullptr, &o, &x, nullptr, 0);
  }
  void expect_error(fa_status s, const char* words) {
    EXPECT_EQ(s, FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(fa_last_error(), words), nullptr) << fa_last_error();
  }
  Problem p;
  fa_options o{};
  HostTensor out, lse, dq, dk, dv, dsinks;
};

TEST_F(ExtrasValidation, AcceptsTheValidExtrasAndNull) {
  const fa_extras x = p.extras();
  EXPECT_EQ(forward(x), FA_OK) << fa_last_error();
  EXPECT_EQ(fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, nullptr, &o, nullptr), FA_OK);
}

TEST_F(ExtrasValidation, RejectsBadAlibiSlopes) {
  fa_extras x = p.extras();
  fa_tensor t = p.alibi_slopes.desc;
  x.alibi_slopes = &t;
  t.shape[0] = 3;  // batch is 2
  expect_error(forward(x), "alibi_slopes");
  t = p.alibi_slopes.desc;
  t.dtype = FA_F16;
  expect_error(forward(x), "alibi_slopes must be f32");
  t = p.alibi_slopes.desc;
  t.ndim = 3;
  expect_error(forward(x), "alibi_slopes must have shape");
  t = p.alibi_slopes.desc;
  t.strides[1] = 2;
  expect_error(forward(x), "contiguous");
  t = p.alibi_slopes.desc;
  t.strides[0] = 1;  // rows overlap
  expect_error(forward(x), "batch stride");
  t = p.alibi_slopes.desc;
  t.data = nullptr;
  expect_error(forward(x), "null data pointer");
  t = p.alibi_slopes.desc;
  f32_at(p.alibi_slopes, 1) = std::numeric_limits<float>::quiet_NaN();
  expect_error(forward(x), "alibi_slopes[1]");
}

TEST_F(ExtrasValidation, RejectsBadSinks) {
  fa_extras x = p.extras();
  fa_tensor t = p.sinks.desc;
  x.sinks = &t;
  t.shape[0] = 1;
  expect_error(forward(x), "sinks has 1 x 1 entries, expected 2");
  t = p.sinks.desc;
  t.device = FA_DEVICE_CUDA;
  expect_error(forward(x), "sinks must be on q's device");
  t = p.sinks.desc;
  f32_at(p.sinks, 0) = std::numeric_limits<float>::infinity();
  expect_error(forward(x), "sinks[0]");
}

TEST_F(ExtrasValidation, TheBackwardNeedsDsinksExactlyWithSinks) {
  fa_extras x = p.extras();
  ASSERT_EQ(forward(x), FA_OK) << fa_last_error();
  expect_error(backward(x), "dsinks is a null pointer");
  x.dsinks = &dsinks.desc;
  EXPECT_EQ(backward(x), FA_OK) << fa_last_error();
  x.sinks = nullptr;
  expect_error(backward(x), "dsinks is given but sinks is NULL");
  x = p.extras();
  x.dsinks = &dsinks.desc;
  expect_error(forward(x), "dsinks is for fa_backward_ex only");
}

TEST_F(ExtrasValidation, ReservedMustBeZero) {
  fa_extras x = p.extras();
  x.reserved[5] = 1;
  expect_error(forward(x), "reserved");
}

// The keep mask as fa_dropout_mask shows it: (batch, heads, seqlen_q, seqlen_k) f32.
HostTensor dropout_mask_of(const Problem& p) {
  HostTensor m;
  m.desc.dtype = FA_F32;
  m.desc.device = FA_DEVICE_CPU;
  m.desc.ndim = 4;
  const int64_t shape[] = {p.c.batch, p.c.heads_q, p.c.seqlen_q, p.c.seqlen_k};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    m.desc.shape[i] = shape[i];
    m.desc.strides[i] = stride;
    stride *= shape[i];
  }
  m.bytes.assign(static_cast<size_t>(stride) * sizeof(float), 0);
  m.rebind();
  const fa_extras x = p.extras();
  if (fa_dropout_mask(&x, &m.desc) != FA_OK) throw std::runtime_error(fa_last_error());
  return m;
}

// p as the mask draws it: rounded to a multiple of 1/256, at most 255/256
// (attention/dropout.h), written out here independently of the library.
double rounded_dropout_p(float p) { return std::min(std::round(static_cast<double>(p) * 256.0), 255.0) / 256.0; }

// Kept fraction within 6 standard deviations of the binomial's mean (with the
// rounded p), values exactly 0 or 1 / (1 - rounded p), and another offset
// gives another mask.
TEST(Dropout, MaskKeepsOneMinusPWithinBinomialBounds) {
  for (float given : {0.1f, 0.17f, 0.5f, 0.9f}) {
    const double drop = rounded_dropout_p(given);
    Case c = make_case(FA_F32, 128, 257, 8, 3);
    c.batch = 2;
    c.heads_q = c.heads_kv = 4;
    c.dropout_p = given;
    const Problem p = make_problem(c);
    const HostTensor m = dropout_mask_of(p);
    const float* z = reinterpret_cast<const float*>(m.bytes.data());
    const size_t n = m.bytes.size() / sizeof(float);
    const float scale = static_cast<float>(1.0 / (1.0 - drop));
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(z[i] == 0.0f || z[i] == scale) << z[i];
      kept += z[i] != 0.0f;
    }
    const double mean = n * (1.0 - drop), sd = std::sqrt(n * drop * (1.0 - drop));
    EXPECT_LE(std::abs(static_cast<double>(kept) - mean), 6.0 * sd) << "p " << drop << ": kept " << kept << " of " << n;

    fa_extras other = p.extras();
    other.dropout_offset += 4;
    HostTensor m2 = m;
    m2.rebind();
    ASSERT_EQ(fa_dropout_mask(&other, &m2.desc), FA_OK);
    size_t same = 0;
    const float* z2 = reinterpret_cast<const float*>(m2.bytes.data());
    for (size_t i = 0; i < n; ++i) same += z[i] == z2[i];
    const double agree = drop * drop + (1 - drop) * (1 - drop);  // two independent masks
    EXPECT_LE(std::abs(same - n * agree), 6.0 * std::sqrt(n * agree * (1 - agree))) << "p " << drop;
  }
}

// The kernels' path to the keep bits (Dropout::fragment: one Philox call, 16
// bytes compared at once with SWAR arithmetic) agrees with keep() (one byte
// read out and compared), element by element, for thresholds at the ends and
// both sides of 128 (bit 7 of 256 - threshold8 set or not), blocks far from 0.
TEST(Dropout, FragmentBitsMatchKeepElementByElement) {
  for (float given : {1.0f / 256, 0.1f, 0.5f, 0.5f + 1.0f / 256, 0.9f, 0.999f}) {
    const Dropout d = Dropout::make(given, 0x0123456789abcdefull, (uint64_t{3} << 32) + 77);
    ASSERT_TRUE(d.enabled());
    for (int bh : {0, 5, 1 << 20})
      for (int rb : {0, 1, 4097})
        for (int kb : {0, 3, 70001})
          for (int g = 0; g < 8; ++g)
            for (int t = 0; t < 4; ++t) {
              const uint32_t bits = d.fragment(bh, rb, g, kb, t);
              EXPECT_EQ(bits >> 16, 0u);
              for (int hf = 0; hf < 2; ++hf)
                for (int n = 0; n < 4; ++n)
                  for (int e = 0; e < 2; ++e) {
                    const int i = 16 * rb + g + 8 * hf, j = 32 * kb + 8 * n + 2 * t + e;
                    const bool bit = (bits >> (hf * 8 + 2 * n + e)) & 1u;
                    ASSERT_EQ(bit, d.keep(bh, i, j)) << "p " << given << " bh " << bh << " i " << i << " j " << j;
                  }
            }
  }
}

// p rounds to 8 bits: the scale is 256 / (256 - threshold8), and a p below
// 1/512 rounds to no dropout.
TEST(Dropout, RoundsPToEightBits) {
  EXPECT_EQ(Dropout::make(0.1f, 1, 2).threshold8, 26u);
  EXPECT_FLOAT_EQ(Dropout::make(0.1f, 1, 2).scale, 256.0f / 230.0f);
  EXPECT_EQ(Dropout::make(0.9999f, 1, 2).threshold8, 255u);
  EXPECT_FLOAT_EQ(Dropout::make(0.9999f, 1, 2).scale, 256.0f);
  EXPECT_FALSE(Dropout::make(0.001f, 1, 2).enabled());
  EXPECT_TRUE(Dropout::make(0.003f, 1, 2).enabled());
}

// The forward applies the mask fa_dropout_mask shows: out = sum_j P_ij z_ij V_j
// with P the softmax without dropout (from the reference at p = 0).
TEST(Dropout, ForwardAppliesTheVisibleMask) {
  Case c = make_case(FA_F32, 37, 53, 16, 21);
  c.causal = true;
  c.dropout_p = 0.3f;
  const Problem p = make_problem(c);
  Case plain_case = c;
  plain_case.dropout_p = 0.0f;
  const Problem plain = make_problem(plain_case);  // same seed: same q, k, v
  const AttentionParams params = plain.host_params();
  const HostTensor m = dropout_mask_of(p);
  CpuRun run;
  ASSERT_TRUE(cpu_forward(p, run));
  const HostTensor &out = run.out, &lse = run.lse;
  const reference::ForwardResult r = reference::forward(params, reference::Precision::kFloat64);
  const float* z = reinterpret_cast<const float*>(m.bytes.data());
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 37; ++i) {
      const double lse_i = r.lse[static_cast<size_t>(h) * 37 + i];
      EXPECT_NEAR(reinterpret_cast<const float*>(lse.bytes.data())[h * 37 + i], lse_i, 1e-4);
      for (int col = 0; col < 16; col += 5) {
        double want = 0;
        for (int j = 0; j <= i + 53 - 37; ++j) {
          double dot = 0;
          for (int e = 0; e < 16; ++e) dot += read_row_element(p.q, i, h, e) * read_row_element(p.k, j, h, e);
          want += std::exp(dot * params.scale - lse_i) * z[(h * 37 + i) * 53 + j] * read_row_element(p.v, j, h, col);
        }
        EXPECT_NEAR(read_row_element(out, i, h, col), want, 2e-5) << "row " << i << " head " << h;
      }
    }
  }
}

// The backward regenerates the forward's mask from (seed, offset): with the
// same values its gradients match the reference, with another offset they do not.
TEST(Dropout, BackwardNeedsTheForwardsSeedAndOffset) {
  Case c = make_case(FA_F32, 57, 71, 32, 8);
  c.dropout_p = 0.25f;
  const Problem p = make_problem(c);
  const fa_options o = cpu_options(p);
  const fa_extras x = p.extras();
  CpuRun r;
  ASSERT_TRUE(cpu_forward(p, r));
  const HostTensor &out = r.out, &lse = r.lse;
  const Expected e = expected_all(p);
  for (uint64_t shift : {uint64_t{0}, uint64_t{4}}) {
    fa_extras bx = x;
    bx.dropout_offset += shift;
    HostTensor dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
    ASSERT_EQ(fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &p.dout.desc, &lse.desc, &dq.desc,
                             &dk.desc, &dv.desc, nullptr, &o, &bx, nullptr, 0),
              FA_OK);
    const Comparison cv = compare_rows(dv, e.exact_grad.dv, e.naive_grad.dv, default_atol(FA_F32));
    EXPECT_EQ(cv.ok, shift == 0) << cv.describe("dv");
  }
}

// The reference's dropout backward by central differences (the mask is fixed
// by the seed, so L is smooth in q).
TEST(ReferenceVariants, DropoutGradientMatchesFiniteDifferences) {
  Case c = make_case(FA_F32, 29, 41, 16, 31);
  c.causal = true;
  c.softcap = 4.0f;
  c.sinks = true;
  c.dropout_p = 0.4f;
  Problem p = make_problem(c);
  const reference::BackwardResult g = reference::backward(p.host_params(), reference::Precision::kFloat64);
  float* q = reinterpret_cast<float*>(p.q.bytes.data());
  for (int row : {0, 13, 28}) {
    for (int h : {0, 1}) {
      const int col = 3;
      const int64_t off = row * p.q.desc.strides[1] + h * p.q.desc.strides[2] + col;
      const double fd = central_difference(p, q[off], 1e-2f);
      const double an = g.dq[(static_cast<size_t>(row) * 2 + h) * 16 + col];
      EXPECT_NEAR(an, fd, 1e-5 * (1.0 + std::abs(fd))) << "row " << row << " head " << h;
    }
  }
  for (int h = 0; h < 2; ++h) {
    const double fd = central_difference(p, f32_at(p.sinks, h), 1e-2f);
    EXPECT_NEAR(g.dsinks[h], fd, 1e-5 * (1.0 + std::abs(fd))) << "head " << h;
  }
}

TEST_F(ExtrasValidation, RejectsBadDropout) {
  fa_extras x = p.extras();
  for (float bad : {-0.1f, 1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    x.dropout_p = bad;
    expect_error(forward(x), "dropout_p must be in [0, 1)");
    fa_tensor m = lse.desc;
    expect_error(fa_dropout_mask(&x, &m), "dropout_p must be in [0, 1)");
  }
  x.dropout_p = 0.5f;
  fa_tensor m = lse.desc;  // 3-D
  expect_error(fa_dropout_mask(&x, &m), "mask must be an f32 host tensor");
  expect_error(fa_dropout_mask(nullptr, &m), "extras is a null pointer");
  expect_error(fa_dropout_mask(&x, nullptr), "mask is a null pointer");
  m.ndim = 4;
  m.shape[3] = 2;
  m.strides[3] = 0;
  expect_error(fa_dropout_mask(&x, &m), "stride below 1");
}

// The C++ API passes every extra through: bitwise the C ABI's result, and
// the dsinks it names get written.
TEST(CppApiVariants, OptionsCarryTheExtras) {
  Case c = make_case(FA_F32, 19, 23, 16, 4);
  c.alibi = Case::Alibi::kPerHead;
  c.sinks = true;
  c.dropout_p = 0.2f;
  const Problem p = make_problem(c);
  const fa_extras x = p.extras();
  CpuRun c_abi;
  ASSERT_TRUE(cpu_forward(p, c_abi));
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse(), dsinks = p.poisoned_dsinks();
  flashattn::Options opt;
  opt.with_backend(FA_BACKEND_CPU)
      .with_alibi(&p.alibi_slopes.desc)
      .with_sinks(&p.sinks.desc, &dsinks.desc)
      .with_dropout(x.dropout_p, x.dropout_seed, x.dropout_offset);
  opt.dsinks = nullptr;  // the forward refuses dsinks
  flashattn::forward(p.q.desc, p.k.desc, p.v.desc, out.desc, &lse.desc, opt);
  EXPECT_EQ(out.bytes, c_abi.out.bytes);
  EXPECT_EQ(lse.bytes, c_abi.lse.bytes);
  opt.dsinks = &dsinks.desc;
  HostTensor dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
  flashattn::backward(p.q.desc, p.k.desc, p.v.desc, out.desc, p.dout.desc, lse.desc, dq.desc, dk.desc, dv.desc, opt);
  const Expected e = expected_all(p);
  expect_dsinks_close(dsinks, p, e);
  for (const auto& [name, cmp] : compare_gradients(dq, dk, dv, e, default_atol(FA_F32))) {
    EXPECT_TRUE(cmp.ok) << cmp.describe(name);
  }
}

// Random123's known-answer vectors for Philox4x32-10 (its tests/kat_vectors):
// zeros, all ones, and the digits of pi.
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    Philox4x32 counter;
    uint32_t k0, k1;
    Philox4x32 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 got = philox4x32<10>(k.counter, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.x[i], k.want.x[i]) << "word " << i;
  }
}

}  // namespace
}  // namespace flashattn::testing
