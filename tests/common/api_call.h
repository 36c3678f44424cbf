// One C-ABI forward call on a small CPU problem, for the argument-validation
// suites: tests break one argument and expect a status and a message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/harness.h"

namespace flashattn::testing {

struct Call {
  Problem p;
  HostTensor out, lse;
  fa_options o;
  explicit Call(Case c = base()) : p(make_problem(c)), out(p.poisoned_like_q()), lse(p.poisoned_lse()) {
    o = p.options;
    o.backend = FA_BACKEND_CPU;
  }
  static Case base() {
    Case c;
    c.seqlen_q = 5;
    c.seqlen_k = 7;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 16;
    return c;
  }
  fa_status forward() {
    return fa_forward(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &lse.desc, p.varlen_ptr(), &o);
  }
};

inline void expect_error(fa_status got, fa_status want, const std::string& words) {
  EXPECT_EQ(got, want) << fa_last_error();
  EXPECT_NE(std::string(fa_last_error()).find(words), std::string::npos)
      << "message '" << fa_last_error() << "' should mention '" << words << "'";
}

}  // namespace flashattn::testing
