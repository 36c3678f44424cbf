// Test harness shared by the CPU and GPU suites: random inputs (never zeros),
// poisoned outputs, the fp64 reference, and the tolerance rule
//   error(backend vs fp64) <= 2 * error(naive attention in the input dtype vs fp64) + atol,
// NaN never passing.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/params.h"
#include "flashattn/flashattn.h"
#include "reference/reference.h"

namespace flashattn::testing {

struct Case {
  int batch = 1;
  int seqlen_q = 1;
  int seqlen_k = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int head_dim = 64;
  fa_dtype dtype = FA_F32;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  float scale = 0.0f;  // 0 = default 1/sqrt(d)
  // Per-sequence lengths; non-empty means a variable-length batch (batch, seqlen_q/k
  // are then derived from them).
  std::vector<int> varlen_q;
  std::vector<int> varlen_k;
  // Extra elements at the end of each row of q/k/v/out (a multiple of 8 keeps
  // 16-byte alignment): non-contiguous strides.
  int row_pad = 0;
  // Score extras (fa_extras): ALiBi slopes per query head or per (sequence,
  // head), random in [0.01, 0.3]; a random sink logit per query head.
  enum class Alibi { kOff, kPerHead, kPerBatchHead };
  Alibi alibi = Alibi::kOff;
  bool sinks = false;
  float dropout_p = 0.0f;  // with seed `seed` and offset dropout_offset (fa_extras)
  uint64_t dropout_offset = 7;  // any: the forward and the backward only need to agree
  uint64_t seed = 1;
  // Block mask (fa_block_mask), on when block_q > 0: each (query block, key
  // block) pair listed with probability block_density, about half of the
  // listed ones as "full"; lists per (sequence, head), or one list set shared
  // by all (B = H = 1) with block_shared.
  int block_q = 0;
  int block_k = 0;
  double block_density = 1.0;
  bool block_shared = false;

  bool is_varlen() const { return !varlen_q.empty(); }
  std::string name() const;
};

// gtest prints a Case by its name rather than its bytes.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// Host memory in some dtype with its descriptor (desc.data points into bytes).
struct HostTensor {
  std::vector<uint8_t> bytes;
  fa_tensor desc{};
  void rebind() { desc.data = bytes.empty() ? nullptr : bytes.data(); }
};

// A contiguous, zero-filled host tensor of `shape`.
HostTensor make_host_tensor(fa_dtype dtype, const std::vector<int64_t>& shape);

// A block mask by class: cls[((b * heads + h) * q_blocks + qb) * k_blocks + kb]
// is 0 (not listed), 1 (partial) or 2 (full), for lists of shape (batch, heads, ...).
struct BlockClasses {
  int block_q = 0, block_k = 0;
  int batch = 1, heads = 1, q_blocks = 0, k_blocks = 0;
  std::vector<uint8_t> cls;
  BlockClasses(int bq, int bk, int b, int h, int seqlen_q, int seqlen_k);
  uint8_t& at(int b, int h, int qb, int kb) {
    return cls[((static_cast<size_t>(b) * heads + h) * q_blocks + qb) * k_blocks + kb];
  }
};

struct Problem {
  Case c;
  HostTensor q, k, v, dout;
  HostTensor alibi_slopes, sinks;  // f32, empty when off
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  fa_varlen varlen{};
  fa_options options{};
  // Block mask lists (int32); when use_block_mask, extras() passes
  // block_mask, pointed at them (refreshed per call: a Problem may move).
  HostTensor kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  mutable fa_block_mask block_mask{};
  bool use_block_mask = false;

  const fa_varlen* varlen_ptr() const { return c.is_varlen() ? &varlen : nullptr; }
  // The extras over this problem's tensors (rebuilt per call: a Problem may move).
  fa_extras extras() const;
  // A poisoned f32 (heads_q) tensor for the sinks' gradient.
  HostTensor poisoned_dsinks() const;
  // Params over the host tensors, for the reference.
  AttentionParams host_params() const;
  // Output tensors shaped like q / k, and the lse, poisoned with NaN.
  HostTensor poisoned_like_q() const;
  HostTensor poisoned_like_k() const;
  HostTensor poisoned_lse() const;
};

// Random normal inputs for the case (fixed seed per case).
Problem make_problem(const Case& c);

// Gives p the block mask of `classes`: each query block's listed blocks in a
// shuffled order, the slots past each count holding out-of-range values (the
// library must never read them).
void set_block_mask(Problem& p, const BlockClasses& classes);

// Reference results, computed once per problem.
struct Expected {
  reference::ForwardResult exact;  // fp64
  reference::ForwardResult naive;  // naive attention rounded to the input dtype
  reference::BackwardResult exact_grad;
  reference::BackwardResult naive_grad;
};
Expected expected_forward(const Problem& p);
Expected expected_all(const Problem& p);

struct Comparison {
  double max_error = 0;       // backend vs fp64
  double baseline_error = 0;  // naive-in-dtype vs fp64
  double tolerance = 0;
  int64_t nan_count = 0;
  bool ok = false;
  std::string describe(const char* what) const;
};

// Absolute tolerance added to 2x the naive error, per dtype.
double default_atol(fa_dtype dtype);

// Compares a tensor laid out like q (or k) in `dtype` against canonical
// [rows][heads][dim] reference values. Infinities must match exactly. Any NaN
// fails, unless nan_exact: then NaN must appear exactly where the fp64
// reference has NaN (inputs with planted NaN, docs/semantics.md).
Comparison compare_rows(const HostTensor& got, const std::vector<double>& exact,
                        const std::vector<double>& naive, double atol, bool nan_exact = false);
// Compares an lse tensor against canonical [heads][total_q] values, as compare_rows.
Comparison compare_lse(const HostTensor& got, const std::vector<double>& exact,
                       const std::vector<double>& naive, double atol, bool nan_exact = false);

// dq, dk, dv against the fp64 reference of p with the tolerance rule (gtest
// expectations, one per gradient); nan_exact as in compare_rows.
void expect_gradients_match(const Problem& p, const HostTensor& dq, const HostTensor& dk,
                            const HostTensor& dv, bool nan_exact = false);

// dq, dk, dv against the reference gradients: (name, comparison) for each.
std::vector<std::pair<const char*, Comparison>> compare_gradients(const HostTensor& dq, const HostTensor& dk,
                                                                  const HostTensor& dv, const Expected& e,
                                                                  double atol);

// Reads element (row, head, col) of a q-like / k-like tensor as double.
double read_row_element(const HostTensor& t, int64_t row, int head, int col);
// Writes element (row, head, col) of a q-like / k-like tensor (plants NaN/Inf in tests).
void write_row_element(HostTensor& t, int64_t row, int head, int col, float value);

}  // namespace flashattn::testing
