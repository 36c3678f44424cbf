// Dropout (attention/dropout.h) in the Hopper kernels: the policy types (a
// template argument of the forward and the backward kernel, so each kernel
// without dropout compiles to the code it had before dropout existed) and the
// keep bits on the two fragment layouts.
//
// The mask's Philox call (Dropout::fragment) covers a lane's 16 elements of a
// 16-query x 32-key block in the m16n8 accumulator layout (per warp also
// wgmma's m64nNk16): lane (g, t) holds queries g, g + 8 and keys 8 n + 2t + e.
// - The forward's S (queries as rows) has that layout: one call per 32-key
//   block a tile touches, no shuffles (mask_p_pairs).
// - The backward's S^T (keys as rows) has it transposed: lane (g', t') holds
//   keys kb0 + g', kb0 + g' + 8 (kb0 its warp's 16 keys, half a 32-key block)
//   and queries 8 i + 2t' + e'. Per block of 16 queries the lane needs 8 bits:
//   from the call (g = 2t' + e', t = g' / 2) the bits of its keys (n = kb0 %
//   32 / 8 + {0, 1}, e = g' % 2) and query halves hf, for e' = 0 and 1. The
//   32 calls (g, t) of a 16 x 16 block are one per lane: lane (g', t')
//   evaluates (g = 2t' + g' % 2, t = g' / 2), keeps the 4 bits of its own key
//   parity and hands the other 4 to lane (g' ^ 1, t') (lane ^ 4), whose key
//   has that parity and which needs exactly that call's queries (its e' is
//   g' % 2). One Philox call per 8 elements (the forward: 16; the other half
//   of each call is the other warp's 16 keys of the 32-key block), one
//   shuffle per 4 query blocks (transposed_keep_bits), a word's calls unrolled.
#pragma once

#include <cstdint>

#include "attention/dropout.h"

namespace flashattn::cuda::sm90 {

struct NoDropout {
  static constexpr bool kOn = false;
};
struct PhiloxDropout {
  static constexpr bool kOn = true;
};

// Byte k of the result is 0xFF where bit 7 of byte kSel_k of x is set, else 0
// (prmt's sign-replicating selector nibbles, 8 + byte).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t replicate_sign_bytes(uint32_t x) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(x), "n"(kSel));
  return r;
}

// The forward's keep flags of one key tile (keys n0 .. n0 + kBlockN - 1):
// Dropout::fragment_flags of each 32-key block the tile touches, for the
// lane's rows row0 = 16 rb + g and row0 + 8. kSkip: the n8 tiles of the
// tile's first block before n0 (0, or 2 when n0 is half-way into a block).
// NOTES: kBlockN is a multiple of 16, not always of 32 (80 at d 256, 112 at
// d 192, 176 for d 128's long-key tiles): such a tile starts on half a block
// every other tile and touches ceil(kBlockN / 32) blocks either way, one half
// of one unused (d 256: 3 calls for 2.5 blocks' keys).
template <int kBlockN>
struct TileKeepFlags {
  static constexpr int kTiles = kBlockN / 8;  // n8 tiles
  template <int kSkip>
  static constexpr int blocks() { return (kSkip + kTiles + 3) / 4; }
  uint32_t f[blocks<2>()][4];

  template <int kSkip>
  __device__ __forceinline__ void draw(const Dropout& d, int bh, int row0, int n0, int t) {
    static_assert(kBlockN % 16 == 0, "tiles start on whole or half 32-key blocks");
    const int rb = row0 / dropout::kBlockRows, g = row0 % 8;
    const int kb0 = n0 / dropout::kBlockKeys;
#pragma unroll
    for (int b = 0; b < blocks<kSkip>(); ++b) d.fragment_flags(bh, rb, g, kb0 + b, t, f[b]);
  }

  // P's 16-bit pairs ANDed with the keep masks, a dropped element's half set
  // to 0. pa[kt][j] holds row row0 + 8 r (r = j % 2) and keys n0 + 8 i + 2t +
  // {0, 1} (n8 tile i = 2 kt + j / 2), the halves of bytes 2 (n % 2) + {0, 1}
  // of flag word 2 r + n / 2 of the call of its 32-key block (n = its n8 tile
  // there): one prmt makes the pair's mask.
  template <int kSkip>
  __device__ __forceinline__ void apply(uint32_t (&pa)[kBlockN / 16][4]) const {
#pragma unroll
    for (int b = 0; b < blocks<kSkip>(); ++b) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int i = 4 * b + n - kSkip;
        if (i < 0 || i >= kTiles) continue;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t w = f[b][2 * r + n / 2];
          pa[i / 2][2 * (i % 2) + r] &= n % 2 ? replicate_sign_bytes<0xBBAA>(w) : replicate_sign_bytes<0x9988>(w);
        }
      }
    }
  }
};

// A lane's keep bits of its S^T fragment: element e of accumulator tile i
// (key key_r + 8 (e >> 1), query 8 i + 2 quad + (e & 1) of the span) is bit
// bit(i, e) of the words.
template <class K>
struct TransposedKeep {
  static constexpr int kBlocks = K::kSN / 16;  // 16-query blocks of the span
  static constexpr int kBitsPerBlock = 8;
  static constexpr int kWords = (kBlocks * kBitsPerBlock + 31) / 32;
  uint32_t w[kWords];

  // Bit of (block, hf = query half, r = key half, e' = query parity).
  __device__ __forceinline__ static constexpr int bit(int i, int e) {
    return (i / 2) * kBitsPerBlock + (i % 2) * 4 + (e >> 1) * 2 + (e & 1);
  }
  __device__ __forceinline__ bool kept(int i, int e) const {
    const int b = bit(i, e);
    return (w[b / 32] >> (b % 32)) & 1u;
  }
  // A copy of the words the compiler cannot see through (an empty asm), for
  // each of the two uses (dP^T and P^T's fragments): each then makes its own
  // selects from the word, none kept live from one use to the other.
  __device__ __forceinline__ TransposedKeep opaque() const {
    TransposedKeep k = *this;
#pragma unroll
    for (int i = 0; i < kWords; ++i) asm volatile("" : "+r"(k.w[i]));
    return k;
  }
};

// The 4 bits (hf, n0 + r) of fragment bits f >> s at hf * 8 + 2 r, to
// positions hf * 4 + 2 r (the query parity's bit left at 0).
__device__ __forceinline__ uint32_t gather_block_bits(uint32_t f, int s) {
  const uint32_t x = f >> s;
  return (x & 0x5u) | ((x >> 4) & 0x50u);
}

// bh = b * heads_q + h; query0: the first query of the lane's span (q0 + q_col,
// a multiple of 16); key_base: its warp's first key (a multiple of 16), g', t'
// the lane's. Every lane of the warp must call it (it shuffles).
template <class K>
__device__ __forceinline__ TransposedKeep<K> transposed_keep_bits(const Dropout& d, int bh, int query0,
                                                                  int key_base, int g, int t) {
  using Keep = TransposedKeep<K>;
  const int par = g & 1;
  const int rb0 = query0 / dropout::kBlockRows, kb = key_base / dropout::kBlockKeys;
  const int own_shift = dropout::fragment_bit(0, (key_base % dropout::kBlockKeys) / 8, par);
  const int call_g = 2 * t + par, call_t = g / 2;
  constexpr int kBlocksPerWord = 32 / Keep::kBitsPerBlock;
  Keep k;
#pragma unroll
  for (int w = 0; w < Keep::kWords; ++w) {
    uint32_t own = 0, send = 0;
    // NOTES: the word's calls unrolled, so their rounds interleave: a call
    // is a chain of 7 dependent multiply rounds, and one at a time (rolled)
    // the consumers stalled on each round's latency (ncu: the calls were
    // most of the dropout kernel's extra stall samples). Unrolled, d 128's
    // forward + backward with dropout ran 4-6% faster and its spill fell
    // from 60 to 28 bytes (docs/variants.md, "Dropout's cost").
#pragma unroll
    for (int b = 0; b < kBlocksPerWord && w * kBlocksPerWord + b < Keep::kBlocks; ++b) {
      const uint32_t f = d.fragment(bh, rb0 + w * kBlocksPerWord + b, call_g, kb, call_t);
      own |= gather_block_bits(f, own_shift) << (Keep::kBitsPerBlock * b);
      send |= gather_block_bits(f, own_shift ^ 1) << (Keep::kBitsPerBlock * b);
    }
    const uint32_t got = __shfl_xor_sync(0xffffffffu, send, 4);
    k.w[w] = (own << par) | (got << (1 - par));
    // Computed here, before the products' accumulators are live (the caller
    // calls it before the stage's wait): an empty asm the compiler keeps in
    // order with the wgmma asm after it, so the Philox rounds are not sunk to
    // where the bits are read.
    asm volatile("" : "+r"(k.w[w]));
  }
  return k;
}

}  // namespace flashattn::cuda::sm90
