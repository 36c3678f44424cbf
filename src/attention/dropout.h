// Dropout on the attention probabilities (flash-attn 2.x semantics): after the
// softmax, P_ij is kept with probability 1 - p and scaled by 1 / (1 - p), or
// set to 0. The normalizer (and the lse) is the one before dropout.
//
// The keep bit of (sequence b, query head h, row i, key j) is a pure function
// of those coordinates and the caller's (seed, offset): Philox4x32-10 of
//   counter = (j / 4, i, b * heads_q + h, offset mod 2^32)
//   key     = (seed mod 2^32, seed / 2^32 + offset / 2^32)
// gives four words for keys 4 (j / 4) .. 4 (j / 4) + 3; key j keeps when word
// j % 4 >= threshold = round(p 2^32). The forward, the backward and the
// reference all evaluate this, so they see one mask without storing it.
//
// Backward (z_j = keep_j / (1 - p), O = sum_j P_j z_j V_j):
//   dV_j += P_j z_j dO      dS_j = P_j (z_j dP_j - D),  D = rowsum(dO * O)
#pragma once

#include <cstdint>

#include "attention/host_device.h"
#include "attention/philox.h"

namespace flashattn {

struct Dropout {
  uint32_t threshold = 0;  // round(p * 2^32): a word below it drops
  float scale = 1.0f;      // 1 / (1 - p)
  uint32_t k0 = 0, k1 = 0, offset = 0;

  // p in [0, 1); seed and offset as the caller gives them.
  static Dropout make(float p, uint64_t seed, uint64_t offset) {
    Dropout d;
    const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
    d.threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
    d.scale = 1.0f / (1.0f - p);
    d.k0 = static_cast<uint32_t>(seed);
    d.k1 = static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(offset >> 32);
    d.offset = static_cast<uint32_t>(offset);
    return d;
  }
  FA_HOST_DEVICE bool enabled() const { return threshold != 0; }

  // The four keep bits of keys 4 q .. 4 q + 3 of row i (bit e for key 4 q + e).
  FA_HOST_DEVICE unsigned keep4(int bh, int i, int q) const {
    const Philox4x32 r = philox4x32_10(
        Philox4x32{{static_cast<uint32_t>(q), static_cast<uint32_t>(i), static_cast<uint32_t>(bh), offset}}, k0, k1);
    unsigned bits = 0;
FA_UNROLL
    for (int e = 0; e < 4; ++e) bits |= (r.x[e] >= threshold ? 1u : 0u) << e;
    return bits;
  }
  // bh = b * heads_q + h.
  FA_HOST_DEVICE bool keep(int bh, int i, int j) const { return (keep4(bh, i, j >> 2) >> (j & 3)) & 1u; }
  // The factor z_ij: 1 / (1 - p) where kept, 0 where dropped.
  FA_HOST_DEVICE float factor(int bh, int i, int j) const { return keep(bh, i, j) ? scale : 0.0f; }
};

}  // namespace flashattn
