#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/abi_enum.h"
#include "core/backends.h"
#include "core/error.h"
#include "core/overlap.h"
#include "core/validate_parts.h"

namespace flashattn {
namespace validation {

std::string shape_string(const fa_tensor& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + ")";
}

std::string device_string(const fa_tensor& t) {
  return t.device == FA_DEVICE_CPU ? std::string("cpu") : "cuda:" + std::to_string(t.device_index);
}

fa_status check_tensor(const fa_tensor* t, const char* name, int ndim) {
  if (t == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " is a null pointer");
  if (t->ndim != ndim) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " must have " +
                                               std::to_string(ndim) + " dimensions, got " +
                                               std::to_string(t->ndim));
  }
  const int64_t dtype = enum_code(t->dtype), device = enum_code(t->device);
  if (dtype != FA_F32 && dtype != FA_F16 && dtype != FA_BF16) {
    return fail(FA_ERROR_UNSUPPORTED,
                std::string(name) + " has unsupported dtype code " + std::to_string(dtype));
  }
  if (device != FA_DEVICE_CPU && device != FA_DEVICE_CUDA) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(name) + " has unknown device type code " + std::to_string(device));
  }
  int64_t elements = 1;
  for (int i = 0; i < ndim; ++i) {
    if (t->shape[i] < 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  std::string(name) + " has a negative dimension " + shape_string(*t));
    }
    if (__builtin_mul_overflow(elements, t->shape[i], &elements)) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  std::string(name) + " has more elements than 64-bit indexing allows");
    }
  }
  // An empty tensor is never read or written: any strides and pointer will do.
  if (tensor_is_empty(*t)) return FA_OK;
  return check_tensor_extent(*t, name);
}

}  // namespace validation

using namespace validation;

fa_status check_tensor_extent(const fa_tensor& t, const char* name) {
  const int ndim = t.ndim;
  for (int i = 0; i < ndim; ++i) {
    if (t.shape[i] > 1 && t.strides[i] < 1) {
      return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " has stride " +
                                                 std::to_string(t.strides[i]) + " in dimension " +
                                                 std::to_string(i) + "; strides must be positive");
    }
  }
  if (t.shape[ndim - 1] > 1 && t.strides[ndim - 1] != 1) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) +
                                               " must be contiguous in its last dimension (stride " +
                                               std::to_string(t.strides[ndim - 1]) + ", expected 1)");
  }
  if (t.data == nullptr) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " has a null data pointer");
  }
  ByteSpan span;
  if (!tensor_byte_span(t, &span)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(name) + " " + shape_string(t) +
                    " has strides whose byte offsets overflow 64-bit indexing or wrap the address space");
  }
  return FA_OK;
}

fa_status check_no_overlap(const fa_tensor& output, const char* output_name, const fa_tensor& other,
                           const char* other_name) {
  if (!tensors_may_overlap(output, other)) return FA_OK;
  return fail(FA_ERROR_INVALID_ARGUMENT, std::string(output_name) + " overlaps " + other_name +
                                             " in memory; outputs must not share memory with "
                                             "inputs or with each other");
}

namespace validation {

fa_status check_same_shape(const fa_tensor& a, const char* a_name, const fa_tensor& b,
                           const char* b_name) {
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i]) {
      return fail(FA_ERROR_INVALID_ARGUMENT, std::string(a_name) + " shape " + shape_string(a) +
                                                 " does not match " + b_name + " shape " +
                                                 shape_string(b));
    }
  }
  return FA_OK;
}

fa_status check_same_dtype(const fa_tensor& a, const char* a_name, const fa_tensor& b,
                           const char* b_name) {
  if (a.dtype != b.dtype) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string("mixed dtypes: ") + a_name + " is " +
                                               fa_dtype_name(a.dtype) + " but " + b_name + " is " +
                                               fa_dtype_name(b.dtype));
  }
  return FA_OK;
}

fa_status check_same_device(const fa_tensor& a, const char* a_name, const fa_tensor& b,
                            const char* b_name) {
  if (a.device != b.device || (a.device == FA_DEVICE_CUDA && a.device_index != b.device_index)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(a_name) + " is on " + device_string(a) +
                                               " but " + b_name + " is on " + device_string(b));
  }
  return FA_OK;
}

fa_status check_options(const fa_options& o) {
  if (!std::isfinite(o.softmax_scale) || o.softmax_scale < 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "softmax_scale must be finite and >= 0 (0 selects 1/sqrt(head_dim))");
  }
  if (o.window_left < -1 || o.window_right < -1) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "window sizes must be >= -1 (-1 = unbounded), got (" +
                                               std::to_string(o.window_left) + ", " +
                                               std::to_string(o.window_right) + ")");
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "softcap must be finite and >= 0 (0 = off)");
  }
  const int64_t backend = enum_code(o.backend);
  if (backend != FA_BACKEND_AUTO && backend != FA_BACKEND_CPU && backend != FA_BACKEND_CUDA) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "unknown backend code " + std::to_string(backend));
  }
  if (o.num_threads < 0) return fail(FA_ERROR_INVALID_ARGUMENT, "num_threads must be >= 0");
  for (size_t i = 0; i < sizeof o.reserved / sizeof o.reserved[0]; ++i) {
    if (o.reserved[i] != 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "options.reserved[" + std::to_string(i) +
                                                 "] must be 0 (start from fa_default_options())");
    }
  }
  return FA_OK;
}

// Reads cu_seqlens (copying from the device when needed; not while the stream
// is being captured into a CUDA graph) and checks them in
// 64-bit arithmetic: cu[0] = 0, non-decreasing, cu[batch] = total, every
// length <= max_seqlen. Then every offset cu[b] + i (i < length) is a row of
// the tensor, and every length fits the kernels' int.
fa_status check_cu_seqlens(const int32_t* cu, const char* name, int batch, int64_t total,
                           int max_seqlen, const fa_tensor& q, void* stream, bool capturing) {
  if (cu == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " is a null pointer");
  if (capturing) return FA_OK;
  std::vector<int32_t> copy;
  const int32_t* host = cu;
  if (q.device == FA_DEVICE_CUDA) {
    copy.resize(static_cast<size_t>(batch) + 1);
    FA_RETURN_IF_ERROR(cuda::copy_to_host(copy.data(), cu, copy.size() * sizeof(int32_t),
                                          q.device_index, stream));
    host = copy.data();
  }
  if (host[0] != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(name) + "[0] must be 0, got " + std::to_string(host[0]));
  }
  for (int b = 0; b < batch; ++b) {
    const int64_t len = int64_t{host[b + 1]} - int64_t{host[b]};
    if (len < 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " must be non-decreasing: [" +
                                                 std::to_string(b) + "]=" + std::to_string(host[b]) +
                                                 " > [" + std::to_string(b + 1) +
                                                 "]=" + std::to_string(host[b + 1]));
    }
    if (len > max_seqlen) {
      return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + ": sequence " +
                                                 std::to_string(b) + " has length " +
                                                 std::to_string(len) + " > max_seqlen " +
                                                 std::to_string(max_seqlen));
    }
  }
  if (host[batch] != total) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + "[batch] = " +
                                               std::to_string(host[batch]) +
                                               " does not match total tokens " +
                                               std::to_string(total));
  }
  return FA_OK;
}

// NOTES: the limits of flashattn.h, which keep the kernels' int arithmetic in
// range: sequences of at most FA_MAX_SEQLEN = 2^29 rows keep row + key offset +
// window sums (each term normalised below 2^29) below 2^31 with room for tile
// padding, and at most
// INT32_MAX (sequence, head, FA_MIN_TILE_ROWS-row tile) triples make every
// tile count and tile index an int.
fa_status check_sizes(const AttentionParams& p) {
  if (p.seqlen_q > FA_MAX_SEQLEN || p.seqlen_k > FA_MAX_SEQLEN) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(p.is_varlen() ? "max_seqlen_q/k" : "seqlen_q/k") + " (" +
                    std::to_string(p.seqlen_q) + ", " + std::to_string(p.seqlen_k) +
                    ") exceed FA_MAX_SEQLEN = " + std::to_string(FA_MAX_SEQLEN));
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  const auto tiles_fit = [&](int heads, int seqlen) {
    const int64_t per_sequence = (int64_t{seqlen} + FA_MIN_TILE_ROWS - 1) / FA_MIN_TILE_ROWS;
    int64_t tiles = 0;
    return !__builtin_mul_overflow(int64_t{p.batch} * heads, per_sequence, &tiles) && tiles <= kIntMax;
  };
  if (!tiles_fit(p.heads_q, p.seqlen_q) || !tiles_fit(p.heads_kv, p.seqlen_k)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "batch x heads x ceil(seqlen / " + std::to_string(FA_MIN_TILE_ROWS) +
                    ") exceeds INT32_MAX tiles (batch " + std::to_string(p.batch) + ", heads " +
                    std::to_string(p.heads_q) + "/" + std::to_string(p.heads_kv) + ", seqlen " +
                    std::to_string(p.seqlen_q) + "/" + std::to_string(p.seqlen_k) + ")");
  }
  return FA_OK;
}

// A window at least as wide as the range it could cut away cuts nothing: row
// i sees keys from i + (seqlen_k - seqlen_q) - left, which is <= 0 for every
// row once left >= seqlen_k, up to i + (seqlen_k - seqlen_q) + right, which is
// >= seqlen_k - 1 for every row once right >= seqlen_q. Such windows become -1,
// so the mask's sums stay below 2^31 (check_sizes). With varlen the maxima
// bound every sequence.
int normalised_window(int window, int range) { return window >= range ? -1 : window; }

// An empty tensor's strides index nothing (check_tensor accepts any): they are
// stored as 0, so no backend's stride rule (the CUDA kernels' multiples of 16
// bytes) refuses an empty tensor for values it never uses.
void set_strides(const fa_tensor& t, bool varlen, int64_t* batch, int64_t* row, int64_t* head) {
  if (tensor_is_empty(t)) {
    *batch = *row = *head = 0;
  } else if (varlen) {
    *batch = 0;
    *row = t.strides[0];
    *head = t.strides[1];
  } else {
    *batch = t.strides[0];
    *row = t.strides[1];
    *head = t.strides[2];
  }
}

fa_status check_backend(const AttentionParams& p, fa_backend backend, const fa_tensor& q) {
  if (backend == FA_BACKEND_CPU && q.device != FA_DEVICE_CPU) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "the CPU backend needs host tensors, but q is on " + device_string(q));
  }
  if (backend == FA_BACKEND_CUDA) {
    const char* why = "";
    if (!cuda::available(&why)) {
      return fail(FA_ERROR_BACKEND_UNAVAILABLE, std::string("CUDA backend unavailable: ") + why);
    }
    if (q.device != FA_DEVICE_CUDA) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "the CUDA backend needs device tensors, but q is on " + device_string(q));
    }
  }
  if (backend == FA_BACKEND_CPU && (p.head_dim % kHeadDimMultiple != 0 || p.head_dim > kMaxHeadDim)) {
    return fail(FA_ERROR_UNSUPPORTED, "head_dim " + std::to_string(p.head_dim) +
                                          " is not supported: the CPU backend takes multiples of 8 "
                                          "from 8 to 256");
  }
  return FA_OK;
}

}  // namespace validation

using namespace validation;

fa_backend resolve_backend(const fa_options& options, const fa_tensor& q) {
  if (options.backend != FA_BACKEND_AUTO) return options.backend;
  return q.device == FA_DEVICE_CUDA ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
}

fa_status make_shape_params(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                            const fa_varlen* varlen, const fa_options* options,
                            AttentionParams* p) {
  if (options == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "options is a null pointer");
  if (p == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "params is a null pointer");
  FA_RETURN_IF_ERROR(check_options(*options));
  const bool is_varlen = varlen != nullptr;
  const int nd = is_varlen ? 3 : 4;
  FA_RETURN_IF_ERROR(check_tensor(q, "q", nd));
  FA_RETURN_IF_ERROR(check_tensor(k, "k", nd));
  FA_RETURN_IF_ERROR(check_tensor(v, "v", nd));
  FA_RETURN_IF_ERROR(check_same_dtype(*q, "q", *k, "k"));
  FA_RETURN_IF_ERROR(check_same_dtype(*q, "q", *v, "v"));
  FA_RETURN_IF_ERROR(check_same_device(*q, "q", *k, "k"));
  FA_RETURN_IF_ERROR(check_same_device(*q, "q", *v, "v"));
  FA_RETURN_IF_ERROR(check_same_shape(*k, "k", *v, "v"));

  const int h = nd - 2;  // heads dimension
  const int64_t head_dim = q->shape[nd - 1];
  if (k->shape[nd - 1] != head_dim) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "head_dim of k " + shape_string(*k) +
                                               " does not match q " + shape_string(*q));
  }
  if (head_dim <= 0) return fail(FA_ERROR_INVALID_ARGUMENT, "head_dim must be positive");
  if (head_dim > kMaxHeadDim) {
    return fail(FA_ERROR_UNSUPPORTED,
                "head_dim " + std::to_string(head_dim) + " is not supported (at most 256)");
  }
  const int64_t heads_q = q->shape[h];
  const int64_t heads_kv = k->shape[h];
  if (heads_q <= 0 || heads_kv <= 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "number of heads must be positive");
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (heads_q > kIntMax) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "heads_q " + std::to_string(heads_q) + " exceeds INT32_MAX");
  }
  if (heads_q % heads_kv != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "heads_q (" + std::to_string(heads_q) +
                                               ") must be a multiple of heads_kv (" +
                                               std::to_string(heads_kv) + ")");
  }
  *p = AttentionParams{};
  p->dtype = q->dtype;
  p->device = q->device;
  p->device_index = q->device_index;
  p->heads_q = static_cast<int>(heads_q);
  p->heads_kv = static_cast<int>(heads_kv);
  p->head_dim = static_cast<int>(head_dim);
  if (is_varlen) {
    if (varlen->batch < 0) return fail(FA_ERROR_INVALID_ARGUMENT, "varlen batch must be >= 0");
    if (varlen->max_seqlen_q < 0 || varlen->max_seqlen_k < 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "max_seqlen_q/k must be >= 0");
    }
    if (q->shape[0] > kIntMax || k->shape[0] > kIntMax) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "total tokens exceed int32 range of cu_seqlens: q has " +
                      std::to_string(q->shape[0]) + ", k has " + std::to_string(k->shape[0]));
    }
    p->batch = varlen->batch;
    p->seqlen_q = varlen->max_seqlen_q;
    p->seqlen_k = varlen->max_seqlen_k;
    p->total_q = q->shape[0];
    p->total_k = k->shape[0];
    FA_RETURN_IF_ERROR(check_sizes(*p));
    // Under CUDA-graph capture nothing may copy back: the CUDA backend's
    // calls then read a checked copy made on the device (cuda/common/captured_varlen.h).
    bool capturing = false;
    if (q->device == FA_DEVICE_CUDA)
      FA_RETURN_IF_ERROR(cuda::stream_is_capturing(options->stream, q->device_index, &capturing));
    FA_RETURN_IF_ERROR(check_cu_seqlens(varlen->cu_seqlens_q, "cu_seqlens_q", p->batch,
                                        p->total_q, p->seqlen_q, *q, options->stream, capturing));
    FA_RETURN_IF_ERROR(check_cu_seqlens(varlen->cu_seqlens_k, "cu_seqlens_k", p->batch,
                                        p->total_k, p->seqlen_k, *q, options->stream, capturing));
    p->cu_seqlens_q = varlen->cu_seqlens_q;
    p->cu_seqlens_k = varlen->cu_seqlens_k;
  } else {
    if (k->shape[0] != q->shape[0]) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "batch of k " + shape_string(*k) +
                                                 " does not match q " + shape_string(*q));
    }
    if (q->shape[0] > kIntMax || q->shape[1] > kIntMax || k->shape[1] > kIntMax) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "batch and sequence lengths must fit in int32");
    }
    p->batch = static_cast<int>(q->shape[0]);
    p->seqlen_q = static_cast<int>(q->shape[1]);
    p->seqlen_k = static_cast<int>(k->shape[1]);
    p->total_q = q->shape[0] * q->shape[1];
    p->total_k = k->shape[0] * k->shape[1];
    FA_RETURN_IF_ERROR(check_sizes(*p));
  }
  set_strides(*q, is_varlen, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
  set_strides(*k, is_varlen, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
  set_strides(*v, is_varlen, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
  p->q = q->data;
  p->k = k->data;
  p->v = v->data;

  p->scale = options->softmax_scale > 0 ? options->softmax_scale
                                        : 1.0f / std::sqrt(static_cast<float>(head_dim));
  p->softcap = options->softcap;
  p->causal = options->causal != 0;
  p->window_left = normalised_window(options->window_left, p->seqlen_k);
  // flash-attn semantics: causal is a right window of 0 (overriding any other).
  p->window_right = p->causal ? 0 : normalised_window(options->window_right, p->seqlen_q);
  p->deterministic = options->deterministic != 0;
  p->stream = options->stream;
  p->num_threads = options->num_threads;

  return check_backend(*p, resolve_backend(*options, *q), *q);
}

namespace validation {

fa_status check_lse(const fa_tensor* lse, const AttentionParams& p, const fa_tensor& q,
                    AttentionParams* out) {
  const bool is_varlen = p.is_varlen();
  FA_RETURN_IF_ERROR(check_tensor(lse, "lse", is_varlen ? 2 : 3));
  if (lse->dtype != FA_F32) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string("lse must be f32, got ") + fa_dtype_name(lse->dtype));
  }
  FA_RETURN_IF_ERROR(check_same_device(q, "q", *lse, "lse"));
  if (is_varlen) {
    if (lse->shape[0] != p.heads_q || lse->shape[1] != p.total_q) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "lse shape " + shape_string(*lse) +
                                                 " must be (heads_q, total_q) = (" +
                                                 std::to_string(p.heads_q) + ", " +
                                                 std::to_string(p.total_q) + ")");
    }
    out->lse_batch_stride = 0;
    out->lse_head_stride = lse->strides[0];
    out->lse_row_stride = lse->strides[1];
  } else {
    if (lse->shape[0] != p.batch || lse->shape[1] != p.heads_q || lse->shape[2] != p.seqlen_q) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "lse shape " + shape_string(*lse) +
                                                 " must be (batch, heads_q, seqlen_q) = (" +
                                                 std::to_string(p.batch) + ", " +
                                                 std::to_string(p.heads_q) + ", " +
                                                 std::to_string(p.seqlen_q) + ")");
    }
    out->lse_batch_stride = lse->strides[0];
    out->lse_head_stride = lse->strides[1];
    out->lse_row_stride = lse->strides[2];
  }
  out->lse = static_cast<float*>(lse->data);
  return FA_OK;
}

struct NamedTensor {
  const fa_tensor* tensor;  // null: absent (an optional lse)
  const char* name;
};

// Outputs may share no byte with an input (a kernel reads inputs while other
// threads or CTAs write outputs) nor with each other (two writers race).
// Inputs may overlap each other freely (packed qkv).
fa_status check_outputs_disjoint(std::initializer_list<NamedTensor> outputs,
                                 std::initializer_list<NamedTensor> inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    if (out->tensor == nullptr) continue;
    for (const NamedTensor& in : inputs) {
      if (in.tensor == nullptr) continue;
      FA_RETURN_IF_ERROR(check_no_overlap(*out->tensor, out->name, *in.tensor, in.name));
    }
    for (auto other = out + 1; other != outputs.end(); ++other) {
      if (other->tensor == nullptr) continue;
      FA_RETURN_IF_ERROR(check_no_overlap(*out->tensor, out->name, *other->tensor, other->name));
    }
  }
  return FA_OK;
}

fa_status check_like(const fa_tensor* t, const char* name, const fa_tensor& like,
                     const char* like_name) {
  FA_RETURN_IF_ERROR(check_tensor(t, name, like.ndim));
  FA_RETURN_IF_ERROR(check_same_dtype(like, like_name, *t, name));
  FA_RETURN_IF_ERROR(check_same_device(like, like_name, *t, name));
  return check_same_shape(*t, name, like, like_name);
}

}  // namespace validation

using namespace validation;

fa_status make_forward_params(const ForwardArgs& a, AttentionParams* p) {
  FA_RETURN_IF_ERROR(make_shape_params(a.q, a.k, a.v, a.varlen, a.options, p));
  FA_RETURN_IF_ERROR(check_like(a.out, "out", *a.q, "q"));
  set_strides(*a.out, p->is_varlen(), &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
  p->out = a.out->data;
  if (a.lse != nullptr) FA_RETURN_IF_ERROR(check_lse(a.lse, *p, *a.q, p));
  return check_outputs_disjoint({{a.out, "out"}, {a.lse, "lse"}},
                                {{a.q, "q"}, {a.k, "k"}, {a.v, "v"}});
}

fa_status make_backward_params(const BackwardArgs& a, AttentionParams* p) {
  FA_RETURN_IF_ERROR(make_shape_params(a.q, a.k, a.v, a.varlen, a.options, p));
  const bool vl = p->is_varlen();
  FA_RETURN_IF_ERROR(check_like(a.out, "out", *a.q, "q"));
  FA_RETURN_IF_ERROR(check_like(a.dout, "dout", *a.q, "q"));
  FA_RETURN_IF_ERROR(check_like(a.dq, "dq", *a.q, "q"));
  FA_RETURN_IF_ERROR(check_like(a.dk, "dk", *a.k, "k"));
  FA_RETURN_IF_ERROR(check_like(a.dv, "dv", *a.v, "v"));
  if (a.lse == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "lse is a null pointer");
  FA_RETURN_IF_ERROR(check_lse(a.lse, *p, *a.q, p));
  FA_RETURN_IF_ERROR(check_outputs_disjoint(
      {{a.dq, "dq"}, {a.dk, "dk"}, {a.dv, "dv"}},
      {{a.q, "q"}, {a.k, "k"}, {a.v, "v"}, {a.out, "out"}, {a.dout, "dout"}, {a.lse, "lse"}}));
  set_strides(*a.out, vl, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
  set_strides(*a.dout, vl, &p->do_batch_stride, &p->do_row_stride, &p->do_head_stride);
  set_strides(*a.dq, vl, &p->dq_batch_stride, &p->dq_row_stride, &p->dq_head_stride);
  set_strides(*a.dk, vl, &p->dk_batch_stride, &p->dk_row_stride, &p->dk_head_stride);
  set_strides(*a.dv, vl, &p->dv_batch_stride, &p->dv_row_stride, &p->dv_head_stride);
  p->out = a.out->data;
  p->dout = a.dout->data;
  p->dq = a.dq->data;
  p->dk = a.dk->data;
  p->dv = a.dv->data;
  return FA_OK;
}

fa_status check_workspace(const BackwardArgs& a, const void* workspace, size_t bytes) {
  if (workspace == nullptr || bytes == 0) return FA_OK;
  if (reinterpret_cast<uintptr_t>(workspace) % FA_WORKSPACE_ALIGNMENT != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "workspace must be " +
                                               std::to_string(FA_WORKSPACE_ALIGNMENT) +
                                               "-byte aligned");
  }
  const uint64_t begin = reinterpret_cast<uintptr_t>(workspace);
  uint64_t end = 0;
  if (__builtin_add_overflow(begin, uint64_t{bytes}, &end)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "workspace + workspace_bytes wraps the address space");
  }
  for (const NamedTensor& t : {NamedTensor{a.q, "q"}, {a.k, "k"}, {a.v, "v"}, {a.out, "out"},
                               {a.dout, "dout"}, {a.lse, "lse"}, {a.dq, "dq"}, {a.dk, "dk"},
                               {a.dv, "dv"}}) {
    ByteSpan span;
    if (tensor_is_empty(*t.tensor) || !tensor_byte_span(*t.tensor, &span)) continue;
    if (span.intersects({begin, end})) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  std::string("workspace overlaps ") + t.name + " in memory");
    }
  }
  return FA_OK;
}

}  // namespace flashattn
