// flashattn C++ API: a thin, header-only layer over the C ABI in flashattn.h.
// Errors become flashattn::Error (carrying the status and the library's message).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

// What every call below throws on failure: the status and the library's message.
class Error : public std::runtime_error {
 public:
  Error(fa_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  fa_status status() const { return status_; }

 private:
  fa_status status_;
};

// Throws Error for any status but FA_OK.
inline void check(fa_status status) {
  if (status != FA_OK) throw Error(status, std::string(fa_status_string(status)) + ": " + fa_last_error());
}

// A C-contiguous tensor descriptor (strides derived from the shape).
inline fa_tensor make_tensor(void* data, fa_dtype dtype, std::initializer_list<int64_t> shape,
                             fa_device_type device = FA_DEVICE_CPU, int device_index = 0) {
  if (shape.size() == 0 || shape.size() > FA_MAX_DIMS) {
    throw Error(FA_ERROR_INVALID_ARGUMENT, "a tensor has 1 to 4 dimensions");
  }
  fa_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// A block-sparse mask (fa_block_mask) over int32 host tensors made with
// make_tensor(..., FA_I32, ...); the tensors must outlive every call using it.
inline fa_block_mask make_block_mask(int block_q, int block_k, const fa_tensor& kv_num_blocks,
                                     const fa_tensor& kv_indices, const fa_tensor* full_kv_num_blocks = nullptr,
                                     const fa_tensor* full_kv_indices = nullptr) {
  fa_block_mask m{};
  m.block_q = block_q;
  m.block_k = block_k;
  m.kv_num_blocks = &kv_num_blocks;
  m.kv_indices = &kv_indices;
  m.full_kv_num_blocks = full_kv_num_blocks;
  m.full_kv_indices = full_kv_indices;
  return m;
}

// Options with flash-attn's defaults; set fields directly or chain the setters.
struct Options {
  float softmax_scale = 0.0f;  // 0 -> 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool deterministic = false;
  fa_backend backend = FA_BACKEND_AUTO;
  void* stream = nullptr;  // cudaStream_t
  int num_threads = 0;
  // Score extras (fa_extras): f32 tensors on q's device, null = off; the
  // tensors must outlive the call.
  const fa_tensor* alibi_slopes = nullptr;  // (heads_q) or (batch, heads_q)
  const fa_tensor* sinks = nullptr;         // (heads_q)
  fa_tensor* dsinks = nullptr;              // (heads_q), written by backward() when sinks is set
  float dropout_p = 0.0f;                   // [0, 1); the backward needs the forward's seed and offset
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Block-sparse mask (fa_block_mask, host int32 lists; CPU backend): the key
  // blocks each query block visits. Give backward() the forward's mask.
  const fa_block_mask* block_mask = nullptr;

  Options& with_causal(bool c = true) { causal = c; return *this; }
  Options& with_window(int left, int right) { window_left = left; window_right = right; return *this; }
  Options& with_softcap(float c) { softcap = c; return *this; }
  Options& with_scale(float s) { softmax_scale = s; return *this; }
  Options& with_backend(fa_backend b) { backend = b; return *this; }
  Options& with_stream(void* s) { stream = s; return *this; }
  Options& with_alibi(const fa_tensor* slopes) { alibi_slopes = slopes; return *this; }
  Options& with_sinks(const fa_tensor* logits, fa_tensor* grad = nullptr) {
    sinks = logits;
    dsinks = grad;
    return *this;
  }
  Options& with_block_mask(const fa_block_mask* mask) { block_mask = mask; return *this; }
  Options& with_dropout(float p, uint64_t seed, uint64_t offset) {
    dropout_p = p;
    dropout_seed = seed;
    dropout_offset = offset;
    return *this;
  }

  fa_options to_c() const {
    fa_options o = fa_default_options();
    o.softmax_scale = softmax_scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.deterministic = deterministic;
    o.backend = backend;
    o.stream = stream;
    o.num_threads = num_threads;
    return o;
  }
  fa_extras extras_to_c() const {
    fa_extras e = fa_default_extras();
    e.alibi_slopes = alibi_slopes;
    e.sinks = sinks;
    e.dsinks = dsinks;
    e.dropout_p = dropout_p;
    e.dropout_seed = dropout_seed;
    e.dropout_offset = dropout_offset;
    e.block_mask = block_mask;
    return e;
  }
};

// out = attention(q, k, v); lse (f32) is written when given.
inline void forward(const fa_tensor& q, const fa_tensor& k, const fa_tensor& v, fa_tensor& out,
                    fa_tensor* lse = nullptr, const Options& options = {},
                    const fa_varlen* varlen = nullptr) {
  const fa_options o = options.to_c();
  const fa_extras e = options.extras_to_c();
  check(fa_forward_ex(&q, &k, &v, &out, lse, varlen, &o, &e));
}

// Bytes of scratch memory backward() needs for these arguments.
inline size_t backward_workspace_size(const fa_tensor& q, const fa_tensor& k, const fa_tensor& v,
                                      const Options& options = {},
                                      const fa_varlen* varlen = nullptr) {
  const fa_options o = options.to_c();
  size_t bytes = 0;
  check(fa_backward_workspace_size(&q, &k, &v, varlen, &o, &bytes));
  return bytes;
}

// dq, dk, dv from the forward's out and lse; workspace as in fa_backward
// (nullptr: the library allocates what it needs).
inline void backward(const fa_tensor& q, const fa_tensor& k, const fa_tensor& v,
                     const fa_tensor& out, const fa_tensor& dout, const fa_tensor& lse,
                     fa_tensor& dq, fa_tensor& dk, fa_tensor& dv, const Options& options = {},
                     const fa_varlen* varlen = nullptr, void* workspace = nullptr,
                     size_t workspace_bytes = 0) {
  const fa_options o = options.to_c();
  const fa_extras e = options.extras_to_c();
  check(fa_backward_ex(&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv, varlen, &o, &e, workspace,
                       workspace_bytes));
}

// Bytes of workspace forward_kvcache needs for these arguments (on q's device).
inline size_t kvcache_workspace_size(const fa_tensor& q, const fa_kvcache& cache,
                                     const Options& options = {}) {
  const fa_options o = options.to_c();
  size_t bytes = 0;
  check(fa_forward_kvcache_workspace_size(&q, &cache, &o, &bytes));
  return bytes;
}

// Attention against a KV cache (see fa_kvcache): appends cache.k_new/v_new in
// place, then out = attention(q, cache); lse (f32) is written when given.
// Options' ALiBi and sinks apply (fa_forward_kvcache_ex); dropout and block masks are refused.
inline void forward_kvcache(const fa_tensor& q, const fa_kvcache& cache, fa_tensor& out,
                            fa_tensor* lse = nullptr, const Options& options = {},
                            void* workspace = nullptr, size_t workspace_bytes = 0) {
  const fa_options o = options.to_c();
  const fa_extras e = options.extras_to_c();
  check(fa_forward_kvcache_ex(&q, &cache, &out, lse, &o, &e, workspace, workspace_bytes));
}

}  // namespace flashattn
