// Host-side conversions between f32 and the 16-bit float formats, and typed
// element access, for the CPU backend, the reference and the tools.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.h"

namespace flashattn {

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Branch-free (so loops of it vectorize): the exponent and mantissa bits moved
// into f32 position and scaled by 2^(127-15) give every normal and subnormal
// value exactly; inf and NaN keep an all-ones exponent.
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7fffu;
  float scaled;
  const uint32_t shifted = magnitude << 13;
  std::memcpy(&scaled, &shifted, sizeof scaled);
  scaled *= 5.192296858534828e33f;  // 2^112
  uint32_t bits;
  std::memcpy(&bits, &scaled, sizeof bits);
  bits = magnitude >= 0x7c00u ? (shifted | 0x7f800000u) : bits;
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, with overflow to inf and gradual underflow.
inline uint16_t float_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                         // below fp16's smallest normal
    if (abs < 0x33000000u) return sign;            // rounds to 0
    // value = mantissa * 2^(exponent - 150); fp16's subnormal unit is 2^-24.
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t drop = 126 - exponent;  // in [14, 24]
    uint32_t q = mantissa >> drop;
    const uint32_t rem = mantissa & ((1u << drop) - 1);
    const uint32_t halfway = 1u << (drop - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits
  return sign | static_cast<uint16_t>(((r >> 13) - ((127 - 15) << 10)) & 0x7fffu);
}

inline size_t dtype_size(fa_dtype dtype) { return dtype == FA_F32 || dtype == FA_I32 ? 4 : 2; }

inline float load_as_float(const void* base, int64_t index, fa_dtype dtype) {
  switch (dtype) {
    case FA_F16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case FA_BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store_from_float(void* base, int64_t index, fa_dtype dtype, float value) {
  switch (dtype) {
    case FA_F16: static_cast<uint16_t*>(base)[index] = float_to_fp16(value); break;
    case FA_BF16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// The value a float becomes once stored in `dtype`.
inline float round_to_dtype(float value, fa_dtype dtype) {
  switch (dtype) {
    case FA_F16: return fp16_to_float(float_to_fp16(value));
    case FA_BF16: return bf16_to_float(float_to_bf16(value));
    default: return value;
  }
}

}  // namespace flashattn
