// The few transcendental functions every backend's softmax is written with,
// host and device: on the GPU one SFU instruction each (no range checks, no
// branches), on the host the C++ library's.
#pragma once

#include <cmath>

#include "attention/host_device.h"
#include "core/numeric.h"

namespace flashattn {

// 2^x (device: ex2.approx, ~2 ulp, denormal results flushed to 0, 2^-inf = +0).
FA_HOST_DEVICE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// tanh(x) (device: 1 - 2 / (2^(2x log2 e) + 1), one ex2 and one fast
// reciprocal, no branch; +-inf -> +-1, NaN stays NaN, absolute error ~1e-7).
// NOTES: libm's tanhf branches on |x|: in the Hopper forward its softcap pass
// was 1026 SASS instructions per d128 key tile (385 with this form) and the
// kernel's register peak.
// log2(x), approximate (one MUFU op on the GPU; subnormals flush to zero).
FA_HOST_DEVICE float fast_log2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::log2(x);
#endif
}

FA_HOST_DEVICE float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return 1.0f - __fdividef(2.0f, fast_exp2(x * (2.0f * kLog2e)) + 1.0f);
#else
  return std::tanh(x);
#endif
}

}  // namespace flashattn
