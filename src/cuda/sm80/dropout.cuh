// Dropout (attention/dropout.h) on the mma.sync accumulator layout, shared by
// the sm80 forward and backward.
//
// A lane of an m16n8 accumulator tile holds keys key0 + 8 nt + 2t + {0, 1} of
// rows g and g + 8 (g = lane / 4, t = lane % 4). One Philox call gives the keep
// bits of four adjacent keys of one row; lanes t and t ^ 1 cover the same four
// keys (2t + {0, 1} for even t, the other two for odd t), so the pair splits
// the work: the even lane evaluates row g, the odd lane row g + 8, and each
// hands the other the two bits of the other's keys (one shuffle per m16 tile).
// Every Philox word is computed once per warp, none is wasted.
#pragma once

#include <cstdint>

#include "attention/dropout.h"

namespace flashattn::cuda::sm80 {

// Keep bits of a lane's part of one m16 x (8 NT) block: bit 2 nt + e of
// bits[hf] keeps key key0 + 8 nt + 2t + e of row row_g + 8 hf. key0 must be a
// multiple of 4 (the keys of a lane pair then share one Philox call); every
// lane of the warp must call it (it shuffles). kUnroll: Philox calls unrolled
// (register pressure decides; see the callers).
template <int NT, int kUnroll = NT>
__device__ __forceinline__ void dropout_keep_bits(const Dropout& d, int bh, int row_g, int key0, int t,
                                                  uint32_t (&bits)[2]) {
  static_assert(NT <= 16, "two bits per n8 tile in one word");
  const int odd = t & 1;
  const int row = row_g + 8 * odd;
  const int group0 = (key0 >> 2) + (t >> 1);  // Philox counter word 0 of n8 tile 0
  uint32_t own = 0, other = 0;
#pragma unroll(kUnroll)
  for (int nt = 0; nt < NT; ++nt) {
    const unsigned w = d.keep4(bh, row, group0 + 2 * nt);
    own |= ((w >> (2 * odd)) & 3u) << (2 * nt);
    other |= ((w >> (2 - 2 * odd)) & 3u) << (2 * nt);
  }
  const uint32_t got = __shfl_xor_sync(0xffffffffu, other, 1);
  bits[0] = odd ? got : own;
  bits[1] = odd ? own : got;
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
    // several and the forward spilled (d 64 by 64 bytes at 128 x 128).
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt) dropout_keep_bits<K::kNT, 1>(d, bh, row_g + 16 * mt, key0, t, z.bits[mt]);
    return z;
  }
};

}  // namespace flashattn::cuda::sm80
