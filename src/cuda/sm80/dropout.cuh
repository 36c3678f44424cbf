// Dropout (attention/dropout.h) on the mma.sync accumulator layout, shared by
// the sm80 forward and backward.
//
// A lane of an m16n8 accumulator tile holds keys key0 + 8 nt + 2t + {0, 1} of
// rows g and g + 8 (g = lane / 4, t = lane % 4). The mask's definition follows
// that layout: one Philox call (Dropout::fragment) gives a lane's 16 keep bits
// of a 16-row x 32-key block, four n8 tiles of both its rows. No shuffles.
#pragma once

#include <cstdint>

#include "attention/dropout.h"

namespace flashattn::cuda::sm80 {

// Keep bits of a lane's part of one m16 x (8 NT) block: bit 2 nt + e of
// bits[hf] keeps key key0 + 8 nt + 2t + e of row row_g + 8 hf; row_g = 16 rb +
// g (an m16 tile starts on a multiple of 16). key0 is a multiple of 32 with NT
// a multiple of 4 (NT / 4 Philox calls), or NT == 2 and key0 a multiple of 16:
// half a 32-key block (d 256's pair split, 16 keys per warp; half the call's
// bits are unused). kUnroll: Philox calls unrolled (register pressure
// decides; see the callers).
template <int NT, int kUnroll = (NT + 3) / 4>
__device__ __forceinline__ void dropout_keep_bits(const Dropout& d, int bh, int row_g, int key0, int t,
                                                  uint32_t (&bits)[2]) {
  static_assert(NT <= 16, "two bits per n8 tile in one word");
  static_assert(NT % 4 == 0 || NT == 2, "whole 32-key blocks, or half of one");
  constexpr int kRowBits = 8;  // a fragment's bits of one row (hf)
  const int rb = row_g / dropout::kBlockRows, g = row_g % 8;
  const int kb0 = key0 / dropout::kBlockKeys;
  if constexpr (NT % 4 == 0) {
    bits[0] = bits[1] = 0;
#pragma unroll(kUnroll)
    for (int kb = 0; kb < NT / 4; ++kb) {
      const uint32_t f = d.fragment(bh, rb, g, kb0 + kb, t);
      bits[0] |= (f & 0xffu) << (kRowBits * kb);
      bits[1] |= (f >> kRowBits) << (kRowBits * kb);
    }
  } else {
    // n8 tiles 2, 3 of the block when key0 is its second half.
    const int shift = dropout::fragment_bit(0, (key0 % dropout::kBlockKeys) / 8, 0);
    const uint32_t f = d.fragment(bh, rb, g, kb0, t);
    bits[0] = (f >> shift) & 0xfu;
    bits[1] = (f >> (kRowBits + shift)) & 0xfu;
  }
}

// The dropout factor z of bit `bit` of a keep word: 1 / (1 - p) or 0.
__device__ __forceinline__ float dropout_factor(uint32_t word, int bit, float scale) {
  return (word >> bit) & 1u ? scale : 0.0f;
}

// The forward's per-tile policies (online_softmax applies them to P after the
// row sum, before P is packed to 16 bits).

// No dropout: nothing to apply; compiles away.
struct NoDropoutTile {
  __device__ __forceinline__ void apply(float&, float&, int, int, int) const {}
};

// Keep bits of a warp's S tile (MT m16 tiles): p0, p1 of (mt, nt, hf) times z.
template <int MT>
struct DropoutTile {
  uint32_t bits[MT][2];
  float scale;
  __device__ __forceinline__ void apply(float& p0, float& p1, int mt, int nt, int hf) const {
    p0 *= dropout_factor(bits[mt][hf], 2 * nt, scale);
    p1 *= dropout_factor(bits[mt][hf], 2 * nt + 1, scale);
  }
};

// The kernels' dropout policy: a template argument of the forward and the
// backward kernel, so each kernel without dropout compiles to the same code
// as before dropout existed. The forward's tile() gives the factors of a
// warp's S tile: bh = b * heads_q + h, row_g = the sequence row of the lane's
// row g in its first m16 tile, key0 = the warp's first key (no state: the
// kernel passes values it holds anyway).
struct NoDropout {
  static constexpr bool kOn = false;
  template <class K>
  __device__ __forceinline__ static NoDropoutTile tile(const Dropout&, int, int, int, int) {
    return {};
  }
};

struct PhiloxDropout {
  static constexpr bool kOn = true;
  template <class K>
  __device__ __forceinline__ static DropoutTile<K::kMT> tile(const Dropout& d, int bh, int row_g, int key0, int t) {
    DropoutTile<K::kMT> z;
    z.scale = d.scale;
    // NOTES: one Philox call at a time (rolled): unrolled, ptxas interleaved
    // several and the forward spilled (d 64 by 64 bytes at 128 x 128, with
    // the earlier mask of one call per 4 elements).
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt) dropout_keep_bits<K::kNT, 1>(d, bh, row_g + 16 * mt, key0, t, z.bits[mt]);
    return z;
  }
};

}  // namespace flashattn::cuda::sm80
