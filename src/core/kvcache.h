// Params of an attention call against a KV cache, and where a cached key lives.
// Shared by the validation, the CPU backend, the reference and the CUDA kernels.
#pragma once

#include <cstdint>

#include "attention/host_device.h"
#include "attention/mask.h"
#include "core/params.h"

namespace flashattn {

struct KvCacheParams {
  // q, out, lse, sizes and options as for a fixed-length forward; k/v point at
  // the caches, with the caches' strides (batch stride = one cache row or one page).
  // attn.seqlen_k is the largest key count of any sequence (cache capacity bound).
  AttentionParams attn;

  int64_t cache_rows = 0;  // contiguous: batch_cache; paged: num_blocks
  int capacity = 0;        // keys a sequence can hold: seqlen_cache, or max_blocks * block_size
  int block_size = 0;      // paged: tokens per page; 0 for a contiguous cache
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int max_blocks = 0;
  const int32_t* cache_seqlens = nullptr;  // null: cache_seqlen for every sequence
  int cache_seqlen = 0;
  const int32_t* cache_batch_idx = nullptr;

  // New tokens (batch, seqlen_new, heads_kv, d), appended before attending.
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int seqlen_new = 0;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;

  // Rotary tables (seqlen_ro, rotary_dim / 2), q's dtype.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int rotary_dim = 0;
  int seqlen_ro = 0;
  int64_t cos_row_stride = 0, sin_row_stride = 0;
  bool rotary_interleaved = false;

  int num_splits = 0;  // 0: the backend's heuristic
  bool trust_indices = false;

  FA_HOST_DEVICE bool is_paged() const { return block_table != nullptr; }
  FA_HOST_DEVICE bool has_rotary() const { return rotary_dim > 0; }
  // Tokens of sequence b in the cache before this call.
  FA_HOST_DEVICE int cached_tokens(int b) const {
    return cache_seqlens != nullptr ? cache_seqlens[b] : cache_seqlen;
  }
  // Keys sequence b attends to: its cache plus the appended tokens.
  FA_HOST_DEVICE int keys(int b) const { return cached_tokens(b) + seqlen_new; }
  // Rotary position of query row i: rows follow the new tokens when the call
  // is causal or windowed, all sit at the cache's end otherwise (flash-attn).
  FA_HOST_DEVICE int query_position(int b, int i) const {
    return cached_tokens(b) + (attn.has_mask() ? i : 0);
  }
  FA_HOST_DEVICE MaskPolicy mask(int b) const {
    return MaskPolicy{attn.seqlen_q, keys(b), attn.window_left, attn.window_right};
  }
};

// Where key j of sequence b lives: a cache row (or page) and the slot in it.
struct CacheSlot {
  int64_t row;
  int slot;
};

FA_HOST_DEVICE CacheSlot cache_slot(const KvCacheParams& p, int b, int j) {
  if (p.is_paged()) return {p.block_table[b * p.block_table_stride + j / p.block_size], j % p.block_size};
  return {p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b, j};
}

// Element offset of a slot's head h in a cache with the given (row-or-page,
// slot, head) strides.
FA_HOST_DEVICE int64_t slot_offset(CacheSlot s, int h, int64_t batch_stride, int64_t row_stride,
                                   int64_t head_stride) {
  return s.row * batch_stride + static_cast<int64_t>(s.slot) * row_stride + h * head_stride;
}

FA_HOST_DEVICE int64_t cache_offset(const KvCacheParams& p, int b, int j, int h,
                                    int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  return slot_offset(cache_slot(p, b, j), h, batch_stride, row_stride, head_stride);
}

FA_HOST_DEVICE int64_t k_cache_offset(const KvCacheParams& p, int b, int j, int h) {
  return cache_offset(p, b, j, h, p.attn.k_batch_stride, p.attn.k_row_stride, p.attn.k_head_stride);
}
FA_HOST_DEVICE int64_t v_cache_offset(const KvCacheParams& p, int b, int j, int h) {
  return cache_offset(p, b, j, h, p.attn.v_batch_stride, p.attn.v_row_stride, p.attn.v_head_stride);
}

// The length of sequence b plus the new tokens fits the cache.
FA_HOST_DEVICE bool cache_length_valid(const KvCacheParams& p, int b) {
  const int cached = p.cached_tokens(b);
  return cached >= 0 && static_cast<int64_t>(cached) + p.seqlen_new <= p.capacity;
}

// Keys [key_begin, key_end) of sequence b live in the cache: pages of the pool
// (pages first + k * step only, so threads can share the walk) or a cache row.
FA_HOST_DEVICE bool keys_addressable(const KvCacheParams& p, int b, int key_begin, int key_end,
                                     int first = 0, int step = 1) {
  if (!p.is_paged()) {
    const int64_t row = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
    return row >= 0 && row < p.cache_rows;
  }
  const int page_end = (key_end + p.block_size - 1) / p.block_size;
  for (int i = key_begin / p.block_size + first; i < page_end; i += step) {
    const int32_t page = p.block_table[b * p.block_table_stride + i];
    if (page < 0 || page >= p.cache_rows) return false;
  }
  return true;
}

// True when every index sequence b uses is in range. Validation checks this on
// the host; the kernels check the part they use again (cache_length_valid and
// keys_addressable over their keys) for indices that change after a graph is captured.
FA_HOST_DEVICE bool sequence_indices_valid(const KvCacheParams& p, int b) {
  return cache_length_valid(p, b) && keys_addressable(p, b, 0, p.keys(b));
}

}  // namespace flashattn
