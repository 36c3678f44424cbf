// The partial attention state of one query row and the online-softmax merge,
// shared by the CPU backend, the split-KV decode kernels (combine step) and
// anything else that attends to a key set in pieces (split tails, rings).
//
// A partial over a key subset K_a of one row is (O_a, m_a, l_a) with
//   m_a = max_{j in K_a} s_j,   l_a = sum_{j in K_a} e^{s_j - m_a},
//   O_a = sum_{j in K_a} e^{s_j - m_a} v_j        (unnormalised), or that / l_a (normalised).
// A partial stored as (O normalised, lse) is the state (m = lse, l = 1).
// Merging two partials over disjoint key sets gives the partial over their union:
//   m = max(m_a, m_b);  c_a = e^{m_a - m},  c_b = e^{m_b - m};  l = l_a c_a + l_b c_b
//   O = O_a c_a + O_b c_b                          (unnormalised)
//   O = (O_a l_a c_a + O_b l_b c_b) / l            (normalised)
// An empty partial (no key: m = -inf, l = 0, O finite) is the identity of the merge.
// NaN in m, l or O of either side propagates into the result.
#pragma once

#include <cmath>

#include "attention/host_device.h"

namespace flashattn {

enum class OutputForm { kUnnormalized, kNormalized };

struct RowState {
  float m;  // running max of the scores (-inf: no key yet)
  float l;  // sum of e^{s - m}

  FA_HOST_DEVICE static RowState empty() { return {-INFINITY, 0.0f}; }
  // A finished partial stored as (normalised O, lse); lse = -inf is empty.
  FA_HOST_DEVICE static RowState from_lse(float lse) {
    return lse == -INFINITY ? empty() : RowState{lse, 1.0f};
  }
  FA_HOST_DEVICE bool is_empty() const { return m == -INFINITY; }
  // log sum_j e^{s_j}; -inf for an empty partial.
  FA_HOST_DEVICE float lse() const { return is_empty() ? -INFINITY : m + logf(l); }
};

// The factors each side's O is multiplied by in a merge, and the merged state.
struct MergeFactors {
  float a;
  float b;
  RowState merged;
};

// NOTES: the max is written as a comparison (not fmaxf) so that a NaN in either
// m reaches the exponentials below instead of being dropped by fmaxf.
FA_HOST_DEVICE MergeFactors merge_factors(RowState a, RowState b, OutputForm form) {
  const float m = a.m > b.m ? a.m : b.m;
  if (m == -INFINITY) return {1.0f, 0.0f, RowState::empty()};  // both empty: keep a's O
  const float ca = expf(a.m - m), cb = expf(b.m - m);
  const float wa = a.l * ca, wb = b.l * cb;
  const float l = wa + wb;
  if (form == OutputForm::kUnnormalized) return {ca, cb, RowState{m, l}};
  return {wa / l, wb / l, RowState{m, l}};
}

// The one merge: o_a (n values, state a) absorbs o_b (state b), in `form`.
template <typename T>
FA_HOST_DEVICE void merge(T* o_a, RowState& a, const T* o_b, RowState b, int n, OutputForm form) {
  const MergeFactors f = merge_factors(a, b, form);
  for (int i = 0; i < n; ++i) o_a[i] = o_a[i] * f.a + o_b[i] * f.b;
  a = f.merged;
}

}  // namespace flashattn
