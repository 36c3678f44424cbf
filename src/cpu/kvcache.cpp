// CPU attention against a KV cache: append the new tokens (rotating the keys),
// rotate q into a host copy, then the forward's tile loop reading keys through
// the cache's addressing (contiguous rows or pages of a block table).
#include <cmath>
#include <limits>
#include <vector>

#include "attention/rotary.h"
#include "core/backends.h"
#include "core/dtype.h"
#include "core/kvcache.h"
#include "core/parallel.h"
#include "cpu/forward_tile.h"

namespace flashattn::cpu {
namespace {

// Rotates the head vector x (f32) at `position` with the call's tables.
void rotate_at(const KvCacheParams& kp, int position, float* x) {
  const fa_dtype t = kp.attn.dtype;
  const int64_t cos_row = position * kp.cos_row_stride, sin_row = position * kp.sin_row_stride;
  rotate(x, kp.rotary_dim, kp.rotary_interleaved,
         [&](int i) { return load_as_float(kp.rotary_cos, cos_row + i, t); },
         [&](int i) { return load_as_float(kp.rotary_sin, sin_row + i, t); });
}

void copy_row(const void* src, int64_t src_off, void* dst, int64_t dst_off, int d, fa_dtype t,
              std::vector<float>& row, const KvCacheParams* rotary, int position) {
  for (int c = 0; c < d; ++c) row[c] = load_as_float(src, src_off + c, t);
  if (rotary != nullptr) rotate_at(*rotary, position, row.data());
  for (int c = 0; c < d; ++c) store_from_float(dst, dst_off + c, t, row[c]);
}

// k_new / v_new of sequence b into the cache at positions cached_tokens(b) + i.
void append_sequence(const KvCacheParams& kp, int b) {
  const AttentionParams& p = kp.attn;
  std::vector<float> row(p.head_dim);
  const KvCacheParams* rotary = kp.has_rotary() ? &kp : nullptr;
  for (int i = 0; i < kp.seqlen_new; ++i) {
    const int pos = kp.cached_tokens(b) + i;
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t kn = b * kp.kn_batch_stride + i * kp.kn_row_stride + hk * kp.kn_head_stride;
      const int64_t vn = b * kp.vn_batch_stride + i * kp.vn_row_stride + hk * kp.vn_head_stride;
      copy_row(kp.k_new, kn, const_cast<void*>(p.k), k_cache_offset(kp, b, pos, hk), p.head_dim,
               p.dtype, row, rotary, pos);
      copy_row(kp.v_new, vn, const_cast<void*>(p.v), v_cache_offset(kp, b, pos, hk), p.head_dim,
               p.dtype, row, nullptr, pos);
    }
  }
}

// q rotated at each row's position, (batch, seqlen_q, heads_q, d) contiguous in q's dtype.
std::vector<uint8_t> rotated_q(const KvCacheParams& kp) {
  const AttentionParams& p = kp.attn;
  const int d = p.head_dim;
  std::vector<uint8_t> out(static_cast<size_t>(p.total_q) * p.heads_q * d * dtype_size(p.dtype));
  parallel_for(p.batch, p.num_threads, [&](int64_t item, int) {
    const int b = static_cast<int>(item);
    std::vector<float> row(d);
    for (int i = 0; i < p.seqlen_q; ++i) {
      for (int h = 0; h < p.heads_q; ++h) {
        const int64_t src = b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
        const int64_t dst = ((int64_t{b} * p.seqlen_q + i) * p.heads_q + h) * d;
        copy_row(p.q, src, out.data(), dst, d, p.dtype, row, &kp, kp.query_position(b, i));
      }
    }
  });
  return out;
}

// Rows of (sequence b, query head h): q from the rotated copy (or q), keys
// through the cache's addressing.
struct CacheRows {
  const KvCacheParams& kp;
  int b, h, hk;
  MaskPolicy mask;
  const void* q_base;
  const void* k_base;
  const void* v_base;
  bool q_rotated;

  CacheRows(const KvCacheParams& params, const void* rotated, int b_, int h_)
      : kp(params), b(b_), h(h_), hk(h_ / params.attn.group_size()), mask(params.mask(b_)),
        q_base(rotated != nullptr ? rotated : params.attn.q), k_base(params.attn.k),
        v_base(params.attn.v), q_rotated(rotated != nullptr) {}
  int64_t q(int i) const {
    const AttentionParams& p = kp.attn;
    if (q_rotated) return ((int64_t{b} * p.seqlen_q + i) * p.heads_q + h) * p.head_dim;
    return b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
  }
  int64_t k(int j) const { return k_cache_offset(kp, b, j, hk); }
  int64_t v(int j) const { return v_cache_offset(kp, b, j, hk); }
  int64_t o(int i) const {
    const AttentionParams& p = kp.attn;
    return b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
  }
  int64_t lse(int i) const {
    const AttentionParams& p = kp.attn;
    return b * p.lse_batch_stride + h * p.lse_head_stride + i * p.lse_row_stride;
  }
};

// A sequence whose indices are out of range (possible only with trust_indices)
// gets NaN output and lse and no cache write.
void poison_sequence(const KvCacheParams& kp, int b) {
  const AttentionParams& p = kp.attn;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int h = 0; h < p.heads_q; ++h) {
    const CacheRows rows(kp, nullptr, b, h);
    for (int i = 0; i < p.seqlen_q; ++i) {
      for (int c = 0; c < p.head_dim; ++c) store_from_float(p.out, rows.o(i) + c, p.dtype, nan);
      if (p.lse != nullptr) p.lse[rows.lse(i)] = nan;
    }
  }
}

}  // namespace

size_t kvcache_workspace_size(const KvCacheParams& kp) {
  const AttentionParams& p = kp.attn;
  const size_t q_copy = kp.has_rotary() ? static_cast<size_t>(p.total_q) * p.heads_q *
                                              p.head_dim * dtype_size(p.dtype)
                                        : 0;
  return forward_workspace_size(p) + q_copy;
}

fa_status forward_kvcache(const KvCacheParams& kp) {
  const AttentionParams& p = kp.attn;
  std::vector<bool> valid(static_cast<size_t>(p.batch));
  for (int b = 0; b < p.batch; ++b) valid[b] = sequence_indices_valid(kp, b);
  parallel_for(p.batch, p.num_threads, [&](int64_t b, int) {
    if (valid[b]) append_sequence(kp, static_cast<int>(b));
  });
  const std::vector<uint8_t> q_copy = kp.has_rotary() ? rotated_q(kp) : std::vector<uint8_t>{};
  const void* rotated = kp.has_rotary() ? q_copy.data() : nullptr;
  const int q_tiles = ceil_div(p.seqlen_q, kBlockQ);
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads_q * q_tiles;
  const BlockLists no_block_mask(p, false);  // the KV-cache call takes none
  for_each_tile(p, items, [&](int64_t item, ForwardScratch& w) {
    const int64_t bh = item / q_tiles;
    const int b = static_cast<int>(bh / p.heads_q);
    if (!valid[b]) return;
    forward_tile(p, CacheRows(kp, rotated, b, static_cast<int>(bh % p.heads_q)),
                 static_cast<int>(item % q_tiles), w, no_block_mask);
  });
  for (int b = 0; b < p.batch; ++b) {
    if (!valid[b]) poison_sequence(kp, b);
  }
  return FA_OK;
}

}  // namespace flashattn::cpu
