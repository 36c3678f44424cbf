// Which query tiles an sm80 backward CTA (one key tile of one kv head) walks,
// as a small policy type of the kernel (run_main picks one per call), like
// the forward's key walk (sm80/fwd/key_walk.cuh):
//   DenseQueries   every query tile of the element mask's range, for each
//                  query head of the group: step it is head it / n_m, tile
//                  m_begin + it % n_m (the kernel without a block mask,
//                  unchanged: its per-element code has no block test)
//   ListedQueries  only the query tiles that list the key tile
//                  (block_sparse.cuh, ListedQueryTiles); a step not full in
//                  the lists also drops, per element, the keys of blocks the
//                  row's query block does not list
// A CTA builds its walk once (Walk::Cta) and asks it for steps, for the listed
// pairs of a warp's S/dP slice, and for the deterministic dQ order's
// predecessor.
#pragma once

#include <cstdint>

#include "core/layout.h"
#include "core/params.h"
#include "cuda/common/block_sparse.cuh"

namespace flashattn::cuda::bwd {

// A step of a key tile's walk: query head h, query tile m; full: no pair of
// the tile is cut by the block mask (always, without one).
struct QueryStep {
  int h, m;
  bool full;
};

// Where a CTA sits: sequence b, kv head hk (query heads hk * group + g),
// key tile n_tile, and the element mask's query tiles [m_begin, m_end).
struct WalkPlace {
  int b, hk, group, n_tile, m_begin, m_end;
};

// The block test of a lane's part of a warp's S/dP slice (MT m16 x NT n8
// tiles: rows g, g + 8 of each m16 tile, keys 8 ni + 2t + e): listed(mi,
// half, 2 ni + e) when the pair's blocks are listed. Without a block mask
// every pair is (compiles away).
struct EveryPair {
  __device__ __forceinline__ static constexpr bool listed(int, int, int) { return true; }
};
template <int MT>
struct ListedPairs {
  uint32_t words[MT][2];  // bit 2 ni + e of rows g + 8 half of m16 tile mi
  __device__ __forceinline__ bool listed(int mi, int half, int bit) const { return (words[mi][half] >> bit) & 1u; }
};

struct DenseQueries {
  struct Tiles {};
  static constexpr bool kListed = false;
  // NOTES: step() computes hk * group where it is used, as the kernel did
  // before the policy: a first head kept from the start (h0) moved ptxas's
  // schedule (different SASS, same instructions).
  struct Cta {
    int hk, group, n_m, m_begin, iters;
    __device__ __forceinline__ Cta(const AttentionParams&, const Tiles&, const WalkPlace& at)
        : hk(at.hk),
          group(at.group),
          n_m(max(0, at.m_end - at.m_begin)),
          m_begin(at.m_begin),
          iters(n_m * at.group) {}
    __device__ __forceinline__ int count() const { return iters; }
    __device__ __forceinline__ QueryStep step(int it) const {
      return {hk * group + it / n_m, m_begin + it % n_m, true};
    }
    template <int MT, int NT>
    __device__ __forceinline__ static EveryPair slice_pairs(int, int, int, bool, const SequenceInfo&) {
      return {};
    }
    // Deterministic mode: this tile adds its dQ share of (h, m) after key
    // tile key_tile_before() + 1 has (wait_for_predecessor): the next one up.
    __device__ __forceinline__ static int key_tile_before(int, int, int n_tile, int) { return n_tile; }
  };
};

struct ListedQueries {
  using Tiles = BlockTiles;
  static constexpr bool kListed = true;
  struct Cta {
    const AttentionParams& p;
    const BlockTiles& tiles;
    ListedQueryTiles listed;
    int b, iters;
    __device__ __forceinline__ Cta(const AttentionParams& params, const BlockTiles& t, const WalkPlace& at)
        : p(params),
          tiles(t),
          listed{t.query_tiles, params.block_mask, at.b, at.hk * at.group, at.group, at.n_tile, at.m_begin,
                 max(at.m_begin, at.m_end)},
          b(at.b),
          iters(listed.count()) {}
    __device__ __forceinline__ int count() const { return iters; }
    __device__ __forceinline__ QueryStep step(int it) const {
      QueryStep s{0, 0, true};
      int32_t entry = 0;
      listed.locate(it, &s.h, &entry);
      s.m = TileList::index(entry);
      s.full = TileList::full(entry);
      return s;
    }
    // The slice's pairs of query head h: rows row_g + 16 mi + 8 half, keys
    // key_t + 8 ni + e (bits 2 ni + e). A full step lists every pair; rows
    // and keys past the sequence are left listed (the element mask drops
    // them) and their blocks unread.
    // NOTES: computed before S and dP are live, as dropout's keep bits: a
    // test per score inside scores_to_p_ds (a division by block_k and a load
    // each, the row pointer held across the step) spilled 20 bytes at d 256
    // in the sm_80 build.
    template <int MT, int NT>
    __device__ __forceinline__ ListedPairs<MT> slice_pairs(int h, int row_g, int key_t, bool full,
                                                           const SequenceInfo& seq) const {
      static_assert(2 * NT <= 32, "a row's keys of the slice in one word");
      ListedPairs<MT> out;
      const BlockMaskView& m = p.block_mask;
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row_g + 16 * mi + 8 * half;
          uint32_t w = ~0u;
          if (!full && tiles.blocks.bits != nullptr && i < seq.seqlen_q) {
            const uint32_t* row = tiles.blocks.row_bits(m, list_row(h), i);
#pragma unroll
            for (int bit = 0; bit < 2 * NT; ++bit) {
              const int key = key_t + 8 * (bit / 2) + bit % 2;
              if (key < seq.seqlen_k && !ListedBlocks::listed(row, key / m.block_k)) w &= ~(1u << bit);
            }
          }
          out.words[mi][half] = w;
        }
      return out;
    }
    __device__ __forceinline__ int64_t list_row(int h) const { return BlockTiles::list_row(p.block_mask, b, h); }
    // The next-higher key tile listing (h, m), minus one (none: the key tile
    // count); searched in deterministic mode only.
    __device__ __forceinline__ int key_tile_before(int h, int m, int n_tile, int none) const {
      if (!p.deterministic) return n_tile;
      return next_key_tile(tiles.key_tiles, list_row(h), m, n_tile, none) - 1;
    }
  };
};

}  // namespace flashattn::cuda::bwd
