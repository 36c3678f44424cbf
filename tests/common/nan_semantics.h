// NaN/Inf semantics (flashattn.h, docs/semantics.md) as test cases shared by
// the CPU suite and the GPU suites: NaN or Inf planted in q, k, v, dout at
// visible and masked positions; every backend's outputs, lse and gradients
// must carry NaN exactly where the fp64 reference does, and match it
// elsewhere with the usual tolerance.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/harness.h"

namespace flashattn::testing {

enum class Operand { kQ, kK, kV, kDout };

struct Plant {
  Operand operand;
  int64_t row;  // global row (b * seqlen + i, or the varlen row)
  int head;
  int col;
  float value;
};

struct NanCase {
  std::string name;
  Case c;
  std::vector<Plant> plants;
  bool deterministic = false;  // the backward's deterministic mode (fa_options)
  // c's block mask by explicit classes (BlockClasses::cls, lists per sequence
  // and query head) instead of Case::block_density's random ones.
  std::vector<uint8_t> block_classes;
};

// gtest prints a case by its name rather than its bytes.
inline void PrintTo(const NanCase& c, std::ostream* os) { *os << c.name; }

inline void plant(Problem& p, const std::vector<Plant>& plants) {
  for (const Plant& x : plants) {
    HostTensor* t = x.operand == Operand::kQ   ? &p.q
                    : x.operand == Operand::kK ? &p.k
                    : x.operand == Operand::kV ? &p.v
                                               : &p.dout;
    write_row_element(*t, x.row, x.head, x.col, x.value);
  }
}

// The case's problem: its explicit block classes, if any, then its plants.
inline Problem make_nan_problem(const NanCase& nc) {
  Problem p = make_problem(nc.c);
  if (!nc.block_classes.empty()) {
    BlockClasses bc(nc.c.block_q, nc.c.block_k, nc.c.batch, nc.c.heads_q, nc.c.seqlen_q, nc.c.seqlen_k);
    bc.cls = nc.block_classes;
    set_block_mask(p, bc);
  }
  plant(p, nc.plants);
  return p;
}

inline std::vector<NanCase> nan_semantics_cases(fa_dtype dtype, int head_dim) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // More queries than keys, causal: rows 0..59 see nothing, row i sees keys
  // <= i - 60, so key 30 is visible to rows >= 90 and masked for 60..89, which
  // share the query tile 64..127 with them.
  Case causal;
  causal.dtype = dtype;
  causal.seqlen_q = 130;
  causal.seqlen_k = 70;
  causal.heads_q = 2;
  causal.heads_kv = 1;
  causal.head_dim = head_dim;
  causal.causal = true;
  causal.seed = 11;
  // A window that no row of the first 100 keys reaches: row i sees keys
  // [i + 100, i + 110], so keys 0..99 are masked for every row.
  Case window = causal;
  window.seqlen_q = 40;
  window.seqlen_k = 150;
  window.window_left = 10;
  window.seed = 12;
  // Variable lengths (rows of sequence 2 start at 7, its keys at 14).
  Case varlen = causal;
  varlen.varlen_q = {7, 0, 113, 64};
  varlen.varlen_k = {9, 5, 203, 0};
  varlen.seed = 13;
  // cu_seqlens_k = {0, 9, 14, 217, 217}, cu_seqlens_q = {0, 7, 7, 120, 184}:
  // sequence 1 has keys and no query rows, so nothing may see its keys 9 and
  // 10, though a kernel's tile of sequence 0's 9 keys spans them; q row 7 and
  // dout row 8 (sequence 2) lie just past sequence 0's 7 query rows.
  return {
      {"q_visible_nan", causal, {{Operand::kQ, 100, 0, 5, nan}}},
      {"k_visible_nan", causal, {{Operand::kK, 30, 0, 2, nan}}},
      {"v_visible_nan", causal, {{Operand::kV, 30, 0, 7, nan}}},
      {"v_visible_inf", causal, {{Operand::kV, 30, 0, 7, inf}}},
      {"dout_nan", causal, {{Operand::kDout, 100, 1, 3, nan}}},
      {"unseeing_row_q_nan_inf", causal, {{Operand::kQ, 10, 0, 5, nan}, {Operand::kQ, 20, 1, 0, inf}}},
      {"masked_keys_nan_inf", window,
       {{Operand::kK, 5, 0, 1, nan}, {Operand::kV, 5, 0, 1, inf}, {Operand::kK, 70, 0, 0, inf},
        {Operand::kV, 70, 0, 2, nan}, {Operand::kV, 99, 0, 3, -inf}}},
      {"varlen_mixed", varlen,
       {{Operand::kQ, 50, 1, 0, nan}, {Operand::kK, 3, 0, 4, nan}, {Operand::kV, 100, 0, 6, nan},
        {Operand::kK, 200, 0, 1, inf}}},
      {"varlen_isolation", varlen,
       {{Operand::kV, 9, 0, 2, nan}, {Operand::kK, 10, 0, 3, inf}, {Operand::kQ, 7, 1, 4, nan},
        {Operand::kDout, 8, 0, 5, nan}}},
  };
}

// Forward results against the reference of the planted problem.
inline void expect_forward_semantics(const Problem& p, const HostTensor& out, const HostTensor& lse) {
  const Expected e = expected_forward(p);
  const Comparison co = compare_rows(out, e.exact.out, e.naive.out, default_atol(p.c.dtype), true);
  EXPECT_TRUE(co.ok) << co.describe("out");
  const Comparison cl = compare_lse(lse, e.exact.lse, e.naive.lse, 1e-4, true);
  EXPECT_TRUE(cl.ok) << cl.describe("lse");
}

// Gradients against the reference of the planted problem.
inline void expect_backward_semantics(const Problem& p, const HostTensor& dq, const HostTensor& dk,
                                      const HostTensor& dv) {
  expect_gradients_match(p, dq, dk, dv, true);
}

}  // namespace flashattn::testing
