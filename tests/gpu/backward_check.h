// Shared by the GPU backward suites: out/lse from the CPU forward (the
// backward's inputs) and the gradient check against the fp64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "common/harness.h"

namespace flashattn::testing {

struct Grads {
  HostTensor dq, dk, dv;
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> all = dq.bytes;
    all.insert(all.end(), dk.bytes.begin(), dk.bytes.end());
    all.insert(all.end(), dv.bytes.begin(), dv.bytes.end());
    return all;
  }
};

// Runs the CPU forward for out and lse (host tensors, poisoned first).
inline ::testing::AssertionResult cpu_forward(const Problem& p, HostTensor* out, HostTensor* lse) {
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  *out = p.poisoned_like_q();
  *lse = p.poisoned_lse();
  if (fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out->desc, &lse->desc, p.varlen_ptr(), &o) != FA_OK)
    return ::testing::AssertionFailure() << "CPU forward: " << fa_last_error();
  return ::testing::AssertionSuccess();
}

// dq, dk, dv against the fp64 reference with the suite's tolerance rule.
inline void expect_matches_reference(const Problem& p, const Grads& g) {
  const Expected e = expected_all(p);
  const double atol = default_atol(p.c.dtype);
  for (auto [got, exact, naive, name] :
       {std::tuple{&g.dq, &e.exact_grad.dq, &e.naive_grad.dq, "dq"},
        std::tuple{&g.dk, &e.exact_grad.dk, &e.naive_grad.dk, "dk"},
        std::tuple{&g.dv, &e.exact_grad.dv, &e.naive_grad.dv, "dv"}}) {
    const Comparison c = compare_rows(*got, *exact, *naive, atol);
    EXPECT_TRUE(c.ok) << c.describe(name);
  }
}

}  // namespace flashattn::testing
