// Where a sequence's rows live, for fixed-length and variable-length batches.
#pragma once

#include <cstdint>

#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/params.h"

namespace flashattn {

// One sequence of the batch: its lengths and the global row of its first
// query / key (rows in the flattened (total, heads, dim) view).
struct SequenceInfo {
  int seqlen_q;
  int seqlen_k;
  int64_t row_q;  // first query row, counting over the batch
  int64_t row_k;
};

FA_HOST_DEVICE SequenceInfo sequence_info(const AttentionParams& p, int b) {
  if (p.cu_seqlens_q != nullptr) {
    const int32_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    return {p.cu_seqlens_q[b + 1] - q0, p.cu_seqlens_k[b + 1] - k0, q0, k0};
  }
  return {p.seqlen_q, p.seqlen_k, static_cast<int64_t>(b) * p.seqlen_q,
          static_cast<int64_t>(b) * p.seqlen_k};
}

FA_HOST_DEVICE MaskPolicy mask_for(const AttentionParams& p, const SequenceInfo& s) {
  return MaskPolicy{s.seqlen_q, s.seqlen_k, p.window_left, p.window_right};
}

// The ALiBi term of (sequence b, query head h); slope 0 when ALiBi is off.
FA_HOST_DEVICE AlibiScore alibi_for(const AttentionParams& p, const SequenceInfo& s, int b, int h) {
  return AlibiScore{p.has_alibi() ? p.alibi_slope(b, h) : 0.0f, s.seqlen_k - s.seqlen_q};
}

// Element offset of (sequence b, row r of it, head h) given a tensor's strides.
FA_HOST_DEVICE int64_t row_offset(int b, int64_t seq_first_row, int r, int h,
                                  int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                                  bool varlen) {
  return varlen ? (seq_first_row + r) * row_stride + h * head_stride
                : b * batch_stride + static_cast<int64_t>(r) * row_stride + h * head_stride;
}

// Offset of the logsumexp entry for (sequence b, row r, head h).
FA_HOST_DEVICE int64_t lse_offset(const AttentionParams& p, int b, int64_t seq_first_row, int r,
                                  int h) {
  return p.is_varlen() ? h * p.lse_head_stride + (seq_first_row + r) * p.lse_row_stride
                       : b * p.lse_batch_stride + h * p.lse_head_stride + r * p.lse_row_stride;
}

}  // namespace flashattn
