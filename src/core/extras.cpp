#include "core/extras.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "core/backends.h"
#include "core/block_mask.h"
#include "core/error.h"

namespace flashattn {
namespace {

// NOTES: block_mask took the place of reserved[0..1] (8 bytes, 8-aligned on
// LP64): callers built against the older header see the same size and
// offsets, and their zeroed reserved fields read as "no block mask".
static_assert(sizeof(void*) != 8 ||
                  (offsetof(fa_extras, dropout_offset) == 40 && offsetof(fa_extras, block_mask) == 48 &&
                   offsetof(fa_extras, reserved) == 56 && sizeof(fa_extras) == 80),
              "fa_extras keeps its ABI layout");

// An f32 tensor of shape (heads) or, where batch_ok, (batch, heads) on q's
// device, contiguous in its last dimension.
fa_status check_per_head(const fa_tensor* t, const char* name, const fa_tensor& q,
                         const AttentionParams& p, bool batch_ok) {
  const std::string n(name);
  if (t->ndim != 1 && !(batch_ok && t->ndim == 2)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + (batch_ok ? " must have shape (heads_q) or (batch, heads_q), got "
                                                         : " must have shape (heads_q), got ") +
                                               std::to_string(t->ndim) + " dimensions");
  }
  if (t->dtype != FA_F32) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " must be f32, got " + fa_dtype_name(t->dtype));
  }
  if (t->device != q.device || (q.device == FA_DEVICE_CUDA && t->device_index != q.device_index)) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " must be on q's device");
  }
  const int64_t heads = t->shape[t->ndim - 1];
  const int64_t batch = t->ndim == 2 ? t->shape[0] : 1;
  if (heads != p.heads_q || (t->ndim == 2 && batch != p.batch)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                n + " has " + std::to_string(t->ndim == 2 ? batch : 1) + " x " + std::to_string(heads) +
                    " entries, expected " + (t->ndim == 2 ? std::to_string(p.batch) + " x " : "") +
                    std::to_string(p.heads_q) + " (heads_q)");
  }
  if (heads > 1 && t->strides[t->ndim - 1] != 1) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " must be contiguous in its last dimension");
  }
  // Rows of a (batch, heads) tensor must not overlap (offsets fit: batch, heads are int32).
  if (t->ndim == 2 && batch > 1 && t->strides[0] < heads) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " has a batch stride " + std::to_string(t->strides[0]) +
                                               " below heads_q " + std::to_string(heads));
  }
  if (t->data == nullptr && batch * heads > 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " has a null data pointer");
  }
  return FA_OK;
}

// Reads host values and rejects NaN, and values the formulas do not take:
// slopes must be finite, sinks < +inf (-inf = off).
// NOTES: device values are not read. A copy to the host synchronizes the
// stream on every call (about 0.3 ms of a forward + backward pair at 16k rows
// on the H100, docs/variants.md "Cost") and cannot run inside CUDA-graph
// capture; on the device a NaN or Inf value
// reaches the rows that use it as NaN/Inf does from q (docs/semantics.md).
fa_status check_values(const fa_tensor& t, const char* name, bool allow_minus_inf) {
  if (t.device == FA_DEVICE_CUDA) return FA_OK;
  const int64_t heads = t.shape[t.ndim - 1];
  const int64_t batch = t.ndim == 2 ? t.shape[0] : 1;
  const int64_t row_stride = t.ndim == 2 ? t.strides[0] : heads;
  const int64_t span = (batch - 1) * row_stride + heads;
  if (span <= 0) return FA_OK;
  const float* host = static_cast<const float*>(t.data);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float x = host[static_cast<size_t>(b * row_stride + h)];
      const bool ok = std::isfinite(x) || (allow_minus_inf && x == -INFINITY);
      if (!ok) {
        return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + "[" + std::to_string(b * row_stride + h) +
                                                   "] = " + std::to_string(x) +
                                                   (allow_minus_inf ? " (must be finite or -inf)" : " (must be finite)"));
      }
    }
  }
  return FA_OK;
}

fa_status apply_alibi(const fa_tensor* t, const fa_tensor& q, AttentionParams* p) {
  FA_RETURN_IF_ERROR(check_per_head(t, "alibi_slopes", q, *p, true));
  FA_RETURN_IF_ERROR(check_values(*t, "alibi_slopes", false));
  p->alibi_slopes = static_cast<const float*>(t->data);
  p->alibi_batch_stride = t->ndim == 2 ? t->strides[0] : 0;
  return FA_OK;
}

fa_status apply_sinks(const fa_extras& e, const fa_tensor& q, Pass pass, AttentionParams* p) {
  FA_RETURN_IF_ERROR(check_per_head(e.sinks, "sinks", q, *p, false));
  FA_RETURN_IF_ERROR(check_values(*e.sinks, "sinks", true));
  p->sinks = static_cast<const float*>(e.sinks->data);
  if (pass == Pass::kForward) return FA_OK;
  if (e.dsinks == nullptr) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "dsinks is a null pointer: the backward with sinks writes their gradient");
  }
  FA_RETURN_IF_ERROR(check_per_head(e.dsinks, "dsinks", q, *p, false));
  p->dsinks = static_cast<float*>(e.dsinks->data);
  return FA_OK;
}

fa_status check_dropout_p(float p) {
  if (p >= 0.0f && p < 1.0f) return FA_OK;  // false for NaN too
  return fail(FA_ERROR_INVALID_ARGUMENT, "dropout_p must be in [0, 1), got " + std::to_string(p));
}

// The (batch, heads_q, seqlen_q, seqlen_k) f32 host tensor fa_dropout_mask fills.
fa_status check_mask_tensor(const fa_tensor* m) {
  if (m == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "mask is a null pointer");
  if (m->ndim != 4 || m->dtype != FA_F32 || m->device != FA_DEVICE_CPU) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "mask must be an f32 host tensor of shape (batch, heads_q, seqlen_q, seqlen_k)");
  }
  int64_t max_offset = 0;
  for (int i = 0; i < 4; ++i) {
    if (m->shape[i] < 0 || m->shape[i] > std::numeric_limits<int32_t>::max() ||
        m->strides[i] < (m->shape[i] > 1 ? 1 : 0)) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "mask has a negative or too large dimension, or a stride below 1");
    }
    int64_t term = 0;
    if (m->shape[i] > 0 && (__builtin_mul_overflow(m->shape[i] - 1, m->strides[i], &term) ||
                            __builtin_add_overflow(max_offset, term, &max_offset))) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "mask has strides whose offsets overflow 64-bit indexing");
    }
  }
  if (m->shape[0] * m->shape[1] > std::numeric_limits<int32_t>::max()) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "mask has batch * heads over 2^31 - 1");
  }
  const bool empty = m->shape[0] == 0 || m->shape[1] == 0 || m->shape[2] == 0 || m->shape[3] == 0;
  if (m->data == nullptr && !empty) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "mask has a null data pointer");
  }
  return FA_OK;
}

}  // namespace

fa_status apply_extras(const fa_extras* extras, const fa_tensor& q, Pass pass, AttentionParams* p) {
  if (extras == nullptr) return FA_OK;
  for (int32_t r : extras->reserved) {
    if (r != 0) return fail(FA_ERROR_INVALID_ARGUMENT, "fa_extras.reserved must be zero");
  }
  if (extras->dsinks != nullptr && (pass == Pass::kForward || extras->sinks == nullptr)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                pass == Pass::kForward ? "dsinks is for fa_backward_ex only; pass NULL to the forward"
                                       : "dsinks is given but sinks is NULL");
  }
  FA_RETURN_IF_ERROR(check_dropout_p(extras->dropout_p));
  // The keep bits' counter holds b * heads_q + h in 32 bits (attention/dropout.h).
  if (extras->dropout_p > 0.0f && int64_t{p->batch} * p->heads_q > std::numeric_limits<int32_t>::max()) {
    return fail(FA_ERROR_UNSUPPORTED, "dropout takes batch * heads_q up to 2^31 - 1");
  }
  p->dropout = Dropout::make(extras->dropout_p, extras->dropout_seed, extras->dropout_offset);
  if (extras->alibi_slopes != nullptr) FA_RETURN_IF_ERROR(apply_alibi(extras->alibi_slopes, q, p));
  if (extras->sinks != nullptr) FA_RETURN_IF_ERROR(apply_sinks(*extras, q, pass, p));
  return apply_block_mask(extras->block_mask, p);
}

fa_status apply_kvcache_extras(const fa_extras* extras, const fa_tensor& q, AttentionParams* p) {
  if (extras == nullptr) return FA_OK;
  if (extras->dropout_p != 0.0f) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "dropout_p must be 0 in a KV-cache call (inference has no dropout)");
  }
  if (extras->block_mask != nullptr) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "a KV-cache call takes no block_mask");
  }
  return apply_extras(extras, q, Pass::kForward, p);
}

fa_status dropout_mask(const fa_extras* extras, fa_tensor* mask) {
  if (extras == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "extras is a null pointer");
  FA_RETURN_IF_ERROR(check_dropout_p(extras->dropout_p));
  FA_RETURN_IF_ERROR(check_mask_tensor(mask));
  const Dropout d = Dropout::make(extras->dropout_p, extras->dropout_seed, extras->dropout_offset);
  const int64_t* n = mask->shape;
  const int64_t* st = mask->strides;
  float* out = static_cast<float*>(mask->data);
  for (int64_t b = 0; b < n[0]; ++b)
    for (int64_t h = 0; h < n[1]; ++h)
      for (int64_t i = 0; i < n[2]; ++i)
        for (int64_t j = 0; j < n[3]; ++j) {
          const int bh = static_cast<int>(b * n[1] + h);
          out[b * st[0] + h * st[1] + i * st[2] + j * st[3]] =
              d.enabled() ? d.factor(bh, static_cast<int>(i), static_cast<int>(j)) : 1.0f;
        }
  return FA_OK;
}

}  // namespace flashattn
