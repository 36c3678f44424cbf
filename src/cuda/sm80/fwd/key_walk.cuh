// Which key tiles an sm80 forward CTA walks, as a small policy type of the
// kernel (launch.cuh picks one per call):
//   DenseKeys   every tile of the element mask's range: walk step j is tile
//               n_first + j (the kernel without a block mask, unchanged)
//   ListedKeys  only the tiles of that range that hold a listed (query block,
//               key block) pair of the CTA's rows (block_sparse.cuh): walk
//               step j is the CTA's j-th entry, so the loads' prefetch of step
//               j + stages - 1 is the next visited tile; inside a visited tile
//               that is not full, keys of blocks the row's query block does
//               not list get -inf (the masked body, after the element mask,
//               from a bit matrix the CTA writes for the step).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/block_sparse.cuh"
#include "cuda/sm80/fwd/mainloop.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/traits.h"
#include "cuda/sm80/fwd/tuning.h"

namespace flashattn::cuda::sm80 {

struct DenseKeys {
  struct Tiles {};
  static constexpr bool kListed = false;
  template <class Cfg>
  static constexpr int smem_bytes() {
    return 0;
  }
  template <class K, typename T>
  __device__ __forceinline__ static void plan(const AttentionParams&, const Tiles&, FwdCta<T>&) {}
  template <typename T>
  __device__ __forceinline__ static int tile(const Tiles&, const FwdCta<T>& cta, int j) {
    return cta.n_first + j;
  }
  template <typename T>
  __device__ __forceinline__ static bool partial(const Tiles&, const FwdCta<T>&, int) {
    return false;
  }
  template <class K, typename T>
  __device__ __forceinline__ static void mark_listed(const AttentionParams&, const Tiles&, const FwdCta<T>&,
                                                     int, int, int) {}
  template <class K>
  __device__ __forceinline__ static void drop_unlisted(Scores<K>&, const FwdThread&, int) {}
};

// NOTES: in a tile that is not full, which of the tile's pairs are listed is
// written to shared memory (two buffers, alternating by step, after the K/V
// slots) by the whole CTA before the step's barrier, one word per (row, warp
// half, lane column t) holding exactly that thread's keys of the row (bit
// 2 nt + e: key key_off + 8 nt + 2 t + e), so the masked body reads one word
// per row and tests constant bits. Per-score tests (a global load and a
// division per score, or a bit matrix by key) inside the masked body, where
// S, O and P are live, spilled 16 to 140 bytes at d 64 / 128 / 256.
struct ListedKeys {
  using Tiles = BlockTiles;
  static constexpr bool kListed = true;
  template <class Cfg>
  static constexpr int kSplit = Cfg::kPairSplit ? 2 : 1;
  template <class Cfg>
  static constexpr int kWords = Cfg::kBlockM * kSplit<Cfg> * 4;  // (row, half, t)
  template <class Cfg>
  static constexpr int smem_bytes() {
    return 2 * kWords<Cfg> * static_cast<int>(sizeof(uint32_t));
  }
  template <class K>
  __device__ __forceinline__ static uint32_t* words(int j) {
    constexpr int kBase = forward_smem_bytes<typename K::Tune>(K::kHeadDim);
    return reinterpret_cast<uint32_t*>(smem + kBase) + (j & 1) * kWords<typename K::Tune>;
  }

  // The CTA's entries among the element mask's key tiles [n_first, n_first + n_tiles).
  template <class K, typename T>
  __device__ __forceinline__ static void plan(const AttentionParams& p, const BlockTiles& tiles, FwdCta<T>& cta) {
    int last = 0;
    tiles.key_tiles.range(BlockTiles::list_row(p.block_mask, cta.b, cta.h), cta.m0 / K::kM, cta.n_first,
                          cta.n_first + cta.n_tiles, &cta.first_entry, &last);
    cta.n_tiles = last - cta.first_entry;
  }
  template <typename T>
  __device__ __forceinline__ static int tile(const BlockTiles& tiles, const FwdCta<T>& cta, int j) {
    return TileList::index(tiles.key_tiles.entries[cta.first_entry + j]);
  }
  template <typename T>
  __device__ __forceinline__ static bool partial(const BlockTiles& tiles, const FwdCta<T>& cta, int j) {
    return !TileList::full(tiles.key_tiles.entries[cta.first_entry + j]);
  }

  // Step j (keys from n0) not full: bit 2 nt + e of word (row r, half, t)
  // set when row m0 + r and key n0 + half * kWarpKeys + 8 nt + 2 t + e lie in a
  // listed block pair (past the sequence: clear, the element mask drops them
  // anyway). Called by every thread before the step's barrier (await_tile).
  template <class K, typename T>
  __device__ __forceinline__ static void mark_listed(const AttentionParams& p, const BlockTiles& tiles,
                                                     const FwdCta<T>& cta, int tid, int j, int n0) {
    if (!partial(tiles, cta, j)) return;
    static_assert(2 * K::kNT <= 32, "a thread's keys of a row in one word");
    constexpr int kSplitN = kSplit<typename K::Tune>;
    const BlockMaskView& m = p.block_mask;
    const int64_t list_row = BlockTiles::list_row(m, cta.b, cta.h);
    uint32_t* const out = words<K>(j);
    for (int w = tid; w < kWords<typename K::Tune>; w += K::kThreads) {
      const int row = cta.m0 + w / (kSplitN * 4), half = w / 4 % kSplitN, t = w % 4;
      uint32_t bits = 0;
      if (row < cta.seq.seqlen_q) {
        const uint32_t* listed = tiles.blocks.row_bits(m, list_row, row);
        for (int i = 0; i < 2 * K::kNT; ++i) {
          const int col = n0 + half * K::kWarpKeys + 8 * (i / 2) + 2 * t + i % 2;
          if (col < cta.seq.seqlen_k && ListedBlocks::listed(listed, col / m.block_k)) bits |= 1u << i;
        }
      }
      out[w] = bits;
    }
  }
  // The masked body of step j, when not full: scores whose bit is clear -> -inf.
  template <class K>
  __device__ __forceinline__ static void drop_unlisted(Scores<K>& s, const FwdThread& th, int j) {
    constexpr int kSplitN = kSplit<typename K::Tune>;
    const uint32_t* const mine = words<K>(j) + th.half * 4 + th.t;
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t w = mine[(th.warp_row + mt * 16 + th.g + hf * 8) * kSplitN * 4];
#pragma unroll
        for (int nt = 0; nt < K::kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (((w >> (2 * nt + e)) & 1u) == 0) s[mt][nt][2 * hf + e] = -INFINITY;
      }
  }
};

}  // namespace flashattn::cuda::sm80
