#include "cpu/block_sparse.h"

#include <algorithm>

namespace flashattn::cpu {
namespace {

// Marks tiles first_index / tile .. last_index / tile (clamped to the flags) for
// the items [first_index, first_index + length) of a block; 64-bit: block
// sizes may be anything up to 2^31 - 1.
void mark_span(int64_t first_index, int64_t length, int tile, std::vector<uint8_t>& visit) {
  const int64_t n = static_cast<int64_t>(visit.size());
  const int64_t t0 = first_index / tile;
  const int64_t t1 = std::min(n - 1, (first_index + length - 1) / tile);
  for (int64_t t = t0; t <= t1; ++t) visit[static_cast<size_t>(t)] = 1;
}

}  // namespace

BlockLists::BlockLists(const AttentionParams& p, bool transpose) : m_(p.block_mask) {
  if (!m_.enabled()) return;
  const int64_t rows = int64_t{m_.batch} * m_.heads * m_.q_blocks;
  // Row r of the lists is (b, h, qb) with r = (b * heads + h) * q_blocks + qb.
  const auto for_each_row = [&](auto&& fn) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bh = r / m_.q_blocks;
      fn(r, static_cast<int>(bh / m_.heads), static_cast<int>(bh % m_.heads), static_cast<int>(r % m_.q_blocks));
    }
  };
  key_start_.assign(static_cast<size_t>(rows) + 1, 0);
  for_each_row([&](int64_t r, int b, int h, int qb) {
    key_start_[r + 1] = key_start_[r] + m_.partial.count(b, h, qb) + m_.full.count(b, h, qb);
  });
  key_blocks_.resize(static_cast<size_t>(key_start_.back()));
  for_each_row([&](int64_t r, int b, int h, int qb) {
    int32_t* const first = key_blocks_.data() + key_start_[r];  // data(): the lists may be empty
    int32_t* out = first;
    for (int n = 0; n < m_.partial.count(b, h, qb); ++n) *out++ = m_.partial.index(b, h, qb, n);
    for (int n = 0; n < m_.full.count(b, h, qb); ++n) *out++ = m_.full.index(b, h, qb, n);
    std::sort(first, out);
  });
  if (transpose) build_query_lists(rows);
}

// Counting sort of the rows' entries by key block; query blocks arrive in
// increasing order, so each column comes out sorted.
void BlockLists::build_query_lists(int64_t rows) {
  const int64_t columns = int64_t{m_.batch} * m_.heads * m_.k_blocks;
  query_start_.assign(static_cast<size_t>(columns) + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / m_.q_blocks;
    for (int64_t e = key_start_[r]; e < key_start_[r + 1]; ++e) ++query_start_[bh * m_.k_blocks + key_blocks_[e] + 1];
  }
  for (int64_t c = 0; c < columns; ++c) query_start_[c + 1] += query_start_[c];
  std::vector<int64_t> fill(query_start_.begin(), query_start_.end() - 1);
  query_blocks_.resize(key_blocks_.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / m_.q_blocks;
    for (int64_t e = key_start_[r]; e < key_start_[r + 1]; ++e) {
      query_blocks_[static_cast<size_t>(fill[bh * m_.k_blocks + key_blocks_[e]]++)] = static_cast<int32_t>(r % m_.q_blocks);
    }
  }
}

int64_t BlockLists::list_row(int b, int h) const {
  return int64_t{m_.list_batch(b)} * m_.heads + m_.list_head(h);
}

BlockLists::Row BlockLists::key_blocks(int b, int h, int qb) const {
  const int64_t r = list_row(b, h) * m_.q_blocks + qb;
  return {key_blocks_.data() + key_start_[r], key_blocks_.data() + key_start_[r + 1]};
}

BlockLists::Row BlockLists::query_blocks(int b, int h, int kb) const {
  const int64_t c = list_row(b, h) * m_.k_blocks + kb;
  return {query_blocks_.data() + query_start_[c], query_blocks_.data() + query_start_[c + 1]};
}

// For the blocks x (of `block` items) covering items [first, first + n),
// marks the tiles (of `tile` items) of every block (of `other_block` items)
// that lists(x) names: the walk in one dimension from the lists of the other.
template <typename Lists>
void mark_listed_tiles(int first, int n, int block, int blocks, int other_block, int tile, Lists&& lists,
                       std::vector<uint8_t>& visit) {
  std::fill(visit.begin(), visit.end(), 0);
  const int last = std::min(blocks - 1, (first + n - 1) / block);
  for (int x = first / block; x <= last; ++x) {
    const auto row = lists(x);
    for (const int32_t* y = row.begin; y != row.end; ++y) mark_span(int64_t{*y} * other_block, other_block, tile, visit);
  }
}

void BlockLists::mark_key_tiles(int b, int h, int q0, int rows, std::vector<uint8_t>& visit) const {
  mark_listed_tiles(q0, rows, m_.block_q, m_.q_blocks, m_.block_k, kBlockK,
                    [&](int qb) { return key_blocks(b, h, qb); }, visit);
}

void BlockLists::mark_query_tiles(int b, int h, int k0, int cols, std::vector<uint8_t>& visit) const {
  mark_listed_tiles(k0, cols, m_.block_k, m_.k_blocks, m_.block_q, kBlockQ,
                    [&](int kb) { return query_blocks(b, h, kb); }, visit);
}

// Calls fn(i, i_end, lo, hi) for each listed key block that rows [q0, q0 + rows)
// x keys [k0, k0 + cols) meet: rows [i, i_end) of the tile share a query block
// (rows_of(qb) its sorted key blocks) and the block covers columns [lo, hi).
template <typename RowsOf, typename Fn>
void for_each_listed_span(const BlockMaskView& m, RowsOf&& rows_of, int q0, int rows, int k0, int cols, Fn&& fn) {
  const int kb_first = k0 / m.block_k, kb_last = (k0 + cols - 1) / m.block_k;
  for (int i = 0; i < rows;) {
    const int qb = (q0 + i) / m.block_q;
    const int i_end = static_cast<int>(std::min<int64_t>(rows, (int64_t{qb} + 1) * m.block_q - q0));
    const auto row = rows_of(qb);
    for (const int32_t* kb = std::lower_bound(row.begin, row.end, kb_first); kb != row.end && *kb <= kb_last; ++kb) {
      const int lo = static_cast<int>(std::max<int64_t>(0, int64_t{*kb} * m.block_k - k0));
      const int hi = static_cast<int>(std::min<int64_t>(cols, (int64_t{*kb} + 1) * m.block_k - k0));
      fn(i, i_end, lo, hi);
    }
    i = i_end;
  }
}

TileMask BlockLists::tile(int b, int h, const MaskPolicy& mask, int q0, int rows, int k0, int cols,
                          BlockScratch& scratch) const {
  const auto rows_of = [&](int qb) { return key_blocks(b, h, qb); };
  // NOTES: counted first, so a tile whose pairs are all listed (the common
  // case of large blocks) costs no pair table: it is the element mask's tile.
  int64_t listed = 0;
  for_each_listed_span(m_, rows_of, q0, rows, k0, cols,
                       [&](int i, int i_end, int lo, int hi) { listed += int64_t{i_end - i} * (hi - lo); });
  if (listed == int64_t{rows} * cols) return element_tile(mask, q0, rows, k0);
  if (listed == 0) return {&mask, q0, k0, TileClass::kEmpty, nullptr, nullptr};
  uint8_t* const allowed = scratch.allowed.data();
  uint8_t* const keys = scratch.keys.data();
  std::fill(allowed, allowed + kBlockQ * kBlockK, 0);
  std::fill(keys, keys + kBlockK, 0);
  for_each_listed_span(m_, rows_of, q0, rows, k0, cols, [&](int i, int i_end, int lo, int hi) {
    for (int r = i; r < i_end; ++r) std::fill(allowed + r * kBlockK + lo, allowed + r * kBlockK + hi, 1);
    std::fill(keys + lo, keys + hi, 1);
  });
  return {&mask, q0, k0, TileClass::kPartial, allowed, keys};
}

const uint8_t* BlockLists::listed_keys(int b, int h_first, int heads, int k0, int cols, BlockScratch& scratch) const {
  if (!enabled()) return nullptr;
  uint8_t* const keys = scratch.keys.data();
  std::fill(keys, keys + kBlockK, 0);
  for (int kb = k0 / m_.block_k; kb <= (k0 + cols - 1) / m_.block_k; ++kb) {
    bool listed = false;
    for (int h = h_first; h < h_first + heads && !listed; ++h) {
      const Row column = query_blocks(b, h, kb);
      listed = column.begin != column.end;
    }
    if (!listed) continue;
    const int64_t lo = std::max<int64_t>(0, int64_t{kb} * m_.block_k - k0);
    std::fill(keys + lo, keys + std::min<int64_t>(cols, (int64_t{kb} + 1) * m_.block_k - k0), 1);
  }
  return keys;
}

}  // namespace flashattn::cpu
