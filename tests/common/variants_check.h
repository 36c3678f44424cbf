// The sinks' gradient against the float64 reference, and block masks the way
// create_block_mask builds them, shared by the CPU and GPU variant suites.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/harness.h"

namespace flashattn::testing {

// The unit roundoff of the dtype the backends store O in.
inline double unit_roundoff(fa_dtype dtype) {
  switch (dtype) {
    case FA_BF16: return std::ldexp(1.0, -8);
    case FA_F16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

// sum over rows of |exp(sink - lse) * D| per head, from the exact forward: the
// sinks' gradient is this sum with signs, and every backend forms D = dO . O
// from O rounded to the dtype, so its error is bounded by u times this.
inline std::vector<double> dsinks_magnitude(const Problem& p, const Expected& e) {
  const AttentionParams params = p.host_params();
  const int d = p.c.head_dim, hq = p.c.heads_q;
  std::vector<double> sum(static_cast<size_t>(hq), 0.0);
  for (int h = 0; h < hq; ++h) {
    for (int64_t row = 0; row < params.total_q; ++row) {
      const double lse = e.exact.lse[static_cast<size_t>(h) * params.total_q + row];
      if (std::isinf(lse)) continue;
      double row_d = 0;
      for (int c = 0; c < d; ++c)
        row_d += e.exact.out[(static_cast<size_t>(row) * hq + h) * d + c] * read_row_element(p.dout, row, h, c);
      sum[h] += std::abs(std::exp(params.sinks[h] - lse) * row_d);
    }
  }
  return sum;
}

// The sinks' gradient against the reference: 2x the naive error, plus 2u
// times the magnitude of the sum (see dsinks_magnitude), plus the atol.
inline void expect_dsinks_close(const HostTensor& got, const Problem& p, const Expected& e) {
  const std::vector<double>& exact = e.exact_grad.dsinks;
  const std::vector<double>& naive = e.naive_grad.dsinks;
  ASSERT_EQ(got.bytes.size(), exact.size() * sizeof(float));
  const std::vector<double> magnitude = dsinks_magnitude(p, e);
  const float* g = reinterpret_cast<const float*>(got.bytes.data());
  for (size_t h = 0; h < exact.size(); ++h) {
    const double tol = 2.0 * std::abs(naive[h] - exact[h]) + 2.0 * unit_roundoff(p.c.dtype) * magnitude[h] +
                       default_atol(p.c.dtype);
    EXPECT_FALSE(std::isnan(g[h])) << "dsinks[" << h << "] is NaN";
    EXPECT_LE(std::abs(g[h] - exact[h]), tol) << "dsinks[" << h << "] = " << g[h] << ", expected " << exact[h];
  }
}

// out and lse of a run of p against p's reference (the tolerance rule; the lse with atol 1e-4).
inline void expect_forward_matches(const Problem& p, const HostTensor& out, const HostTensor& lse) {
  const Expected e = expected_forward(p);
  const Comparison co = compare_rows(out, e.exact.out, e.naive.out, default_atol(p.c.dtype));
  EXPECT_TRUE(co.ok) << co.describe("out");
  const Comparison cl = compare_lse(lse, e.exact.lse, e.naive.lse, 1e-4);
  EXPECT_TRUE(cl.ok) << cl.describe("lse");
}

// dq, dk, dv (and dsinks when p has sinks) of a run of p against p's reference.
inline void expect_backward_matches(const Problem& p, const HostTensor& dq, const HostTensor& dk,
                                    const HostTensor& dv, const HostTensor& dsinks) {
  const Expected e = expected_all(p);
  for (const auto& [name, c] : compare_gradients(dq, dk, dv, e, default_atol(p.c.dtype))) {
    EXPECT_TRUE(c.ok) << c.describe(name);
  }
  if (p.c.sinks) expect_dsinks_close(dsinks, p, e);
}

inline void expect_same_bytes(const HostTensor& a, const HostTensor& b, const char* what) {
  ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
  EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0) << what << " differs";
}

// Two runs' out, lse, dq, dk and dv (any struct with those HostTensors): the same bits.
template <class Run>
void expect_same_results(const Run& a, const Run& b) {
  expect_same_bytes(a.out, b.out, "out");
  expect_same_bytes(a.lse, b.lse, "lse");
  expect_same_bytes(a.dq, b.dq, "dq");
  expect_same_bytes(a.dk, b.dk, "dk");
  expect_same_bytes(a.dv, b.dv, "dv");
}

// The block classes create_block_mask derives from a mask_mod: a block with
// no visible pair is left out, one with every pair visible (inside both
// sequences) is full, the rest partial.
inline BlockClasses classes_of(const Problem& p, int block_q, int block_k, const std::function<bool(int, int)>& mask_mod) {
  BlockClasses bc(block_q, block_k, 1, 1, p.c.seqlen_q, p.c.seqlen_k);
  for (int qb = 0; qb < bc.q_blocks; ++qb) {
    for (int kb = 0; kb < bc.k_blocks; ++kb) {
      int visible = 0, pairs = 0;
      for (int i = qb * block_q; i < std::min(p.c.seqlen_q, (qb + 1) * block_q); ++i) {
        for (int j = kb * block_k; j < std::min(p.c.seqlen_k, (kb + 1) * block_k); ++j) {
          visible += mask_mod(i, j) ? 1 : 0;
          ++pairs;
        }
      }
      bc.at(0, 0, qb, kb) = visible == 0 ? 0 : (visible == pairs ? 2 : 1);
    }
  }
  return bc;
}

// create_block_mask's causal and sliding-window masks (bottom-right aligned,
// as the options) over odd sizes and block shapes, each with the same element
// mask in its options, labelled with its block shape.
inline std::vector<std::pair<std::string, Problem>> flex_causal_window_problems(fa_dtype dtype,
                                                                                 const std::vector<int>& head_dims,
                                                                                 uint64_t seed) {
  std::vector<std::pair<std::string, Problem>> out;
  for (auto [sq, sk] : std::vector<std::pair<int, int>>{{203, 203}, {113, 203}, {203, 113}, {7, 7}}) {
    for (int window : {-1, 40}) {
      for (auto [bq, bk] : std::vector<std::pair<int, int>>{{128, 128}, {16, 48}, {64, 64}}) {
        for (int d : head_dims) {
          Case c = make_case(dtype, sq, sk, d, seed + sq + bq + window);
          c.causal = true;
          c.window_left = window;
          Problem p = make_problem(c);
          const int offset = sk - sq;
          set_block_mask(p, classes_of(p, bq, bk, [&](int i, int j) {
                           return j <= i + offset && (window < 0 || j >= i + offset - window);
                         }));
          out.emplace_back(c.name() + " blocks " + std::to_string(bq) + "x" + std::to_string(bk), std::move(p));
        }
      }
    }
  }
  return out;
}

}  // namespace flashattn::testing
