// Rotary position embedding (RoPE), shared by the reference, the CPU backend
// and the CUDA append kernel.
//
// Pair i in [0, rotary_dim / 2) of a head vector x at position t is rotated by
// the angle whose cosine and sine are cos[t][i], sin[t][i]:
//   x0' = x0 cos - x1 sin,   x1' = x0 sin + x1 cos,
// where (x0, x1) = (x[2i], x[2i+1]) when interleaved (GPT-J), else
// (x[i], x[i + rotary_dim/2]) (GPT-NeoX). Columns from rotary_dim on are unchanged.
#pragma once

#include "attention/host_device.h"

namespace flashattn {

struct RotaryPair {
  int first;
  int second;
};

FA_HOST_DEVICE RotaryPair rotary_pair(int i, int rotary_dim, bool interleaved) {
  return interleaved ? RotaryPair{2 * i, 2 * i + 1} : RotaryPair{i, i + rotary_dim / 2};
}

// Column c (< rotary_dim) of the rotated vector; x(k) reads column k of the
// original, cos_of(i) / sin_of(i) the tables' row for the position.
template <typename T, typename XFn, typename CosFn, typename SinFn>
FA_HOST_DEVICE T rotated_element(int c, int rotary_dim, bool interleaved, XFn x, CosFn cos_of,
                                 SinFn sin_of) {
  const int half = rotary_dim / 2;
  const int i = interleaved ? c / 2 : c % half;
  const bool second = interleaved ? (c % 2 == 1) : (c >= half);
  const RotaryPair pair = rotary_pair(i, rotary_dim, interleaved);
  const T x0 = x(pair.first), x1 = x(pair.second), co = cos_of(i), si = sin_of(i);
  return second ? x0 * si + x1 * co : x0 * co - x1 * si;
}

// x (rotary_dim values at least) rotated in place.
template <typename T, typename CosFn, typename SinFn>
FA_HOST_DEVICE void rotate(T* x, int rotary_dim, bool interleaved, CosFn cos_of, SinFn sin_of) {
  auto original = [x](int k) { return x[k]; };
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const RotaryPair pair = rotary_pair(i, rotary_dim, interleaved);
    const T a = rotated_element<T>(pair.first, rotary_dim, interleaved, original, cos_of, sin_of);
    const T b = rotated_element<T>(pair.second, rotary_dim, interleaved, original, cos_of, sin_of);
    x[pair.first] = a;
    x[pair.second] = b;
  }
}

}  // namespace flashattn
