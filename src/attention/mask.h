// The mask policy, shared by the reference, the CPU backend and the CUDA
// kernels, so they cannot disagree on which (query, key) pairs are visible.
//
// Query row i of a sequence with seqlen_q rows sees key j of seqlen_k keys when
//   i + (seqlen_k - seqlen_q) - window_left <= j <= i + (seqlen_k - seqlen_q) + window_right
// (bottom-right alignment, as in flash-attn >= 2.1), a bound of -1 being absent.
// Causal is window_right = 0.
#pragma once

#include <cstdint>

#include "attention/host_device.h"

namespace flashattn {

// How a mask sees a (query tile, key tile) block: nothing visible (skipped,
// no memory traffic), everything visible (no per-element test), or partly
// (the element mask applies). A block-sparse mask answers the same question
// from its block lists.
enum class TileClass : int { kEmpty = 0, kPartial = 1, kFull = 2 };

// A range of key tiles [begin, end) of kBlockN keys, walked by a query tile.
struct KeyTileRange {
  int begin = 0, end = 0;
  FA_HOST_DEVICE bool empty() const { return end <= begin; }
  FA_HOST_DEVICE int size() const { return end > begin ? end - begin : 0; }
};

struct MaskPolicy {
  int seqlen_q = 0;
  int seqlen_k = 0;
  int window_left = -1;   // -1 = unbounded
  int window_right = -1;  // -1 = unbounded

  FA_HOST_DEVICE int diagonal_offset() const { return seqlen_k - seqlen_q; }

  // First visible key of row i (may be <= 0).
  FA_HOST_DEVICE int first_key(int i) const {
    return window_left < 0 ? 0 : i + diagonal_offset() - window_left;
  }
  // One past the last visible key of row i (may be >= seqlen_k).
  FA_HOST_DEVICE int end_key(int i) const {
    return window_right < 0 ? seqlen_k : i + diagonal_offset() + window_right + 1;
  }
  FA_HOST_DEVICE bool visible(int i, int j) const {
    return j >= 0 && j < seqlen_k && j >= first_key(i) && j < end_key(i);
  }

  // Key range [begin, end) that rows [row_begin, row_end) can see, clamped to
  // [0, seqlen_k): tiles outside it are skipped entirely.
  FA_HOST_DEVICE int key_begin(int row_begin) const {
    int b = first_key(row_begin);
    return b < 0 ? 0 : (b > seqlen_k ? seqlen_k : b);
  }
  FA_HOST_DEVICE int key_end(int row_end) const {
    int e = end_key(row_end - 1);
    return e < 0 ? 0 : (e > seqlen_k ? seqlen_k : e);
  }

  // How many keys row i sees (a row's ranges are contiguous).
  FA_HOST_DEVICE int keys_of_row(int i) const {
    const int n = key_end(i + 1) - key_begin(i);
    return n > 0 ? n : 0;
  }

  // Query range [begin, end) that keys [key_begin, key_end) are seen by
  // (for the backward pass, which walks query tiles for a key tile).
  FA_HOST_DEVICE int query_begin(int key_lo) const {
    // smallest i with end_key(i) > key_lo  <=>  i > key_lo - offset - right - 1
    if (window_right < 0) return 0;
    int b = key_lo - diagonal_offset() - window_right;
    return b < 0 ? 0 : (b > seqlen_q ? seqlen_q : b);
  }
  FA_HOST_DEVICE int query_end(int key_hi) const {
    // one past the largest i with first_key(i) <= key_hi - 1
    if (window_left < 0) return seqlen_q;
    int e = key_hi - 1 - diagonal_offset() + window_left + 1;
    return e < 0 ? 0 : (e > seqlen_q ? seqlen_q : e);
  }

  // The key tiles (of block_n keys) that query rows [row_begin, row_end) see
  // at all: the tiles outside are skipped.
  FA_HOST_DEVICE KeyTileRange key_tiles(int row_begin, int row_end, int block_n) const {
    const int kb = key_begin(row_begin), ke = key_end(row_end);
    KeyTileRange r;
    r.begin = kb / block_n;
    r.end = ke > kb ? (ke + block_n - 1) / block_n : r.begin;
    return r;
  }

  // The class of the block rows [row_begin, row_end) x keys [col_begin, col_end).
  FA_HOST_DEVICE TileClass classify(int row_begin, int row_end, int col_begin, int col_end) const {
    const int kb = key_begin(row_begin), ke = key_end(row_end);
    if (row_end <= row_begin || col_end <= col_begin || ke <= kb || col_end <= kb || col_begin >= ke)
      return TileClass::kEmpty;
    return tile_fully_visible(row_begin, row_end, col_begin, col_end) ? TileClass::kFull : TileClass::kPartial;
  }

  // True when every (i, j) in the tile is visible: the tile needs no masking.
  FA_HOST_DEVICE bool tile_fully_visible(int row_begin, int row_end, int col_begin,
                                         int col_end) const {
    if (col_end > seqlen_k || row_end > seqlen_q) return false;
    bool left_ok = window_left < 0 || col_begin >= first_key(row_end - 1);
    bool right_ok = window_right < 0 || col_end <= end_key(row_begin);
    return left_ok && right_ok;
  }
};

}  // namespace flashattn
