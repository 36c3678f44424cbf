// The online-softmax merge (src/attention/state.h) against a row attended whole.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attention/state.h"

namespace flashattn {
namespace {

constexpr int kDim = 13;

// The partial of keys [begin, end) of a row: (O, state) in `form`, in f32 as a
// kernel would accumulate it.
struct Partial {
  std::vector<float> o = std::vector<float>(kDim, 0.0f);
  RowState state = RowState::empty();
};

Partial attend(const std::vector<float>& s, const std::vector<float>& v, int begin, int end,
               OutputForm form) {
  Partial p;
  if (begin >= end) return p;
  float m = -INFINITY;
  for (int j = begin; j < end; ++j) m = std::max(m, s[j]);
  float l = 0;
  for (int j = begin; j < end; ++j) {
    const float e = std::exp(s[j] - m);
    l += e;
    for (int c = 0; c < kDim; ++c) p.o[c] += e * v[j * kDim + c];
  }
  if (form == OutputForm::kNormalized)
    for (float& x : p.o) x /= l;
  p.state = {m, l};
  return p;
}

struct Row {
  std::vector<float> s, v;
};

Row random_row(int keys, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Row r;
  for (int j = 0; j < keys; ++j) r.s.push_back(normal(rng));
  for (int i = 0; i < keys * kDim; ++i) r.v.push_back(normal(rng));
  return r;
}

void expect_same(const Partial& got, const Partial& whole) {
  EXPECT_EQ(got.state.m, whole.state.m);
  EXPECT_NEAR(got.state.lse(), whole.state.lse(), 1e-5f);
  for (int c = 0; c < kDim; ++c) {
    // Compare normalised outputs whatever the form: O / l for unnormalised.
    EXPECT_NEAR(got.o[c] / got.state.l, whole.o[c] / whole.state.l, 1e-5f) << "column " << c;
  }
}

class MergeForms : public ::testing::TestWithParam<OutputForm> {};

TEST_P(MergeForms, HalvesOfARowEqualTheWhole) {
  const OutputForm form = GetParam();
  for (int keys : {1, 2, 7, 113}) {
    const Row row = random_row(keys, 7 + keys);
    for (int cut = 0; cut <= keys; cut += std::max(1, keys / 5)) {
      Partial a = attend(row.s, row.v, 0, cut, form);
      const Partial b = attend(row.s, row.v, cut, keys, form);
      merge(a.o.data(), a.state, b.o.data(), b.state, kDim, form);
      Partial whole = attend(row.s, row.v, 0, keys, form);
      if (form == OutputForm::kNormalized) {
        // Normalised partials compare as O itself; state l is relative to m.
        for (int c = 0; c < kDim; ++c) EXPECT_NEAR(a.o[c], whole.o[c], 1e-5f);
        EXPECT_NEAR(a.state.lse(), whole.state.lse(), 1e-5f);
      } else {
        expect_same(a, whole);
      }
    }
  }
}

TEST_P(MergeForms, ManyPiecesInAnyOrderEqualTheWhole) {
  const OutputForm form = GetParam();
  const int keys = 203;
  const Row row = random_row(keys, 99);
  const std::vector<int> cuts = {0, 17, 64, 65, 130, 203};
  // Right to left, so the merge is also exercised with the larger max on the incoming side.
  Partial acc;
  for (int p = static_cast<int>(cuts.size()) - 2; p >= 0; --p) {
    const Partial piece = attend(row.s, row.v, cuts[p], cuts[p + 1], form);
    merge(acc.o.data(), acc.state, piece.o.data(), piece.state, kDim, form);
  }
  const Partial whole = attend(row.s, row.v, 0, keys, form);
  EXPECT_NEAR(acc.state.lse(), whole.state.lse(), 1e-5f);
  for (int c = 0; c < kDim; ++c) {
    const float got = form == OutputForm::kNormalized ? acc.o[c] : acc.o[c] / acc.state.l;
    const float want = form == OutputForm::kNormalized ? whole.o[c] : whole.o[c] / whole.state.l;
    EXPECT_NEAR(got, want, 1e-5f);
  }
}

TEST_P(MergeForms, EmptyPartialsAreIdentities) {
  const OutputForm form = GetParam();
  const Row row = random_row(9, 3);
  const Partial full = attend(row.s, row.v, 0, 9, form);
  const Partial none;
  // empty absorbs full
  Partial left = none;
  merge(left.o.data(), left.state, full.o.data(), full.state, kDim, form);
  // full absorbs empty
  Partial right = full;
  merge(right.o.data(), right.state, none.o.data(), none.state, kDim, form);
  for (const Partial* p : {&left, &right}) {
    EXPECT_EQ(p->state.m, full.state.m);
    EXPECT_FLOAT_EQ(p->state.l, full.state.l);
    for (int c = 0; c < kDim; ++c) EXPECT_FLOAT_EQ(p->o[c], full.o[c]);
  }
  // empty with empty stays empty, lse -inf, O untouched.
  Partial both = none;
  merge(both.o.data(), both.state, none.o.data(), none.state, kDim, form);
  EXPECT_TRUE(both.state.is_empty());
  EXPECT_EQ(both.state.lse(), -INFINITY);
  for (float x : both.o) EXPECT_EQ(x, 0.0f);
}

TEST_P(MergeForms, NanPropagates) {
  const OutputForm form = GetParam();
  const Row row = random_row(8, 5);
  const Partial a = attend(row.s, row.v, 0, 4, form);
  const Partial b = attend(row.s, row.v, 4, 8, form);
  for (int which = 0; which < 6; ++which) {
    Partial x = a, y = b;
    switch (which) {
      case 0: x.state.m = NAN; break;
      case 1: y.state.m = NAN; break;
      case 2: x.state.l = NAN; break;
      case 3: y.state.l = NAN; break;
      case 4: x.o[3] = NAN; break;
      case 5: y.o[3] = NAN; break;
    }
    merge(x.o.data(), x.state, y.o.data(), y.state, kDim, form);
    // The row's final output: O itself, or O / l when unnormalised.
    const float out = form == OutputForm::kNormalized ? x.o[3] : x.o[3] / x.state.l;
    EXPECT_TRUE(std::isnan(out)) << "case " << which;
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, MergeForms,
                         ::testing::Values(OutputForm::kUnnormalized, OutputForm::kNormalized),
                         [](const auto& info) {
                           return info.param == OutputForm::kNormalized ? "normalized"
                                                                        : "unnormalized";
                         });

TEST(RowState, LseFormRoundTrips) {
  EXPECT_TRUE(RowState::from_lse(-INFINITY).is_empty());
  EXPECT_EQ(RowState::from_lse(-INFINITY).lse(), -INFINITY);
  EXPECT_FLOAT_EQ(RowState::from_lse(2.5f).lse(), 2.5f);
  EXPECT_TRUE(std::isnan(RowState::from_lse(NAN).lse()));
}

}  // namespace
}  // namespace flashattn
