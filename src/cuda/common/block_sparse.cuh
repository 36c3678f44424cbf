// A block mask (fa_block_mask) as the CUDA kernels read it (sm80 and Hopper): the mask's
// listed (query block, key block) pairs restated on a kernel's own tile grid
// (tile_m query rows x tile_n keys, unrelated to block_q x block_k), built on
// the host per call (block_tiles.h) and copied to device memory.
//
//   TileList    per (list row, tile of one dimension): the tiles of the other
//               dimension that hold at least one listed pair, ascending, each
//               flagged kFullTile when every pair inside the maximum lengths is
//               listed (then the block mask cuts nothing in that tile)
//   ListedBlocks  one bit per (query block, key block): the per-element test
//               of tiles that are visited but not full
//
// A list row is (list_batch(b), list_head(h)) of the caller's lists (B and H
// of 1 are shared), so the host work and the device copy grow with the
// caller's lists, not with batch x heads.
//
// NOTES: the kernels walk a CTA's entries with the index they walked tiles
// with (entry j instead of tile n_first + j), so the cp.async prefetch of
// "tile j + stages - 1" fetches the next *visited* tile and a skipped tile
// costs no memory traffic and no loop iteration.
#pragma once

#include <cstdint>

#include "attention/block_mask.h"
#include "attention/host_device.h"

namespace flashattn::cuda {

// An entry of a TileList: the tile index, with this bit set when every pair of
// the tile is listed.
inline constexpr int32_t kFullTile = int32_t{1} << 30;
inline constexpr int32_t kTileIndexBits = kFullTile - 1;

struct TileList {
  const int32_t* start = nullptr;    // [list rows * tiles + 1]: entries of row r, tile t at start[r * tiles + t]
  const int32_t* entries = nullptr;  // tile index | kFullTile
  int tiles = 0;                     // tiles of the walked-from dimension per list row

  // Entries [first, last) of (list row, tile) whose tile index lies in [lo, hi):
  // the entries are ascending, so a binary search on each side.
  FA_HOST_DEVICE void range(int64_t row, int tile, int lo, int hi, int* first, int* last) const {
    const int64_t r = row * tiles + tile;
    *first = lower_bound(start[r], start[r + 1], lo);
    *last = lower_bound(*first, start[r + 1], hi);
  }
  // The first of entries [a, b) whose key (entry & key_bits: the tile index,
  // or a backward step's query tile, kStepTileMask) is >= value.
  FA_HOST_DEVICE int lower_bound(int a, int b, int value, int32_t key_bits = kTileIndexBits) const {
    while (a < b) {
      const int mid = a + (b - a) / 2;
      if ((entries[mid] & key_bits) < value) a = mid + 1;
      else b = mid;
    }
    return a;
  }
  FA_HOST_DEVICE static int index(int32_t entry) { return entry & kTileIndexBits; }
  FA_HOST_DEVICE static bool full(int32_t entry) { return (entry & kFullTile) != 0; }
};

// One bit per (list row, query block, key block): listed in either list.
struct ListedBlocks {
  const uint32_t* bits = nullptr;  // [list rows][q_blocks][words]
  int words = 0;                   // ceil(k_blocks / 32)

  // The bit row of query row i in list row `row`; test keys with listed().
  FA_HOST_DEVICE const uint32_t* row_bits(const BlockMaskView& m, int64_t row, int i) const {
    return bits + (row * m.q_blocks + i / m.block_q) * words;
  }
  FA_HOST_DEVICE static bool listed(const uint32_t* row_bits, int kb) {
    return (row_bits[kb >> 5] >> (kb & 31)) & 1u;
  }
};

// Which (query, key) pairs a launch's block mask lists (the test of the
// NaN/Inf fixes, common/nonfinite.cuh): the launch's key-tile lists on its
// tiles (tile_m x tile_n) with their full flags, and the per-block bits for
// the tiles listed in part.
// NOTES: the bits exist only where some visited tile is partial
// (block_tiles.cu's build_image); a full tile never reads them. Callers test
// the element mask first.
struct ListedPairs {
  TileList key_tiles;
  ListedBlocks blocks;
  int tile_m = 0, tile_n = 0;

  FA_HOST_DEVICE bool listed(const BlockMaskView& m, int64_t row, int i, int j) const {
    const int n = j / tile_n;
    int first = 0, last = 0;
    key_tiles.range(row, i / tile_m, n, n + 1, &first, &last);
    if (first == last) return false;
    return TileList::full(key_tiles.entries[first]) || ListedBlocks::listed(blocks.row_bits(m, row, i), j / m.block_k);
  }
};

// A step of the Hopper backward's walk (BlockTiles::steps): query tile
// (entry & kStepTileMask) of query head (entry >> kStepHeadShift) &
// kStepHeadMask (heads_q < 2^10, query tiles < 2^20), with kStepPartial set
// when the block mask lists only some of the tile's pairs (the kernel then
// tests each pair against ListedBlocks).
inline constexpr int kStepHeadShift = 20;
inline constexpr int32_t kStepTileMask = (int32_t{1} << kStepHeadShift) - 1;
inline constexpr int32_t kStepPartial = int32_t{1} << 30;
inline constexpr int32_t kStepHeadMask = (kStepPartial >> kStepHeadShift) - 1;

// A persistent kernel's tile schedule (the Hopper forward's): step s of CTA c
// takes tile tiles[s * grid + c] (bh * q_tiles + query tile), or none (-1).
struct TileSchedule {
  const int32_t* tiles = nullptr;
  int steps = 0;  // steps of the longest CTA's walk
};

// What a kernel launch reads of the block mask (device memory; all null and
// unread without one).
struct BlockTiles {
  TileList key_tiles;    // per query tile, its visited key tiles (forward; deterministic backward)
  TileList query_tiles;  // per key tile, the query tiles that visit it (backward)
  ListedBlocks blocks;
  TileSchedule schedule;  // built for a persistent launch only (BlockTileBuffer::build's grid)
  TileList steps;         // kGroupSteps: per (sequence, kv head, key tile) its (query head, query tile) steps
                          // (kStepPartial: listed in part; then `blocks` holds the bits)
  // kGroupSteps, per entry of steps: wait_dq_turn's n_tile for the step's
  // (query head, query tile) in deterministic mode: the next-higher key tile
  // that lists it, less one (k_tiles - 1 when none).
  const int32_t* step_turns = nullptr;

  // The list row of (sequence b, query head h).
  FA_HOST_DEVICE static int64_t list_row(const BlockMaskView& m, int b, int h) {
    return int64_t{m.list_batch(b)} * m.heads + m.list_head(h);
  }
};

// The lowest key tile above n_tile that visits query tile m of list row
// `row` (a key_tiles list), or `none` (the deterministic backward's dQ order).
FA_HOST_DEVICE int next_key_tile(const TileList& l, int64_t row, int m, int n_tile, int none) {
  int first = 0, last = 0;
  l.range(row, m, n_tile + 1, none, &first, &last);
  return first < last ? TileList::index(l.entries[first]) : none;
}

// The backward's walk of one key tile over the query tiles that list it, for
// each query head of its group in turn (heads h0 + g), inside the element
// mask's query tiles [m_begin, m_end).
// NOTES: step `it` is located from scratch (a binary search per head of the
// group) rather than kept in a cursor across the loop: two cursors (the step
// computed, the step prefetched) held 12 more registers over the whole loop
// and spilled 44 bytes at d 256, in the plain path too.
struct ListedQueryTiles {
  const TileList& list;
  const BlockMaskView& mask;
  int b, h0, group, n_tile, m_begin, m_end;

  // Head g's entries [*first, *last).
  FA_HOST_DEVICE void head_range(int g, int* first, int* last) const {
    list.range(BlockTiles::list_row(mask, b, h0 + g), n_tile, m_begin, m_end, first, last);
  }
  // Steps of every head of the group (the walk's length).
  FA_HOST_DEVICE int count() const {
    int n = 0;
    for (int g = 0; g < group; ++g) {
      int first = 0, last = 0;
      head_range(g, &first, &last);
      n += last - first;
    }
    return n;
  }
  // Step it (< count()): its query head and its entry.
  FA_HOST_DEVICE void locate(int it, int* h, int32_t* entry) const {
    for (int g = 0; g < group; ++g) {
      int first = 0, last = 0;
      head_range(g, &first, &last);
      if (it < last - first) {
        *h = h0 + g;
        *entry = list.entries[first + it];
        return;
      }
      it -= last - first;
    }
  }
};

}  // namespace flashattn::cuda
