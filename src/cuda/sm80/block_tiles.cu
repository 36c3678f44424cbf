#include "cuda/sm80/block_tiles.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace flashattn::cuda::sm80 {
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

// The key tiles of query tile [row0, row1) of list row (b, h) that hold a
// listed pair, ascending, each with kFullTile when all its pairs (inside
// seqlen_q x seqlen_k) are listed: counted, as validation guarantees no pair
// twice. `pairs` (zero on entry and exit) and `touched` are scratch.
void key_tiles_of(const BlockMaskView& m, int b, int h, int64_t row0, int64_t row1, int seqlen_k, int tile_n,
                  std::vector<int64_t>& pairs, std::vector<int32_t>& touched, HostTileList& out) {
  for (int64_t qb = row0 / m.block_q; qb <= (row1 - 1) / m.block_q; ++qb) {
    const int64_t rows = std::min(row1, (qb + 1) * m.block_q) - std::max(row0, qb * m.block_q);
    for_each_listed(m, b, h, static_cast<int>(qb), [&](int kb) {
      const int64_t c0 = int64_t{kb} * m.block_k, c1 = std::min<int64_t>(c0 + m.block_k, seqlen_k);
      for (int64_t nt = c0 / tile_n; nt <= (c1 - 1) / tile_n; ++nt) {
        const int64_t cols = std::min(c1, (nt + 1) * tile_n) - std::max(c0, nt * tile_n);
        if (pairs[nt] == 0) touched.push_back(static_cast<int32_t>(nt));
        pairs[nt] += rows * cols;
      }
    });
  }
  std::sort(touched.begin(), touched.end());
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
  std::vector<int64_t> pairs(static_cast<size_t>(tiles_of(seqlen_k, tile_n)), 0);
  std::vector<int32_t> touched;
  const int64_t q_tiles = tiles_of(seqlen_q, tile_m);
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        key_tiles_of(m, b, h, qt * tile_m, std::min<int64_t>((qt + 1) * tile_m, seqlen_q), seqlen_k, tile_n, pairs,
                     touched, out);
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

bool has_partial_tile(const HostTileList& l) {
  return std::any_of(l.entries.begin(), l.entries.end(), [](int32_t e) { return !TileList::full(e); });
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

}  // namespace

BlockTileBuffer::~BlockTileBuffer() {
  if (device_ != nullptr) cudaFreeAsync(device_, stream_);
}

fa_status BlockTileBuffer::build(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk) {
  if (!p.has_block_mask()) return FA_OK;
  stream_ = static_cast<cudaStream_t>(p.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t err = cudaStreamIsCapturing(stream_, &capture); err != cudaSuccess) {
    return device_error(err, "cudaStreamIsCapturing");
  }
  if (capture != cudaStreamCaptureStatusNone) {
    return fail(FA_ERROR_UNSUPPORTED, "block_mask: the lists are copied to the device on every call, which a "
                                      "CUDA graph cannot capture (docs/variants.md)");
  }
  const BlockMaskView& m = p.block_mask;
  const int64_t rows = int64_t{m.batch} * m.heads;
  const int64_t q_tiles = tiles_of(p.seqlen_q, tile_m), k_tiles = tiles_of(p.seqlen_k, tile_n);
  HostTileList by_query;
  if (!key_tile_lists(m, p.seqlen_q, p.seqlen_k, tile_m, tile_n, by_query)) {
    return fail(FA_ERROR_UNSUPPORTED, "block_mask: more than 2^31 visited (query tile, key tile) pairs in one call");
  }
  HostTileList by_key;
  if (walk == BlockWalk::kBackward) by_key = transpose(by_query, rows, q_tiles, k_tiles);
  const int words = static_cast<int>((m.k_blocks + 31) / 32);
  std::vector<uint32_t> bits;
  if (has_partial_tile(by_query)) {
    if (rows * m.q_blocks * words * 4 > kMaxBitTableBytes) {
      return fail(FA_ERROR_UNSUPPORTED, "block_mask: blocks of " + std::to_string(m.block_q) + " x " +
                                            std::to_string(m.block_k) + " over these lengths need a " +
                                            std::to_string(rows * m.q_blocks * words * 4) +
                                            "-byte bit table on CUDA (at most 256 MiB); use larger blocks");
    }
    bits = listed_bits(m, words);
  }

  Image img;
  const size_t kq_start = img.append(by_query.start), kq_entries = img.append(by_query.entries);
  const size_t qk_start = img.append(by_key.start), qk_entries = img.append(by_key.entries);
  const size_t bit_words = img.append(bits);
  const size_t bytes = img.words.size() * sizeof(uint32_t);
  if (cudaError_t err = cudaMallocAsync(&device_, bytes, stream_); err != cudaSuccess) {
    device_ = nullptr;
    cudaGetLastError();
    return fail(FA_ERROR_OUT_OF_MEMORY, "block_mask: could not allocate " + std::to_string(bytes) +
                                            " bytes for the tile lists: " + cudaGetErrorString(err));
  }
  if (cudaError_t err = cudaMemcpyAsync(device_, img.words.data(), bytes, cudaMemcpyHostToDevice, stream_);
      err != cudaSuccess) {
    return device_error(err, "copying the tile lists to the device");
  }
  const auto* base = static_cast<const uint32_t*>(device_);
  const auto ints = [&](size_t at) { return reinterpret_cast<const int32_t*>(base + at); };
  view_.key_tiles = {ints(kq_start), ints(kq_entries), static_cast<int>(q_tiles)};
  if (walk == BlockWalk::kBackward) view_.query_tiles = {ints(qk_start), ints(qk_entries), static_cast<int>(k_tiles)};
  if (!bits.empty()) view_.blocks = {base + bit_words, words};
  return FA_OK;
}

}  // namespace flashattn::cuda::sm80
