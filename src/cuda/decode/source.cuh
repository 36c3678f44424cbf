// Where the decode kernel's K/V rows come from: a contiguous cache or a paged
// one. Each source gives, for the rows one thread copies in a key tile (keys
// tile * kBlockK + key0 + n * kRowsPerPass of its CopyMap), the element offsets
// of their first column in the K and V caches.
//
// NOTES: the two are separate policy types so that each path's per-row work is
// only its own: a contiguous row is one multiply-add from a base computed once
// per CTA, a paged row needs the block table. With pages of a multiple of the
// key tile (64, 128, 256 keys at head dims up to 128) a tile lies in one page
// and is translated once; smaller pages translate per row (a shift and a mask
// for power-of-two sizes, a division otherwise): two sources (PagedKvOf). A tile's table entries are
// fetched two tiles before its copies (kernel.cuh), so their latency hides
// behind the math.
#pragma once

#include <cstdint>

#include "core/kvcache.h"
#include "cuda/decode/common.cuh"

namespace flashattn::cuda::decode {

// Offsets of head hk's key 0 of a cache row or page (a chunk's column is
// added per copy: for_tile_rows).
struct HeadBase {
  int64_t k, v;
  __device__ HeadBase(const AttentionParams& a, int hk) : k(hk * a.k_head_stride), v(hk * a.v_head_stride) {}
};

// A contiguous cache: sequence b's keys are consecutive rows of cache row
// cache_batch_idx[b] (b by default); nothing to look up per tile.
// NOTES (copy maps, measured on the H100 against each other with the padded
// ring before the swizzled one, docs/performance.md 3.6): a contiguous cache copies whole rows per run of threads (16 threads a
// row at head dim 128, one chunk of each of 8 rows a thread), a paged cache
// 128-byte lines (8 threads a line, both lines of 4 rows a thread): the paged
// source then translates and checks half the rows per thread, and read 1-10%
// more (batch 1 x 4k, 64-token pages: +10%); the contiguous cache, whose row
// is one multiply-add, read ~1% less with lines.
template <int HeadDim>
struct ContiguousKv {
  using Tr = Traits<HeadDim>;
  using Map = CopyMap<HeadDim, Tr::kChunks>;
  struct Rows {};
  static constexpr bool kAddressesAhead = true;  // any tile's rows, without a lookup
  static constexpr bool kPrefetchesAhead = true;  // the loop's L2 prefetch (kernel.cuh) may run
  int64_t k0, v0;        // key 0
  int64_t k_row, v_row;  // one key further
  bool ok;               // the cache row is in range

  __device__ ContiguousKv(const KvCacheParams& p, const Work&, const TileWork& t) {
    const AttentionParams& a = p.attn;
    const int64_t row = p.cache_batch_idx != nullptr ? p.cache_batch_idx[t.b] : t.b;
    ok = row >= 0 && row < p.cache_rows;
    const HeadBase base(a, t.hk);
    k0 = row * a.k_batch_stride + base.k;
    v0 = row * a.v_batch_stride + base.v;
    k_row = a.k_row_stride;
    v_row = a.v_row_stride;
  }
  // Checked once, before anything is read.
  __device__ bool indices_ok() const { return ok; }
  __device__ void fetch(int, Rows&) const {}
  // Key j (row n of the tile): false when it is not to be read.
  __device__ bool offsets(const Rows&, int j, int, int64_t& k, int64_t& v) const {
    k = k0 + j * k_row;
    v = v0 + j * v_row;
    return true;
  }
  // The offsets of this thread's first row of key tile `tile` (key0 of its
  // CopyMap) when every row of the tile lies at the cache's row stride from
  // it (kernel.cuh, for_whole_tile_rows): always, here.
  __device__ bool tile_rows(const Rows& rows, int tile, int64_t& k, int64_t& v) const {
    return offsets(rows, tile * Tr::kBlockK + Map::key0(), 0, k, v);
  }
  __device__ bool saw_bad_index() const { return false; }
};

// A paged cache: key j of sequence b is slot j % block_size of page
// block_table[b][j / block_size]. Page indices are checked where they are used:
// a page outside the pool is never read and poisons the CTA's rows.
//
// NOTES: the check sits in offsets(), tiles after fetch() loaded the entry, so
// no warp waits on the table's latency (an L2 round trip under full HBM
// traffic) in the tile it fetches for. WholeTiles (block_size a multiple of
// kBlockK: 64, 128, 256 keys at head dims up to 128) is a template value, two
// kernels: a tile then lies in one page, is translated once and its rows are
// consecutive slots (tile_rows, the copies' short path); with the choice at
// run time in one kernel, the smaller pages' kernel ran 2-4% slower at batch 1
// (H100, docs/performance.md 3.6).
template <int HeadDim, bool WholeTiles>
struct PagedKvOf {
  using Tr = Traits<HeadDim>;
  using Map = CopyMap<HeadDim, Tr::kLineChunks>;
  struct Rows {
    int page[Map::kRowsPerThread];  // as the block table says, or -1 past the keys
  };
  // A tile's rows are known a tile after its table entries are requested; the
  // loop's L2 prefetch of the tile after the ring's takes them then, one
  // address per tile (tile_rows) where a tile lies in one page.
  static constexpr bool kAddressesAhead = false;
  static constexpr bool kPrefetchesAhead = WholeTiles;
  const int32_t* table;  // sequence b's row of the block table
  HeadBase base;
  int64_t k_page, v_page, k_row, v_row;
  int64_t pages;         // pool size
  int block_size, shift, keys, key0;
  mutable bool bad = false;

  __device__ PagedKvOf(const KvCacheParams& p, const Work& w, const TileWork& t)
      : table(p.block_table + t.b * p.block_table_stride),
        base(p.attn, t.hk),
        k_page(p.attn.k_batch_stride),
        v_page(p.attn.v_batch_stride),
        k_row(p.attn.k_row_stride),
        v_row(p.attn.v_row_stride),
        pages(p.cache_rows),
        block_size(p.block_size),
        shift(w.page_shift),
        keys(t.keys),
        key0(Map::key0()) {}

  __device__ bool indices_ok() const { return true; }
  __device__ int page_of(int j) const { return shift >= 0 ? j >> shift : j / block_size; }
  __device__ int slot_of(int j) const { return shift >= 0 ? j & (block_size - 1) : j % block_size; }
  __device__ void fetch(int tile, Rows& rows) const {
    const int first = tile * Tr::kBlockK;
    const int whole = WholeTiles && first < keys ? table[page_of(first)] : -1;
#pragma unroll
    for (int n = 0; n < Map::kRowsPerThread; ++n) {
      const int j = first + key0 + n * Map::kRowsPerPass;
      rows.page[n] = j >= keys ? -1 : (WholeTiles ? whole : table[page_of(j)]);
    }
  }
  // Called for keys j < keys only: a page of -1 there came from the table.
  __device__ bool offsets(const Rows& rows, int j, int n, int64_t& k, int64_t& v) const {
    const int page = rows.page[n];
    const bool in_pool = page >= 0 && page < pages;
    bad |= !in_pool;
    const int slot = slot_of(j);
    k = page * k_page + slot * k_row + base.k;
    v = page * v_page + slot * v_row + base.v;
    return in_pool;
  }
  // As ContiguousKv::tile_rows for a tile in one page (every row of a whole
  // tile holds its page's entry); false for smaller pages, and for a page
  // outside the pool, which offsets() records and the per-row path refuses.
  __device__ bool tile_rows(const Rows& rows, int tile, int64_t& k, int64_t& v) const {
    return WholeTiles && offsets(rows, tile * Tr::kBlockK + key0, 0, k, v);
  }
  __device__ bool saw_bad_index() const { return bad; }
};

// The two paged sources, as the kernel's Source template takes them.
template <int HeadDim>
using PagedTilesKv = PagedKvOf<HeadDim, true>;
template <int HeadDim>
using PagedRowsKv = PagedKvOf<HeadDim, false>;

}  // namespace flashattn::cuda::decode
