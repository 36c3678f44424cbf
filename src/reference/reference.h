// Naive attention that materializes S and P, forward and backward, with every
// option of the API (softcap, ALiBi, sinks and the block mask's visibility
// written out here on their own, not through the attention/ policy types or
// the block walks the backends use). It is what every backend is tested against.
//
// Inputs are read through AttentionParams (host pointers, any dtype, any
// strides); results come back in a canonical layout:
//   out, dq:  [total_q][heads_q][head_dim]      (row = cu_seqlens_q[b] + i, or b*seqlen_q + i)
//   dk, dv:   [total_k][heads_kv][head_dim]
//   lse:      [heads_q][total_q]                (-inf for a row that sees no key)
#pragma once

#include <vector>

#include "core/kvcache.h"
#include "core/params.h"

namespace flashattn::reference {

enum class Precision {
  kFloat64,  // exact: every step in double
  kInput,    // as naive attention in the input dtype would round: S, P, O (and
             // dP, dS, dQ, dK, dV) rounded to the dtype after each matmul
};

struct ForwardResult {
  std::vector<double> out;
  std::vector<double> lse;
};

struct BackwardResult {
  std::vector<double> dq;
  std::vector<double> dk;
  std::vector<double> dv;
  std::vector<double> dsinks;  // [heads_q], when the params have sinks
};

// Only query rows with (row % row_stride == 0) are computed when row_stride > 1
// (the others stay 0): for sub-sampled checks of large shapes.
ForwardResult forward(const AttentionParams& p, Precision precision, int row_stride = 1);

// Attention against a KV cache (p's cache contents before the call; nothing is
// written): out/lse canonical as above with total_q = batch * seqlen_q, and the
// rows the call appends, k rotated, [batch][seqlen_new][heads_kv][head_dim].
// Every sequence's indices must be valid.
struct KvCacheResult {
  ForwardResult attention;
  std::vector<double> k_appended;
  std::vector<double> v_appended;
};
KvCacheResult forward_kvcache(const KvCacheParams& p, Precision precision);

// The tolerance rule every check uses: a backend's max error versus fp64 may be
// at most 2x the error of naive attention in the input dtype, plus this atol.
double default_atol(fa_dtype dtype);
inline double tolerance(fa_dtype dtype, double naive_error) {
  return 2.0 * naive_error + default_atol(dtype);
}

// Uses p.q, p.k, p.v, p.dout; recomputes the forward itself (p.out and p.lse
// are not read).
BackwardResult backward(const AttentionParams& p, Precision precision);

}  // namespace flashattn::reference
