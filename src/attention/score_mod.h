// Score modifiers: what happens to a score s = scale * q.k before the mask and
// the softmax, with the derivative the backward needs, in one place for the
// float64 reference, the CPU backend and every kernel. A modifier is a small
// policy type; the options select it at run time.
//
//   identity   s' = s                      ds'/ds = 1
//   softcap    s' = c tanh(s / c)          ds'/ds = 1 - (s' / c)^2
//   ALiBi      s' = s - slope |i + sk - sq - j|  (after softcap)   ds'/ds = 1
//
// The attention sink is not a score modifier but a term of the softmax
// denominator; AttentionSink below holds its three formulas.
#pragma once

#include <cmath>

#include "attention/host_device.h"
#include "attention/math.h"

namespace flashattn {

struct IdentityScore {
  template <typename F>
  FA_HOST_DEVICE F operator()(F s) const { return s; }
  // ds'/ds from the modified score s'.
  template <typename F>
  FA_HOST_DEVICE F grad(F) const { return F(1); }
};

// Gemma-2 / Grok style logit soft-capping; cap > 0.
struct SoftcapScore {
  float cap;
  // c * tanh(s / c): exact tanh in double (the reference), the fast one in float.
  FA_HOST_DEVICE double operator()(double s) const { return cap * std::tanh(s / cap); }
  FA_HOST_DEVICE float operator()(float s) const { return cap * fast_tanh(s * (1.0f / cap)); }
  // tanh(s * inv_cap) alone, for kernels that fold the factor c into the
  // softmax scale (inv_cap = scale / c when s is the unscaled q.k).
  FA_HOST_DEVICE static float unscaled(float s, float inv_cap) { return fast_tanh(s * inv_cap); }
  template <typename F>
  FA_HOST_DEVICE F grad(F modded) const {
    const F t = modded / F(cap);
    return F(1) - t * t;
  }
};

// ALiBi (flash-attn 2.x): a linear penalty on the distance of key j from the
// diagonal of query row i (bottom-right aligned, like the mask), added after
// softcap. Additive, so dS passes through it unchanged (ds'/ds = 1); the slope
// itself gets no gradient.
struct AlibiScore {
  float slope = 0.0f;
  int diagonal_offset = 0;  // seqlen_k - seqlen_q of the sequence

  template <typename F>
  FA_HOST_DEVICE F bias(int i, int j) const {
    const int distance = i + diagonal_offset - j;
    return -F(slope) * F(distance < 0 ? -distance : distance);
  }
  template <typename F>
  FA_HOST_DEVICE F operator()(F s, int i, int j) const { return s + bias<F>(i, j); }
};

// Attention sink (gpt-oss): a logit z per query head that joins every row's
// softmax denominator and carries no value. With lse_k = log sum_j exp(s_j)
// over the row's keys (what the kernels compute without the sink):
//   lse = log(exp(lse_k) + exp(z))          (the lse every backend returns)
//   O   = O_k * exp(lse_k - lse)            (O_k = the keys-only softmax output)
//   P_j = exp(s_j - lse)                    (the backward's recomputation, unchanged)
// and since d lse / d z = P_z = exp(z - lse) and the sink has no value,
//   dL/dz = sum over rows of -P_z * D,  D = rowsum(dO * O) = sum_j P_j dP_j,
// while dS_j = P_j (dP_j - D) keeps its form. A row that sees no key gets
// lse = z, O = 0 and contributes 0 to dL/dz (D = 0).
struct AttentionSink {
  float logit;

  template <typename F>
  FA_HOST_DEVICE F lse(F lse_keys) const {
    const F z = F(logit);
    const F hi = lse_keys > z ? lse_keys : z, lo = lse_keys > z ? z : lse_keys;
    if (lo == -INFINITY) return hi;
    return hi + std::log1p(std::exp(lo - hi));
  }
  // exp(lse_k - lse): the factor from the keys-only output to the output.
  template <typename F>
  FA_HOST_DEVICE F output_factor(F lse_keys, F lse_with_sink) const {
    return lse_keys == -INFINITY ? F(0) : std::exp(lse_keys - lse_with_sink);
  }
  // One row's term of dL/dz: -exp(z - lse) * D.
  template <typename F>
  FA_HOST_DEVICE F grad_term(F lse_with_sink, F row_d) const {
    if (lse_with_sink == -INFINITY) return F(0);  // no key and a sink of -inf: P_z = 0
    return -std::exp(F(logit) - lse_with_sink) * row_d;
  }
};

}  // namespace flashattn
