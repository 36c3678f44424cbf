// Shared by the GPU forward suites: the output of one run and its check
// against the fp64 reference.
#pragma once

#include <gtest/gtest.h>

#include "common/harness.h"

namespace flashattn::testing {

struct ForwardRun {
  HostTensor out, lse;
};

// out and lse against the fp64 reference with the suite's tolerance rule.
inline void expect_forward_matches_reference(const Problem& p, const ForwardRun& r) {
  const Expected e = expected_forward(p);
  const Comparison co = compare_rows(r.out, e.exact.out, e.naive.out, default_atol(p.c.dtype));
  EXPECT_TRUE(co.ok) << co.describe("out");
  const Comparison cl = compare_lse(r.lse, e.exact.lse, e.naive.lse, 1e-4);
  EXPECT_TRUE(cl.ok) << cl.describe("lse");
}

}  // namespace flashattn::testing
