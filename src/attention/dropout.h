// Dropout on the attention probabilities (flash-attn 2.x semantics): after the
// softmax, P_ij is kept with probability 1 - p and scaled by z = 1 / (1 - p),
// or set to 0. The normalizer (and the lse) is the one before dropout.
//
// p is rounded to 8 bits: threshold8 = min(round(p * 256), 255), and the
// probability used is p8 = threshold8 / 256 (flash-attn's kernels make the same
// 8-bit choice). The scale is z = 256 / (256 - threshold8) = 1 / (1 - p8), so
// E[z * keep] = 1 exactly; a p that rounds to 0 means no dropout.
//
// The keep bit of (sequence b, query head h, row i, key j), i and j counted
// within the sequence, is a pure function of those coordinates and the
// caller's (seed, offset). One Philox4x32-7 call (dropout::kPhiloxRounds)
// gives 16 bytes, 16 keep decisions:
//   counter = ((j / 32) * 4 + (j % 8) / 2,  (i / 16) * 8 + i % 8,
//              b * heads_q + h,  offset mod 2^32)
//   key     = (seed mod 2^32, seed / 2^32 + offset / 2^32)
//   byte    = ((i % 16) / 8) * 8 + ((j % 32) / 8) * 2 + j % 2
//             (of the 16 output bytes: word byte / 4, little-endian)
//   keep    = byte >= threshold8
// NOTES: the layout is that of a warp's m16 x n8 MMA accumulator fragment
// (mma.sync, and per warp wgmma's m64nNk16): lane (g = lane / 4, t = lane % 4)
// holds rows g, g + 8 and keys 8 n + 2 t + {0, 1}. Within a 16-row x 32-key
// block, (j % 8) / 2 is t, i % 8 is g, (i % 16) / 8 the row half hf and
// (j % 32) / 8 the n8 tile n: one call gives exactly a lane's 16 elements of
// the block (rows {g, g + 8} x keys {8 n + 2 t + e : n < 4, e < 2}), so no
// lane shuffles and no random bit is wasted. The forward, the backward and the
// reference all evaluate this, so they see one mask without storing it.
//
// Backward (z_j = keep_j / (1 - p8), O = sum_j P_j z_j V_j):
//   dV_j += P_j z_j dO      dS_j = P_j (z_j dP_j - D),  D = rowsum(dO * O)
#pragma once

#include <cstdint>

#include "attention/host_device.h"
#include "attention/philox.h"

namespace flashattn {

namespace dropout {
// The fragment a Philox call covers: 16 rows x 32 keys of the sequence.
constexpr int kBlockRows = 16;
constexpr int kBlockKeys = 32;
// 8-bit random values: p is rounded to a multiple of 1 / kLevels.
constexpr int kLevels = 256;
// NOTES: 7 rounds, not the generator's default 10: the Philox paper finds
// Philox4x32 Crush-resistant (TestU01's BigCrush passes) from 7 rounds and
// adds 3 as a safety margin, and the rounds are most of dropout's cost on
// kernels near their issue limit (docs/variants.md, "Dropout's cost").
// flash-attn 2's dropout draws with 7 rounds as well.
constexpr int kPhiloxRounds = 7;

// Bit (hf * 8 + 2 n + e) of a fragment word: row g + 8 hf, key 8 n + 2 t + e.
FA_HOST_DEVICE constexpr int fragment_bit(int hf, int n, int e) { return hf * 8 + 2 * n + e; }

// Bit 7 of byte k of the result is 1 where byte k of w is >= the threshold
// T (the other bits 0), given a7 = (256 - T) & 0x7f and a_hi = (256 - T) &
// 0x80, each repeated in every byte: byte + (256 - T) carries out of bit 7
// exactly when byte >= T.
// NOTES: SWAR: the low 7 bits of each byte are added without crossing into the
// next byte, bit 7's carry-out is then majority(x7, a7, carry-in). About 4
// instructions per word against 4 byte compares.
FA_HOST_DEVICE uint32_t bytes_at_least(uint32_t w, uint32_t a7, uint32_t a_hi) {
  constexpr uint32_t kLow7 = 0x7f7f7f7fu, kHigh = 0x80808080u;
  const uint32_t low = (w & kLow7) + a7;
  return ((w & a_hi) | ((w | a_hi) & low)) & kHigh;
}

// Bit k (k < 4) of the result: bit 7 of byte k of flags (a multiply gathers
// bits 7, 15, 23, 31 to 28..31; no two of its products overlap).
FA_HOST_DEVICE uint32_t gather_byte_flags(uint32_t flags) {
  constexpr uint32_t kGather = 0x00204081u;
  return (flags * kGather) >> 28;
}
}  // namespace dropout

struct Dropout {
  uint32_t threshold8 = 0;  // min(round(p * 256), 255): a byte below it drops; 0: no dropout
  float scale = 1.0f;       // z = 256 / (256 - threshold8)
  uint32_t k0 = 0, k1 = 0, offset = 0;

  // p in [0, 1); seed and offset as the caller gives them.
  static Dropout make(float p, uint64_t seed, uint64_t offset) {
    Dropout d;
    const double t = static_cast<double>(p) * dropout::kLevels + 0.5;
    d.threshold8 = t >= dropout::kLevels - 1 ? dropout::kLevels - 1 : static_cast<uint32_t>(t);
    d.scale = static_cast<float>(dropout::kLevels) / static_cast<float>(dropout::kLevels - d.threshold8);
    d.k0 = static_cast<uint32_t>(seed);
    d.k1 = static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(offset >> 32);
    d.offset = static_cast<uint32_t>(offset);
    return d;
  }
  FA_HOST_DEVICE bool enabled() const { return threshold8 != 0; }
  // The rounded p the mask draws with: threshold8 / 256.
  double rounded_p() const { return static_cast<double>(threshold8) / dropout::kLevels; }

  // The 16 random bytes of lane (g, t) of row block rb (rows 16 rb ..) and key
  // block kb (keys 32 kb ..); bh = b * heads_q + h.
  FA_HOST_DEVICE Philox4x32 bytes16(int bh, int rb, int g, int kb, int t) const {
    const Philox4x32 c{{static_cast<uint32_t>(kb * 4 + t), static_cast<uint32_t>(rb * 8 + g),
                        static_cast<uint32_t>(bh), offset}};
    return philox4x32<dropout::kPhiloxRounds>(c, k0, k1);
  }

  // The keep decisions of lane (g, t) in the 16 x 32 block (rb, kb) as byte
  // flags: bit 7 of byte b of the 16 (word b / 4) is set where byte b keeps
  // (b = dropout::fragment_bit(hf, n, e): row 16 rb + g + 8 hf, key
  // 32 kb + 8 n + 2 t + e), the other bits are 0. One Philox call.
  FA_HOST_DEVICE void fragment_flags(int bh, int rb, int g, int kb, int t, uint32_t (&flags)[4]) const {
    const Philox4x32 r = bytes16(bh, rb, g, kb, t);
    const uint32_t a = dropout::kLevels - threshold8;
    const uint32_t a7 = (a & 0x7fu) * 0x01010101u, a_hi = (a & 0x80u) * 0x01010101u;
FA_UNROLL
    for (int w = 0; w < 4; ++w) flags[w] = dropout::bytes_at_least(r.x[w], a7, a_hi);
  }

  // The same as 16 bits: bit dropout::fragment_bit(hf, n, e) keeps row
  // 16 rb + g + 8 hf, key 32 kb + 8 n + 2 t + e. What every kernel uses
  // (the Hopper forward takes the flags themselves).
  FA_HOST_DEVICE uint32_t fragment(int bh, int rb, int g, int kb, int t) const {
    uint32_t flags[4];
    fragment_flags(bh, rb, g, kb, t, flags);
    uint32_t bits = 0;
    // Word w holds bytes 4 w .. 4 w + 3, i.e. fragment bits 4 w .. 4 w + 3.
FA_UNROLL
    for (int w = 0; w < 4; ++w) bits |= dropout::gather_byte_flags(flags[w]) << (4 * w);
    return bits;
  }

  // keep(b * heads_q + h, i, j), straight from the definition (one byte of a
  // Philox call compared with threshold8): the reference's and the tests' view.
  FA_HOST_DEVICE bool keep(int bh, int i, int j) const {
    const Philox4x32 r = bytes16(bh, i / dropout::kBlockRows, i % 8, j / dropout::kBlockKeys, (j % 8) / 2);
    const int byte = dropout::fragment_bit((i % dropout::kBlockRows) / 8, (j % dropout::kBlockKeys) / 8, j % 2);
    return ((r.x[byte / 4] >> (8 * (byte % 4))) & 0xffu) >= threshold8;
  }
  // The factor z_ij: 256 / (256 - threshold8) where kept, 0 where dropped.
  FA_HOST_DEVICE float factor(int bh, int i, int j) const { return keep(bh, i, j) ? scale : 0.0f; }
};

}  // namespace flashattn
