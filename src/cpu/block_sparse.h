// The CPU backend's view of a block mask (fa_block_mask): which of its own
// tiles (kBlockQ x kBlockK, unrelated to the mask's block_q x block_k) a work
// item visits, and which pairs of a visited tile the mask lets through.
//
// NOTES: the caller's lists are normalized once per call into sorted rows
// (CSR: per (list batch, list head, query block) the listed key blocks,
// partial and full merged since both take the element mask), and for the
// backward transposed (per key block the query blocks that list it): the
// dK/dV pass walks query tiles for a key tile. A CPU tile is visited when one
// of its (query block, key block) pairs is listed; inside it `TileMask` tests
// the pairs, and a tile whose pairs are all listed is the dense tile exactly
// (same class, same arithmetic), so a mask that lists every block gives the
// dense result bitwise.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/mask.h"
#include "core/params.h"
#include "cpu/tiles.h"

namespace flashattn::cpu {

// Per-work-item buffers of the block-sparse walk.
struct BlockScratch {
  std::vector<uint8_t> visit;    // one flag per CPU tile along the walked dimension
  std::vector<uint8_t> allowed;  // kBlockQ x kBlockK
  std::vector<uint8_t> keys;     // kBlockK: keys of a tile some listed block holds
  BlockScratch() : allowed(kBlockQ * kBlockK), keys(kBlockK) {}
};

class BlockLists {
 public:
  // Normalized lists of p's block mask (none when it has none); `transpose`
  // also builds the per-key-block lists the backward's dK/dV pass walks.
  BlockLists(const AttentionParams& p, bool transpose);
  bool enabled() const { return m_.enabled(); }

  // visit[t] = 1 for the key tiles (of kBlockK keys, t < visit.size()) that a
  // listed block of query rows [q0, q0 + rows) of (sequence b, head h) touches.
  void mark_key_tiles(int b, int h, int q0, int rows, std::vector<uint8_t>& visit) const;
  // visit[t] = 1 for the query tiles (of kBlockQ rows) that list a key block of
  // keys [k0, k0 + cols); needs `transpose`.
  void mark_query_tiles(int b, int h, int k0, int cols, std::vector<uint8_t>& visit) const;
  // The visibility of rows [q0, q0 + rows) x keys [k0, k0 + cols) of (b, h);
  // scratch.allowed holds the listed pairs and scratch.keys the keys they
  // reach when the tile needs them.
  TileMask tile(int b, int h, const MaskPolicy& mask, int q0, int rows, int k0, int cols,
                BlockScratch& scratch) const;
  // The keys of [k0, k0 + cols) that some query block of (b, h) for h in
  // [h_first, h_first + heads) lists, in scratch.keys (the dK/dV pass reads
  // no other); null without a block mask (every key). Needs `transpose`.
  const uint8_t* listed_keys(int b, int h_first, int heads, int k0, int cols, BlockScratch& scratch) const;

 private:
  struct Row {
    const int32_t* begin;
    const int32_t* end;
  };
  Row key_blocks(int b, int h, int qb) const;
  Row query_blocks(int b, int h, int kb) const;
  int64_t list_row(int b, int h) const;  // first row of (b, h)'s lists
  void build_query_lists(int64_t rows);

  BlockMaskView m_;
  std::vector<int64_t> key_start_;    // [list rows + 1]
  std::vector<int32_t> key_blocks_;   // sorted within each row
  std::vector<int64_t> query_start_;  // [batch * heads * k_blocks + 1], when transposed
  std::vector<int32_t> query_blocks_;
};

// The walk both directions share: tiles (of `tile` items, origin t0, `n`
// items) of [begin, end), with a block mask only those mark(visit) flags.
template <typename Mark, typename Fn>
void walk_tiles(const BlockLists& blocks, int begin, int end, int tile, int length, BlockScratch& scratch,
                Mark&& mark, Fn&& fn) {
  if (blocks.enabled()) {
    scratch.visit.resize(static_cast<size_t>(ceil_div(length, tile)));
    mark(scratch.visit);
  }
  for (int t0 = begin / tile * tile; t0 < end; t0 += tile) {
    if (blocks.enabled() && scratch.visit[t0 / tile] == 0) continue;
    fn(t0, std::min(tile, length - t0));
  }
}

// The visibility of rows [q0, q0 + rows) x keys [k0, k0 + cols) of (b, h).
inline TileMask tile_mask(const BlockLists& blocks, int b, int h, const MaskPolicy& mask, int q0, int rows, int k0,
                          int cols, BlockScratch& scratch) {
  return blocks.enabled() ? blocks.tile(b, h, mask, q0, rows, k0, cols, scratch)
                          : element_tile(mask, q0, rows, k0);
}

// Calls fn(k0, cols, tile) for each key tile (origin k0, `cols` keys) that
// query rows [q0, q0 + rows) of (sequence b, head h) visit: the tiles of the
// element mask's key range, and with a block mask only those holding a listed
// pair. `tile` is the pairs' visibility (never kEmpty).
template <typename Fn>
void for_each_key_tile(const BlockLists& blocks, int b, int h, const MaskPolicy& mask, int q0, int rows,
                       BlockScratch& scratch, Fn&& fn) {
  walk_tiles(
      blocks, mask.key_begin(q0), mask.key_end(q0 + rows), kBlockK, mask.seqlen_k, scratch,
      [&](std::vector<uint8_t>& visit) { blocks.mark_key_tiles(b, h, q0, rows, visit); },
      [&](int k0, int cols) {
        const TileMask tile = tile_mask(blocks, b, h, mask, q0, rows, k0, cols, scratch);
        if (tile.cls != TileClass::kEmpty) fn(k0, cols, tile);
      });
}

// Calls fn(q0, rows, tile) for each query tile of (sequence b, head h) that
// sees a key of [k0, k0 + cols): the element mask's query range, and with a
// block mask only tiles holding a listed pair (blocks built with transpose).
template <typename Fn>
void for_each_query_tile(const BlockLists& blocks, int b, int h, const MaskPolicy& mask, int k0, int cols,
                         BlockScratch& scratch, Fn&& fn) {
  walk_tiles(
      blocks, mask.query_begin(k0), mask.query_end(k0 + cols), kBlockQ, mask.seqlen_q, scratch,
      [&](std::vector<uint8_t>& visit) { blocks.mark_query_tiles(b, h, k0, cols, visit); },
      [&](int q0, int rows) {
        const TileMask tile = tile_mask(blocks, b, h, mask, q0, rows, k0, cols, scratch);
        if (tile.cls != TileClass::kEmpty) fn(q0, rows, tile);
      });
}

}  // namespace flashattn::cpu
