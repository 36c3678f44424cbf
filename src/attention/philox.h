// Philox4x32-R (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011): a counter-based generator, host and device. Four
// 32-bit words of output per (counter, key), no state: any element's random
// bits are recomputed from its coordinates, which is how the backward sees the
// forward's dropout mask without storing it.
#pragma once

#include <cstdint>

#include "attention/host_device.h"

namespace flashattn {

struct Philox4x32 {
  uint32_t x[4];
};

namespace philox {
// The paper's multipliers and Weyl key increments (golden ratio, sqrt(3) - 1).
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
// The paper's default and Random123's known-answer vectors: 10 rounds.
constexpr int kDefaultRounds = 10;

FA_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// One round: two 32x32 -> 64 multiplies, the high halves xor-ed with the
// other words and the key, the words permuted.
FA_HOST_DEVICE Philox4x32 round(const Philox4x32& c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kM0, c.x[0], &hi0, &lo0);
  mul_hi_lo(kM1, c.x[2], &hi1, &lo1);
  return Philox4x32{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
}
}  // namespace philox

// Philox4x32-kRounds of counter c under key (k0, k1).
template <int kRounds = philox::kDefaultRounds>
FA_HOST_DEVICE Philox4x32 philox4x32(Philox4x32 c, uint32_t k0, uint32_t k1) {
FA_UNROLL
  for (int r = 0; r < kRounds; ++r) {
    c = philox::round(c, k0, k1);
    k0 += philox::kW0;
    k1 += philox::kW1;
  }
  return c;
}

}  // namespace flashattn
