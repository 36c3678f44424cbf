// A block-sparse mask (fa_block_mask, FlexAttention's BlockMask layout) as
// validated int32 lists: per (sequence b, query head h, query block qb) the
// key blocks the query block visits, "partial" and "full". Row i sees key j
// when the element mask (MaskPolicy) lets it and block (i / block_q,
// j / block_k) is in either list (docs/variants.md): without a mask_mod the
// two kinds mean the same, so every consumer merges them.
//
// The lists are the caller's memory, read through their strides; validation
// (core/block_mask.cpp) has checked every count and every index a consumer
// can read, so the accessors do no checks of their own.
#pragma once

#include <cstdint>

#include "attention/host_device.h"

namespace flashattn {

// One pair (num_blocks, indices) of FlexAttention's BlockMask: counts of shape
// (B, H, q_blocks) and indices of shape (B, H, q_blocks, capacity), strides in
// elements (0 in a broadcast dimension of size 1).
struct BlockList {
  const int32_t* counts = nullptr;  // null: the list is absent (no entries)
  const int32_t* indices = nullptr;
  int64_t count_strides[3] = {0, 0, 0};
  int64_t index_strides[4] = {0, 0, 0, 0};

  FA_HOST_DEVICE int count(int b, int h, int qb) const {
    if (counts == nullptr) return 0;
    return counts[b * count_strides[0] + h * count_strides[1] + qb * count_strides[2]];
  }
  FA_HOST_DEVICE int index(int b, int h, int qb, int n) const {
    return indices[b * index_strides[0] + h * index_strides[1] + qb * index_strides[2] +
                   n * index_strides[3]];
  }
};

struct BlockMaskView {
  int block_q = 0;  // 0: no block mask
  int block_k = 0;
  int q_blocks = 0;  // ceil(seqlen_q / block_q), seqlen_q the (maximum) query length
  int k_blocks = 0;
  int batch = 1;  // of the lists: 1 (shared by every sequence) or the call's batch
  int heads = 1;  // 1 (shared by every query head) or heads_q
  BlockList partial;
  BlockList full;

  FA_HOST_DEVICE bool enabled() const { return block_q > 0; }
  // The lists' coordinates of (sequence b, query head h): broadcast dimensions read row 0.
  FA_HOST_DEVICE int list_batch(int b) const { return batch == 1 ? 0 : b; }
  FA_HOST_DEVICE int list_head(int h) const { return heads == 1 ? 0 : h; }
};

}  // namespace flashattn
