// Score modifiers: what happens to a score s = scale * q.k before the mask and
// the softmax, with the derivative the backward needs, in one place for the
// float64 reference, the CPU backend and every kernel. A modifier is a small
// policy type; the options select it at run time.
//
//   identity   s' = s                      ds'/ds = 1
//   softcap    s' = c tanh(s / c)          ds'/ds = 1 - (s' / c)^2
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

}  // namespace flashattn
