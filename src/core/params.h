// The one plain params struct. The C API fills it after validation; the CPU
// backend, the CUDA kernels and the reference all take it. No framework types.
#pragma once

#include <cstdint>

#include "attention/block_mask.h"
#include "attention/dropout.h"
#include "attention/host_device.h"
#include "flashattn/flashattn.h"

namespace flashattn {

// Head dims every backend takes: multiples of 8 (16-byte rows of 16-bit
// values) up to 256. Validation and the CUDA kernel lists (cuda/head_dims.h)
// share these.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kHeadDimMultiple = 8;

struct AttentionParams {
  fa_dtype dtype = FA_F32;
  fa_device_type device = FA_DEVICE_CPU;
  int device_index = 0;

  // Sizes. For variable-length batches seqlen_q/seqlen_k hold the maxima and
  // the per-sequence lengths come from cu_seqlens_q/k.
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  int64_t total_q = 0;  // rows of q over the batch (batch*seqlen_q when fixed-length)
  int64_t total_k = 0;

  // Variable-length batches: int32[batch+1], on `device`; null when fixed-length.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  FA_HOST_DEVICE bool is_varlen() const { return cu_seqlens_q != nullptr; }
  // Fixed-length batches only: int32[batch] on the device, the keys sequence b
  // uses of its seqlen_k rows (FlashAttention-3's seqused_k); null: all of them.
  // A negative count marks a sequence whose indices the device found invalid:
  // its rows come out NaN. Only the CUDA KV-cache route into the Hopper forward
  // sets it (cuda/decode/api.cu); host code never reads it: the plan and every
  // host caller bound the keys by seqlen_k, the capacity.
  const int32_t* seqused_k = nullptr;

  // Forward tensors. Strides in elements. For varlen, batch strides are 0 and
  // rows are addressed by cu_seqlens offset * row stride.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  // Logsumexp, f32: (batch, heads_q, seqlen_q) or (heads_q, total_q) for varlen.
  // May be null in the forward pass.
  float* lse = nullptr;
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  // Backward tensors (dout shares q's dtype; dq/dk/dv have the shapes of q/k/v).
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // Options, normalized: causal already folded into window_right = 0 (keeping
  // `causal` for kernels that want it); -1 = unbounded.
  float scale = 1.0f;
  float softcap = 0.0f;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  bool deterministic = false;

  // Score extras (fa_extras), f32 on `device`, null when off.
  //   ALiBi slope of (sequence b, query head h) = alibi_slopes[b * alibi_batch_stride + h]
  //   (stride 0 for one slope per head); sink logit of head h = sinks[h];
  //   the backward overwrites dsinks[h] with dL/dsinks[h].
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  const float* sinks = nullptr;
  float* dsinks = nullptr;
  Dropout dropout;  // off unless fa_extras.dropout_p > 0 (attention/dropout.h)
  // fa_extras.block_mask, validated host lists (attention/block_mask.h); off by default.
  BlockMaskView block_mask;

  void* stream = nullptr;  // cudaStream_t
  int num_threads = 0;     // CPU backend
  // Persistent GPU kernels: at most this many CTAs (0: one per SM). Tests set
  // it so that small problems walk several rounds and a split tail.
  int max_ctas = 0;

  // Backward scratch, sized by the backend's workspace query.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  FA_HOST_DEVICE bool has_alibi() const { return alibi_slopes != nullptr; }
  FA_HOST_DEVICE bool has_sinks() const { return sinks != nullptr; }
  FA_HOST_DEVICE bool has_dropout() const { return dropout.enabled(); }
  FA_HOST_DEVICE bool has_block_mask() const { return block_mask.enabled(); }
  FA_HOST_DEVICE float alibi_slope(int b, int h) const {
    return alibi_slopes[b * alibi_batch_stride + h];
  }
  FA_HOST_DEVICE bool has_mask() const { return window_left >= 0 || window_right >= 0; }
  FA_HOST_DEVICE int group_size() const { return heads_q / heads_kv; }  // query heads per kv head
};

}  // namespace flashattn
