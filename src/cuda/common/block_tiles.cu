#include "cuda/common/block_tiles.h"

#include <algorithm>
#include <utility>
#include <climits>
#include <cstddef>
#include <memory>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/layout.h"

namespace flashattn::cuda {
namespace {

// The per-element bit table (ListedBlocks) is built only when a visited tile
// is not full (block sizes that are no multiple of the kernel's tiles), and
// copied per call: over this size the call is refused rather than copying
// hundreds of MiB (1 x 1 blocks over long sequences).
constexpr int64_t kMaxBitTableBytes = int64_t{256} << 20;

struct HostTileList {
  std::vector<int32_t> start{0};
  std::vector<int32_t> entries;
};

int64_t tiles_of(int64_t length, int64_t tile) { return (length + tile - 1) / tile; }

// Calls fn(kb) for each key block that list row (b, h)'s query block qb lists.
template <typename Fn>
void for_each_listed(const BlockMaskView& m, int b, int h, int qb, Fn&& fn) {
  for (int n = 0; n < m.partial.count(b, h, qb); ++n) fn(m.partial.index(b, h, qb, n));
  for (int n = 0; n < m.full.count(b, h, qb); ++n) fn(m.full.index(b, h, qb, n));
}

// Per key block, the key tiles it meets: [first[kb], first[kb + 1]) of
// `tiles`, with the keys it holds of each (O(k_blocks + tiles met), once per
// call: the per-entry loop then does no division).
struct KeyBlockTiles {
  std::vector<int32_t> first{0};
  std::vector<int32_t> tiles, cols;
  KeyBlockTiles(int k_blocks, int block_k, int seqlen_k, int tile_n) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int64_t c0 = int64_t{kb} * block_k, c1 = std::min<int64_t>(c0 + block_k, seqlen_k);
      for (int64_t nt = c0 / tile_n; nt <= (c1 - 1) / tile_n; ++nt) {
        tiles.push_back(static_cast<int32_t>(nt));
        cols.push_back(static_cast<int32_t>(std::min(c1, (nt + 1) * tile_n) - std::max(c0, nt * tile_n)));
      }
      first.push_back(static_cast<int32_t>(tiles.size()));
    }
  }
};

// Scratch of the per-query-tile pass: listed pairs per key tile (zero
// between query tiles) and the tiles touched.
struct PairCounts {
  std::vector<int64_t> pairs;
  std::vector<int32_t> touched;
};

// The key tiles of query tile [row0, row1) of list row (b, h) that hold a
// listed pair, ascending, each with kFullTile when all its pairs (inside
// seqlen_q x seqlen_k) are listed: counted, as validation guarantees no pair
// twice.
void key_tiles_of(const BlockMaskView& m, const KeyBlockTiles& kbt, int b, int h, int64_t row0, int64_t row1,
                  int seqlen_k, int tile_n, PairCounts& scratch, HostTileList& out) {
  std::vector<int64_t>& pairs = scratch.pairs;
  std::vector<int32_t>& touched = scratch.touched;
  for (int64_t qb = row0 / m.block_q; qb <= (row1 - 1) / m.block_q; ++qb) {
    const int64_t rows = std::min(row1, (qb + 1) * m.block_q) - std::max(row0, qb * m.block_q);
    for_each_listed(m, b, h, static_cast<int>(qb), [&](int kb) {
      for (int32_t t = kbt.first[kb]; t < kbt.first[kb + 1]; ++t) {
        const int32_t nt = kbt.tiles[t];
        if (pairs[nt] == 0) touched.push_back(nt);
        pairs[nt] += rows * kbt.cols[t];
      }
    });
  }
  // NOTES: lists in ascending order (FlexAttention's) touch tiles in order:
  // sorting them anyway cost ~1 us per query tile, most of a call's host time.
  if (!std::is_sorted(touched.begin(), touched.end())) std::sort(touched.begin(), touched.end());
  for (const int32_t nt : touched) {
    const int64_t cols = std::min<int64_t>(seqlen_k, (int64_t{nt} + 1) * tile_n) - int64_t{nt} * tile_n;
    out.entries.push_back(nt | (pairs[nt] == (row1 - row0) * cols ? kFullTile : 0));
    pairs[nt] = 0;
  }
  touched.clear();
}

// Every list row's key_tiles_of, per query tile; false when the entries
// outgrow the int32 offsets of TileList.
bool key_tile_lists(const BlockMaskView& m, int seqlen_q, int seqlen_k, int tile_m, int tile_n, HostTileList& out) {
  const KeyBlockTiles kbt(m.k_blocks, m.block_k, seqlen_k, tile_n);
  PairCounts scratch;
  scratch.pairs.assign(static_cast<size_t>(tiles_of(seqlen_k, tile_n)), 0);
  const int64_t q_tiles = tiles_of(seqlen_q, tile_m);
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        key_tiles_of(m, kbt, b, h, qt * tile_m, std::min<int64_t>((qt + 1) * tile_m, seqlen_q), seqlen_k, tile_n,
                     scratch, out);
        if (out.entries.size() > static_cast<size_t>(INT32_MAX)) return false;
        out.start.push_back(static_cast<int32_t>(out.entries.size()));
      }
    }
  }
  return true;
}

// Per (list row, key tile) the query tiles that visit it: a counting sort of
// the per-query-tile lists (query tiles arrive ascending, so each comes out sorted).
HostTileList transpose(const HostTileList& by_query, int64_t rows, int64_t q_tiles, int64_t k_tiles) {
  HostTileList out;
  out.start.assign(static_cast<size_t>(rows * k_tiles + 1), 0);
  for (int64_t r = 0; r < rows * q_tiles; ++r) {
    const int64_t row = r / q_tiles;
    for (int32_t e = by_query.start[r]; e < by_query.start[r + 1]; ++e) {
      ++out.start[row * k_tiles + TileList::index(by_query.entries[e]) + 1];
    }
  }
  for (int64_t c = 0; c < rows * k_tiles; ++c) out.start[c + 1] += out.start[c];
  std::vector<int32_t> fill(out.start.begin(), out.start.end() - 1);
  out.entries.resize(by_query.entries.size());
  for (int64_t r = 0; r < rows * q_tiles; ++r) {
    const int64_t row = r / q_tiles;
    for (int32_t e = by_query.start[r]; e < by_query.start[r + 1]; ++e) {
      const int32_t entry = by_query.entries[e];
      out.entries[fill[row * k_tiles + TileList::index(entry)]++] =
          static_cast<int32_t>(r % q_tiles) | (entry & kFullTile);
    }
  }
  return out;
}

// wait_dq_turn's n_tile for key tile n's adds into query tile q of list row
// `row` in the deterministic backward: the lowest key tile above n that lists
// q, less one (its adds precede n's; wait_dq_turn skips the wait where it does
// not see q under the element mask, and above it no tile does, query_begin
// only grows with the key), or k_tiles - 1 when none does (no wait).
int32_t turn_before(const HostTileLists& lists, int64_t row, int q, int n, int q_tiles, int k_tiles) {
  const TileList by_query{lists.key_start.data(), lists.key_entries.data(), q_tiles};
  return next_key_tile(by_query, row, q, n, k_tiles) - 1;
}

// kGroupSteps: the transposed lists restated per (sequence b, kv head hk,
// key tile n) as steps h << kStepHeadShift | m, each with its turn_before in
// `turns`, flagged kStepPartial where the tile is listed in part. Fixed
// lengths: query heads h of the group in turn, each head's query tiles
// ascending inside [query_begin, query_end) of the element mask (as the
// kernel's own range). Varlen: the sequences' lengths are device data, so
// every listed query tile, ordered by query tile (then head): the kernel cuts
// the steps to its sequence's range, one run of them (ListedQueryWalk::narrow).
void group_steps(const AttentionParams& p, const HostTileLists& lists, int tile_m, int tile_n, int k_tiles,
                 HostTileList& out, std::vector<int32_t>& turns) {
  const BlockMaskView& m = p.block_mask;
  const MaskPolicy mask = mask_for(p, {p.seqlen_q, p.seqlen_k, 0, 0});
  const int group = p.group_size();
  const int q_tiles = static_cast<int>(tiles_of(p.seqlen_q, tile_m));
  const bool varlen = p.is_varlen();
  std::vector<std::pair<int32_t, int32_t>> steps;  // (query tile, entry) of one key tile
  for (int b = 0; b < p.batch; ++b) {
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      for (int n = 0; n < k_tiles; ++n) {
        const int k0 = n * tile_n, k1 = std::min(p.seqlen_k, k0 + tile_n);
        const int m_begin = varlen ? 0 : mask.query_begin(k0) / tile_m;
        const int m_end = varlen ? q_tiles : (mask.query_end(k1) + tile_m - 1) / tile_m;
        steps.clear();
        for (int g = 0; g < group; ++g) {
          const int64_t r = BlockTiles::list_row(m, b, hk * group + g) * k_tiles + n;
          for (int32_t e = lists.query_start[r]; e < lists.query_start[r + 1]; ++e) {
            const int32_t q = TileList::index(lists.query_entries[e]);
            if (q < m_begin || q >= m_end) continue;
            const int32_t partial = TileList::full(lists.query_entries[e]) ? 0 : kStepPartial;
            steps.emplace_back(q, (hk * group + g) << kStepHeadShift | q | partial);
          }
        }
        if (varlen) {
          std::stable_sort(steps.begin(), steps.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        }
        for (const auto& [q, entry] : steps) {
          const int h = (entry >> kStepHeadShift) & kStepHeadMask;
          out.entries.push_back(entry);
          turns.push_back(turn_before(lists, BlockTiles::list_row(m, b, h), q, n, q_tiles, k_tiles));
        }
        out.start.push_back(static_cast<int32_t>(out.entries.size()));
      }
    }
  }
}

bool has_partial_tile(const std::vector<int32_t>& entries) {
  return std::any_of(entries.begin(), entries.end(), [](int32_t e) { return !TileList::full(e); });
}

std::vector<uint32_t> listed_bits(const BlockMaskView& m, int words) {
  std::vector<uint32_t> bits(static_cast<size_t>(int64_t{m.batch} * m.heads * m.q_blocks * words), 0);
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int qb = 0; qb < m.q_blocks; ++qb) {
        uint32_t* row = bits.data() + ((int64_t{b} * m.heads + h) * m.q_blocks + qb) * words;
        for_each_listed(m, b, h, qb, [&](int kb) { row[kb >> 5] |= 1u << (kb & 31); });
      }
    }
  }
  return bits;
}

// The host image of the device buffer: 4-byte words, each part's offset recorded.
struct Image {
  std::vector<uint32_t> words;
  template <typename V>
  size_t append(const V& v) {
    const size_t at = words.size();
    words.insert(words.end(), v.begin(), v.end());
    return at;
  }
};

fa_status device_error(cudaError_t err, const char* what) {
  cudaGetLastError();
  return fail(FA_ERROR_DEVICE, std::string("block_mask: ") + what + ": " + cudaGetErrorString(err));
}

// What a launch's tile lists are built from: the launch's tiles and lengths,
// the mask's geometry and every entry it lists (count, entries, per list row
// and query block, partial then full). Equal keys give equal lists.
struct CacheKey {
  std::vector<int64_t> shape;
  std::vector<int32_t> lists;
  bool operator==(const CacheKey& o) const { return shape == o.shape && lists == o.lists; }
};

CacheKey cache_key(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, int grid) {
  const BlockMaskView& m = p.block_mask;
  CacheKey k;
  k.shape = {p.device_index, tile_m,    tile_n,  static_cast<int>(walk), p.seqlen_q, p.seqlen_k, m.block_q,
             m.block_k,      m.batch,   m.heads, m.q_blocks,             m.k_blocks, grid,       p.batch,
             p.heads_q,      p.heads_kv, p.window_left, p.window_right};
  // Validation checked a contiguous last dimension: a row's entries are
  // consecutive ints.
  const auto for_each_row = [&](auto&& fn) {
    for (int b = 0; b < m.batch; ++b)
      for (int h = 0; h < m.heads; ++h)
        for (int qb = 0; qb < m.q_blocks; ++qb)
          for (const BlockList* l : {&m.partial, &m.full}) fn(*l, b, h, qb, l->count(b, h, qb));
  };
  size_t total = 0;
  for_each_row([&](const BlockList&, int, int, int, int count) { total += 1 + static_cast<size_t>(count); });
  k.lists.reserve(total);
  for_each_row([&](const BlockList& l, int b, int h, int qb, int count) {
    k.lists.push_back(count);
    if (count > 0) {
      const int32_t* first = &l.indices[b * l.index_strides[0] + h * l.index_strides[1] + qb * l.index_strides[2]];
      k.lists.insert(k.lists.end(), first, first + count);
    }
  });
  return k;
}

// The tile lists of the last few masks, kept on the device: a model calls
// the same mask for every layer and step, and rebuilding its lists on the
// host cost ~1.5 ms per call at 8k, 16 heads, 128 x 128 blocks (more than the
// forward kernel), against ~0.1 ms to read the mask for the key.
// NOTES: never destroyed (a static destructor would free device memory after
// the CUDA runtime is torn down at exit); a buffer lives while the cache or a
// launch holds it (shared_ptr: an eviction during another thread's launch
// frees it after that launch's BlockTileBuffer is done).
class TileCache {
 public:
  static TileCache& instance() {
    static TileCache* cache = new TileCache;
    return *cache;
  }
  // A kept launch's lists, or why they could not be built (`declined`: a
  // kGroupSteps build the Hopper backward cannot run, so that each later call
  // with the mask goes to the sm80 kernel without building them again).
  struct Hit {
    bool found = false;
    std::shared_ptr<void> buffer;
    BlockTiles view;
    std::string declined;
  };
  // pin: the caller is being captured into a CUDA graph, which will replay
  // the launch with this buffer's address: the entry is never evicted.
  Hit find(const CacheKey& key, bool pin) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& e : entries_) {
      if (e.key == key) {
        e.last_use = ++clock_;
        e.pinned = e.pinned || pin;
        return {true, e.buffer, e.view, e.declined};
      }
    }
    return {};
  }
  void insert(CacheKey key, std::shared_ptr<void> buffer, const BlockTiles& view, std::string declined = {}) {
    const std::lock_guard<std::mutex> lock(mutex_);
    // The least recently used entry that no captured graph holds goes when
    // kEntries of them are kept (pinned ones come on top of those).
    const auto unpinned = [](const Entry& e) { return !e.pinned; };
    if (std::count_if(entries_.begin(), entries_.end(), unpinned) >= static_cast<std::ptrdiff_t>(kEntries)) {
      auto oldest = std::find_if(entries_.begin(), entries_.end(), unpinned);
      for (auto e = oldest; e != entries_.end(); ++e) {
        if (!e->pinned && e->last_use < oldest->last_use) oldest = e;
      }
      entries_.erase(oldest);
    }
    entries_.push_back({std::move(key), std::move(buffer), view, std::move(declined), ++clock_, false});
  }

 private:
  // A few masks' forward and backward lists (on Hopper up to three a mask:
  // the forward's, the backward's steps, the sm80 backward's when declined).
  static constexpr size_t kEntries = 12;
  struct Entry {
    CacheKey key;
    std::shared_ptr<void> buffer;
    BlockTiles view;
    std::string declined;
    uint64_t last_use;
    bool pinned;  // used under stream capture: a graph may replay its address
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

// Buffers over this size are not kept (built per call and freed after it).
constexpr size_t kMaxCachedBytes = size_t{64} << 20;

// The host image of a launch's tile lists and where each part starts in it.
struct Layout {
  size_t kq_start = 0, kq_entries = 0, qk_start = 0, qk_entries = 0, bit_words = 0, schedule = 0;
  size_t steps_start = 0, steps_entries = 0, steps_turns = 0;
  int q_tiles = 0, k_tiles = 0, words = 0, steps = 0;
  bool backward = false, bits = false, group_steps = false;
};

// kGroupSteps' part of the image.
fa_status append_group_steps(const AttentionParams& p, const HostTileLists& lists, int tile_m, int tile_n, Image& img,
                             Layout& at) {
  if (p.heads_q > kStepHeadMask + 1 || tiles_of(p.seqlen_q, tile_m) > kStepTileMask) {
    return fail(FA_ERROR_UNSUPPORTED, "block_mask: group steps past their bit fields");
  }
  HostTileList steps;
  std::vector<int32_t> turns;
  group_steps(p, lists, tile_m, tile_n, at.k_tiles, steps, turns);
  if (steps.entries.size() > static_cast<size_t>(INT32_MAX)) {
    return fail(FA_ERROR_UNSUPPORTED, "block_mask: more than 2^31 steps in one call");
  }
  at.steps_start = img.append(steps.start);
  at.steps_entries = img.append(steps.entries);
  at.steps_turns = img.append(turns);
  at.group_steps = true;
  return FA_OK;
}

fa_status build_image(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, int grid, Image& img,
                      Layout& at) {
  const BlockMaskView& m = p.block_mask;
  const int64_t rows = int64_t{m.batch} * m.heads;
  HostTileLists lists;
  FA_RETURN_IF_ERROR(build_tile_lists(p, tile_m, tile_n, walk, &lists));
  const int words = static_cast<int>((m.k_blocks + 31) / 32);
  std::vector<uint32_t> bits;
  if (has_partial_tile(lists.key_entries)) {
    if (rows * m.q_blocks * words * 4 > kMaxBitTableBytes) {
      return fail(FA_ERROR_UNSUPPORTED, "block_mask: blocks of " + std::to_string(m.block_q) + " x " +
                                            std::to_string(m.block_k) + " over these lengths need a " +
                                            std::to_string(rows * m.q_blocks * words * 4) +
                                            "-byte bit table on CUDA (at most 256 MiB); use larger blocks");
    }
    bits = listed_bits(m, words);
  }
  at.kq_start = img.append(lists.key_start);
  at.kq_entries = img.append(lists.key_entries);
  at.qk_start = img.append(lists.query_start);
  at.qk_entries = img.append(lists.query_entries);
  at.bit_words = img.append(bits);
  at.q_tiles = static_cast<int>(tiles_of(p.seqlen_q, tile_m));
  if (grid > 0) {
    if (int64_t{p.batch} * p.heads_q * at.q_tiles > INT32_MAX) {
      return fail(FA_ERROR_UNSUPPORTED, "block_mask: more than 2^31 query tiles in one call");
    }
    at.schedule = img.append(tile_schedule(p, lists, at.q_tiles, grid, &at.steps));
  }
  at.k_tiles = static_cast<int>(tiles_of(p.seqlen_k, tile_n));
  at.words = words;
  at.backward = walk != BlockWalk::kForward;
  if (walk == BlockWalk::kGroupSteps) FA_RETURN_IF_ERROR(append_group_steps(p, lists, tile_m, tile_n, img, at));
  at.bits = !bits.empty();
  return FA_OK;
}

BlockTiles view_of(const Layout& at, const void* device) {
  const auto* base = static_cast<const uint32_t*>(device);
  const auto ints = [&](size_t offset) { return reinterpret_cast<const int32_t*>(base + offset); };
  BlockTiles v;
  v.key_tiles = {ints(at.kq_start), ints(at.kq_entries), at.q_tiles};
  if (at.backward) v.query_tiles = {ints(at.qk_start), ints(at.qk_entries), at.k_tiles};
  if (at.bits) v.blocks = {base + at.bit_words, at.words};
  if (at.steps > 0) v.schedule = {ints(at.schedule), at.steps};
  if (at.group_steps) {
    v.steps = {ints(at.steps_start), ints(at.steps_entries), at.k_tiles};
    v.step_turns = ints(at.steps_turns);
  }
  return v;
}

fa_status allocation_error(size_t bytes, cudaError_t err) {
  cudaGetLastError();
  return fail(FA_ERROR_OUT_OF_MEMORY, "block_mask: could not allocate " + std::to_string(bytes) +
                                          " bytes for the tile lists: " + cudaGetErrorString(err));
}

}  // namespace

// Longest processing time first: each tile, heaviest first, to the CTA with
// the least work so far.
// NOTES: with the plain persistent order (rank r to CTA r % grid) a CTA's
// work is the sum of a few random list lengths: at density 0.1 (6 of 64 key
// tiles a query tile, 8 tiles a CTA) the slowest CTA holds about a third more
// than the mean. The element mask's range is not counted (varlen lengths are
// device data): it orders the work, the kernels still walk only visible tiles.
std::vector<int32_t> tile_schedule(const AttentionParams& p, const HostTileLists& lists, int q_tiles, int grid,
                                   int* steps) {
  const BlockMaskView& m = p.block_mask;
  const int64_t tiles = int64_t{p.batch} * p.heads_q * q_tiles;
  std::vector<std::pair<int64_t, int32_t>> by_cost(static_cast<size_t>(tiles));
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t bh = t / q_tiles;
    const int b = static_cast<int>(bh / p.heads_q), h = static_cast<int>(bh % p.heads_q);
    const int64_t r = BlockTiles::list_row(m, b, h) * q_tiles + t % q_tiles;
    by_cost[t] = {lists.key_start[r + 1] - lists.key_start[r] + kScheduleTileCost, static_cast<int32_t>(t)};
  }
  std::stable_sort(by_cost.begin(), by_cost.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // (load, cta) of every CTA, least loaded on top
  std::vector<std::pair<int64_t, int32_t>> heap;
  for (int c = 0; c < grid; ++c) heap.emplace_back(0, c);
  std::vector<std::vector<int32_t>> per_cta(static_cast<size_t>(grid));
  const auto more = [](const auto& a, const auto& b) { return a > b; };
  for (const auto& [cost, t] : by_cost) {
    std::pop_heap(heap.begin(), heap.end(), more);
    heap.back().first += cost;
    per_cta[heap.back().second].push_back(t);
    std::push_heap(heap.begin(), heap.end(), more);
  }
  size_t longest = 0;
  for (const auto& l : per_cta) longest = std::max(longest, l.size());
  std::vector<int32_t> out(longest * grid, -1);
  for (int c = 0; c < grid; ++c) {
    for (size_t s = 0; s < per_cta[c].size(); ++s) out[s * grid + c] = per_cta[c][s];
  }
  *steps = static_cast<int>(longest);
  return out;
}

fa_status build_tile_lists(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, HostTileLists* out) {
  const BlockMaskView& m = p.block_mask;
  HostTileList by_query;
  if (!key_tile_lists(m, p.seqlen_q, p.seqlen_k, tile_m, tile_n, by_query)) {
    return fail(FA_ERROR_UNSUPPORTED, "block_mask: more than 2^31 visited (query tile, key tile) pairs in one call");
  }
  if (walk != BlockWalk::kForward) {
    HostTileList by_key = transpose(by_query, int64_t{m.batch} * m.heads, tiles_of(p.seqlen_q, tile_m),
                                    tiles_of(p.seqlen_k, tile_n));
    out->query_start = std::move(by_key.start);
    out->query_entries = std::move(by_key.entries);
  }
  out->key_start = std::move(by_query.start);
  out->key_entries = std::move(by_query.entries);
  return FA_OK;
}

BlockTileBuffer::~BlockTileBuffer() {
  if (device_ != nullptr) cudaFreeAsync(device_, stream_);
}

fa_status BlockTileBuffer::build(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, int grid) {
  if (!p.has_block_mask()) return FA_OK;
  stream_ = static_cast<cudaStream_t>(p.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t err = cudaStreamIsCapturing(stream_, &capture); err != cudaSuccess) {
    return device_error(err, "cudaStreamIsCapturing");
  }
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  CacheKey key = cache_key(p, tile_m, tile_n, walk, grid);
  const TileCache::Hit hit = TileCache::instance().find(key, capturing);
  if (!hit.found && capturing) {
    return fail(FA_ERROR_UNSUPPORTED,
                "block_mask under CUDA-graph capture: the device lists of this mask for this launch are not "
                "built yet (a graph cannot capture their copy from host memory); make the same call once "
                "before capturing, as graph warm-up does (lists over " +
                    std::to_string(kMaxCachedBytes >> 20) + " MiB are never kept; docs/variants.md)");
  }
  if (hit.found) {
    if (!hit.declined.empty()) return fail(FA_ERROR_UNSUPPORTED, hit.declined);
    cached_ = hit.buffer;
    view_ = hit.view;
    return FA_OK;
  }
  Image img;
  Layout at;
  if (const fa_status s = build_image(p, tile_m, tile_n, walk, grid, img, at); s != FA_OK) {
    if (s == FA_ERROR_UNSUPPORTED && walk == BlockWalk::kGroupSteps) {
      TileCache::instance().insert(std::move(key), nullptr, {}, last_error());
    }
    return s;
  }
  const size_t bytes = img.words.size() * sizeof(uint32_t);
  const bool keep = bytes <= kMaxCachedBytes;
  void* device = nullptr;
  // NOTES: a kept buffer is plain cudaMalloc memory (it outlives the stream
  // order of this call); one used once comes from the stream-ordered pool.
  const cudaError_t alloc = keep ? cudaMalloc(&device, bytes) : cudaMallocAsync(&device, bytes, stream_);
  if (alloc != cudaSuccess) return allocation_error(bytes, alloc);
  if (keep) cached_ = std::shared_ptr<void>(device, [](void* d) { cudaFree(d); });
  else device_ = device;
  if (cudaError_t err = cudaMemcpyAsync(device, img.words.data(), bytes, cudaMemcpyHostToDevice, stream_);
      err != cudaSuccess) {
    return device_error(err, "copying the tile lists to the device");
  }
  view_ = view_of(at, device);
  if (keep) TileCache::instance().insert(std::move(key), cached_, view_);
  return FA_OK;
}

}  // namespace flashattn::cuda
