// Validation of fa_forward_kvcache's arguments (the KV cache: contiguous or
// paged caches, lengths, appended tokens, rotary tables), in 64-bit
// arithmetic, with the shared checks of validate_parts.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/backends.h"
#include "core/error.h"
#include "core/validate.h"
#include "core/validate_parts.h"

namespace flashattn {

using namespace validation;

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string seq_string(int b) { return "sequence " + std::to_string(b); }

// Two tensors that travel together (k/v, cos/sin): ndim dimensions, q's dtype
// and device, the same shape.
fa_status check_pair(const fa_tensor& q, const fa_tensor* a, const char* a_name, const fa_tensor* b,
                     const char* b_name, int ndim) {
  FA_RETURN_IF_ERROR(check_tensor(a, a_name, ndim));
  FA_RETURN_IF_ERROR(check_tensor(b, b_name, ndim));
  for (const auto& [t, name] : {std::pair{a, a_name}, std::pair{b, b_name}}) {
    FA_RETURN_IF_ERROR(check_same_dtype(q, "q", *t, name));
    FA_RETURN_IF_ERROR(check_same_device(q, "q", *t, name));
  }
  return check_same_shape(*a, a_name, *b, b_name);
}

// k_cache/v_cache: 4-D, q's dtype and device, (rows, slots, heads_kv, d) alike.
fa_status check_cache_tensors(const fa_tensor& q, const fa_kvcache& c) {
  FA_RETURN_IF_ERROR(check_pair(q, c.k_cache, "k_cache", c.v_cache, "v_cache", 4));
  if (c.k_cache->shape[3] != q.shape[3]) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "head_dim of k_cache " + shape_string(*c.k_cache) +
                                               " does not match q " + shape_string(q));
  }
  if (c.k_cache->shape[0] > kInt32Max || c.k_cache->shape[1] > kInt32Max) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "k_cache's first two dimensions must fit in int32");
  }
  return FA_OK;
}

// Shape of the cache: capacity per sequence and what a cache row is.
fa_status set_cache_layout(const fa_kvcache& c, int batch, KvCacheParams* kp) {
  const fa_tensor& k = *c.k_cache;
  kp->cache_rows = k.shape[0];
  if (c.block_table == nullptr) {
    if (c.max_blocks != 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "max_blocks is set but block_table is a null pointer");
    }
    if (c.cache_batch_idx == nullptr && k.shape[0] < batch) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "k_cache holds " + std::to_string(k.shape[0]) +
                                                 " sequences, q has batch " + std::to_string(batch));
    }
    kp->capacity = static_cast<int>(k.shape[1]);
    return FA_OK;
  }
  if (c.cache_batch_idx != nullptr) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "cache_batch_idx is not supported with a paged cache "
                                           "(block_table already maps sequences to pages)");
  }
  if (k.shape[1] < 1) return fail(FA_ERROR_INVALID_ARGUMENT, "block_size (k_cache dim 1) must be >= 1");
  if (c.max_blocks < 1) return fail(FA_ERROR_INVALID_ARGUMENT, "max_blocks must be >= 1 with a block_table");
  if (c.block_table_stride < c.max_blocks) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "block_table_stride " + std::to_string(c.block_table_stride) +
                                               " is smaller than max_blocks " + std::to_string(c.max_blocks));
  }
  const int64_t capacity = int64_t{c.max_blocks} * k.shape[1];
  if (capacity > kInt32Max) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "max_blocks * block_size must fit in int32");
  }
  int64_t table_end = 0;
  if (__builtin_mul_overflow(c.block_table_stride, int64_t{batch}, &table_end)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "block_table_stride * batch overflows 64-bit indexing");
  }
  kp->block_size = static_cast<int>(k.shape[1]);
  kp->block_table = c.block_table;
  kp->block_table_stride = c.block_table_stride;
  kp->max_blocks = c.max_blocks;
  kp->capacity = static_cast<int>(capacity);
  return FA_OK;
}

// k_new/v_new: both or neither, (batch, seqlen_new, heads_kv, d) in q's dtype.
fa_status set_new_tokens(const fa_tensor& q, const fa_kvcache& c, KvCacheParams* kp) {
  if ((c.k_new == nullptr) != (c.v_new == nullptr)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "k_new and v_new must be given together");
  }
  if (c.k_new == nullptr) return FA_OK;
  FA_RETURN_IF_ERROR(check_pair(q, c.k_new, "k_new", c.v_new, "v_new", 4));
  const fa_tensor& kn = *c.k_new;
  if (kn.shape[0] != q.shape[0] || kn.shape[2] != c.k_cache->shape[2] ||
      kn.shape[3] != q.shape[3]) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "k_new shape " + shape_string(kn) +
                                               " must be (batch, seqlen_new, heads_kv, head_dim) = (" +
                                               std::to_string(q.shape[0]) + ", *, " +
                                               std::to_string(c.k_cache->shape[2]) + ", " +
                                               std::to_string(q.shape[3]) + ")");
  }
  if (kn.shape[1] > kInt32Max) return fail(FA_ERROR_INVALID_ARGUMENT, "seqlen_new must fit in int32");
  kp->k_new = kn.data;
  kp->v_new = c.v_new->data;
  kp->seqlen_new = static_cast<int>(kn.shape[1]);
  set_strides(kn, false, &kp->kn_batch_stride, &kp->kn_row_stride, &kp->kn_head_stride);
  set_strides(*c.v_new, false, &kp->vn_batch_stride, &kp->vn_row_stride, &kp->vn_head_stride);
  return FA_OK;
}

// rotary_cos/sin: both or neither, (seqlen_ro, rotary_dim / 2) in q's dtype, with k_new.
fa_status set_rotary(const fa_tensor& q, const fa_kvcache& c, KvCacheParams* kp) {
  if ((c.rotary_cos == nullptr) != (c.rotary_sin == nullptr)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "rotary_cos and rotary_sin must be given together");
  }
  if (c.rotary_cos == nullptr) return FA_OK;
  if (c.k_new == nullptr) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "rotary_cos/rotary_sin need k_new and v_new (the rotary "
                                           "embedding is applied to q and the appended keys)");
  }
  FA_RETURN_IF_ERROR(check_pair(q, c.rotary_cos, "rotary_cos", c.rotary_sin, "rotary_sin", 2));
  const int64_t half = c.rotary_cos->shape[1];
  if (half < 1 || 2 * half > q.shape[3]) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "rotary_cos shape " + shape_string(*c.rotary_cos) +
                                               ": rotary_dim = 2 * dim 1 must be in [2, head_dim " +
                                               std::to_string(q.shape[3]) + "]");
  }
  if (c.rotary_cos->shape[0] > kInt32Max) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "seqlen_ro must fit in int32");
  }
  kp->rotary_cos = c.rotary_cos->data;
  kp->rotary_sin = c.rotary_sin->data;
  kp->rotary_dim = static_cast<int>(2 * half);
  kp->seqlen_ro = static_cast<int>(c.rotary_cos->shape[0]);
  kp->cos_row_stride = c.rotary_cos->strides[0];
  kp->sin_row_stride = c.rotary_sin->strides[0];
  kp->rotary_interleaved = c.rotary_interleaved != 0;
  return FA_OK;
}

// Sizes, q/out/lse and options into kp->attn (k/v = the caches).
fa_status set_attention_part(const fa_tensor& q, const fa_kvcache& c, const fa_options& o,
                             KvCacheParams* kp) {
  AttentionParams& p = kp->attn;
  p = AttentionParams{};
  const int64_t heads_q = q.shape[2], heads_kv = c.k_cache->shape[2], d = q.shape[3];
  if (d <= 0 || d > kMaxHeadDim) {
    return fail(d <= 0 ? FA_ERROR_INVALID_ARGUMENT : FA_ERROR_UNSUPPORTED,
                "head_dim " + std::to_string(d) + " is not supported (1 to 256)");
  }
  if (heads_q <= 0 || heads_kv <= 0) return fail(FA_ERROR_INVALID_ARGUMENT, "number of heads must be positive");
  if (heads_q % heads_kv != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "heads_q (" + std::to_string(heads_q) +
                                               ") must be a multiple of heads_kv (" +
                                               std::to_string(heads_kv) + ")");
  }
  if (q.shape[0] > kInt32Max || q.shape[1] > kInt32Max) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "batch and seqlen_q must fit in int32");
  }
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  p.batch = static_cast<int>(q.shape[0]);
  p.seqlen_q = static_cast<int>(q.shape[1]);
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_kv);
  p.head_dim = static_cast<int>(d);
  p.total_q = q.shape[0] * q.shape[1];
  set_strides(q, false, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  set_strides(*c.k_cache, false, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  set_strides(*c.v_cache, false, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  p.q = q.data;
  p.k = c.k_cache->data;
  p.v = c.v_cache->data;
  p.scale = o.softmax_scale > 0 ? o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.softcap = o.softcap;
  p.causal = o.causal != 0;
  p.window_left = o.window_left;
  p.window_right = p.causal ? 0 : o.window_right;
  p.stream = o.stream;
  p.num_threads = o.num_threads;
  return FA_OK;
}

fa_status check_cached_lengths(const KvCacheParams& kp) {
  if (kp.cache_seqlens == nullptr && kp.cache_seqlen < 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "cache_seqlen must be >= 0, got " + std::to_string(kp.cache_seqlen));
  }
  if (int64_t{kp.seqlen_new} > kp.capacity) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "seqlen_new " + std::to_string(kp.seqlen_new) +
                                               " exceeds the cache's capacity " + std::to_string(kp.capacity));
  }
  return FA_OK;
}

// Copies n int32 values of an index array to the host.
fa_status host_indices(const int32_t* src, int64_t n, const AttentionParams& p,
                       std::vector<int32_t>* dst) {
  dst->resize(static_cast<size_t>(n));
  if (n == 0) return FA_OK;
  if (p.device == FA_DEVICE_CUDA) {
    return cuda::copy_to_host(dst->data(), src, dst->size() * sizeof(int32_t), p.device_index, p.stream);
  }
  for (int64_t i = 0; i < n; ++i) (*dst)[static_cast<size_t>(i)] = src[i];
  return FA_OK;
}

// One sequence's indices, naming the first one out of range.
fa_status check_sequence_indices(const KvCacheParams& kp, int b) {
  const int cached = kp.cached_tokens(b);
  if (cached < 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "cache_seqlens[" + std::to_string(b) + "] = " +
                                               std::to_string(cached) + " is negative");
  }
  if (int64_t{cached} + kp.seqlen_new > kp.capacity) {
    return fail(FA_ERROR_INVALID_ARGUMENT, seq_string(b) + ": cache_seqlens " + std::to_string(cached) +
                                               " + seqlen_new " + std::to_string(kp.seqlen_new) +
                                               " exceeds the cache's capacity " +
                                               std::to_string(kp.capacity));
  }
  if (!sequence_indices_valid(kp, b)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                kp.is_paged() ? seq_string(b) + ": block_table names a page outside the pool of " +
                                    std::to_string(kp.cache_rows) + " pages"
                              : "cache_batch_idx[" + std::to_string(b) + "] = " +
                                    std::to_string(kp.cache_batch_idx[b]) + " is outside the " +
                                    std::to_string(kp.cache_rows) + " cache rows");
  }
  return FA_OK;
}

// Appending through cache_batch_idx must not write one cache row twice.
fa_status check_distinct_rows(const KvCacheParams& kp) {
  if (kp.cache_batch_idx == nullptr || kp.seqlen_new == 0) return FA_OK;
  std::vector<bool> used(static_cast<size_t>(kp.cache_rows), false);
  for (int b = 0; b < kp.attn.batch; ++b) {
    const size_t row = static_cast<size_t>(kp.cache_batch_idx[b]);
    if (used[row]) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "cache_batch_idx names cache row " + std::to_string(row) +
                                                 " twice while appending k_new/v_new");
    }
    used[row] = true;
  }
  return FA_OK;
}

}  // namespace

fa_status check_kvcache_indices(const KvCacheParams& in) {
  const AttentionParams& p = in.attn;
  // A host view of the params whose index arrays are host copies.
  KvCacheParams kp = in;
  std::vector<int32_t> lens, table, rows;
  if (in.cache_seqlens != nullptr) {
    FA_RETURN_IF_ERROR(host_indices(in.cache_seqlens, p.batch, p, &lens));
    kp.cache_seqlens = lens.data();
  }
  if (in.cache_batch_idx != nullptr) {
    FA_RETURN_IF_ERROR(host_indices(in.cache_batch_idx, p.batch, p, &rows));
    kp.cache_batch_idx = rows.data();
  }
  if (in.block_table != nullptr && p.batch > 0) {
    const int64_t n = (p.batch - 1) * in.block_table_stride + in.max_blocks;
    FA_RETURN_IF_ERROR(host_indices(in.block_table, n, p, &table));
    kp.block_table = table.data();
  }
  for (int b = 0; b < p.batch; ++b) FA_RETURN_IF_ERROR(check_sequence_indices(kp, b));
  FA_RETURN_IF_ERROR(check_distinct_rows(kp));
  if (kp.has_rotary()) {
    for (int b = 0; b < p.batch; ++b) {
      const int64_t last = int64_t{kp.cached_tokens(b)} + std::max(kp.seqlen_new, p.seqlen_q);
      if (last > kp.seqlen_ro) {
        return fail(FA_ERROR_INVALID_ARGUMENT, seq_string(b) + " needs rotary positions up to " +
                                                   std::to_string(last - 1) + ", rotary_cos has " +
                                                   std::to_string(kp.seqlen_ro) + " rows");
      }
    }
  }
  return FA_OK;
}

fa_status make_kvcache_params(const KvCacheArgs& a, KvCacheParams* kp) {
  if (a.options == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "options is a null pointer");
  if (a.cache == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "cache is a null pointer");
  if (kp == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "params is a null pointer");
  FA_RETURN_IF_ERROR(check_options(*a.options));
  FA_RETURN_IF_ERROR(check_tensor(a.q, "q", 4));
  const fa_kvcache& c = *a.cache;
  FA_RETURN_IF_ERROR(check_cache_tensors(*a.q, c));
  *kp = KvCacheParams{};
  FA_RETURN_IF_ERROR(set_attention_part(*a.q, c, *a.options, kp));
  FA_RETURN_IF_ERROR(set_cache_layout(c, kp->attn.batch, kp));
  FA_RETURN_IF_ERROR(set_new_tokens(*a.q, c, kp));
  FA_RETURN_IF_ERROR(set_rotary(*a.q, c, kp));
  kp->cache_seqlens = c.cache_seqlens;
  kp->cache_seqlen = c.cache_seqlen;
  kp->cache_batch_idx = c.cache_batch_idx;
  kp->num_splits = c.num_splits;
  kp->trust_indices = c.trust_indices != 0;
  if (c.num_splits < 0) return fail(FA_ERROR_INVALID_ARGUMENT, "num_splits must be >= 0 (0 = heuristic)");
  FA_RETURN_IF_ERROR(check_cached_lengths(*kp));
  kp->attn.seqlen_k = kp->capacity;
  kp->attn.total_k = kp->cache_rows;
  FA_RETURN_IF_ERROR(check_backend(kp->attn, resolve_backend(*a.options, *a.q), *a.q));
  if (a.out != nullptr) {
    FA_RETURN_IF_ERROR(check_like(a.out, "out", *a.q, "q"));
    set_strides(*a.out, false, &kp->attn.o_batch_stride, &kp->attn.o_row_stride,
                &kp->attn.o_head_stride);
    kp->attn.out = a.out->data;
  }
  if (a.lse != nullptr) FA_RETURN_IF_ERROR(check_lse(a.lse, kp->attn, *a.q, &kp->attn));
  return FA_OK;
}

}  // namespace flashattn
