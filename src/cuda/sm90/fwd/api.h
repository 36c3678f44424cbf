// The Hopper (sm_90a) forward: wgmma + TMA + warp specialization. The sm80
// forward calls can_run_forward() first and falls back to its own kernels when
// it says no (other GPUs, head dims it has no kernel for, tensors TMA cannot
// describe) or when run_forward returns FA_ERROR_UNSUPPORTED.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// True when the device of p is compute capability 9.0 and p is a shape/dtype
// this kernel handles (f16/bf16, head_dim a multiple of 8 up to 256, non-empty).
bool supports_forward(const AttentionParams& p);

// True when the environment variable FLASHATTN_DISABLE_SM90 is set to a
// non-zero value: every call then runs the sm80 kernels (tests, benchmarks).
bool disabled_by_env();

// supports_forward(p), unless disabled_by_env().
bool can_run_forward(const AttentionParams& p);

// A paged K/V cache the forward reads through a block table (the KV-cache
// route, cuda/decode/api.cu): key j of sequence b is row j % page_size of page
// block_table[b * table_stride + j / page_size] of the pool (num_pages,
// page_size, heads_kv, d) at p.k / p.v (their batch strides: one page). Used
// with p.seqused_k, which bounds the entries read to the sequence's pages.
struct KvPages {
  const int32_t* block_table = nullptr;  // null: the dense (batch, seqlen_k, heads_kv, d) layout
  int64_t table_stride = 0;
  int page_size = 0;
  int page_shift = 0;  // log2(page_size)
  int num_pages = 0;
};

// Whether the forward reads a paged cache of page_size keys at head_dim: a
// power of two (the producer shifts: producer.cuh's load_pages) of whole
// 128-byte swizzle atoms (8 rows or more) that divides the key tile (several
// pages a tile) or is a multiple of it (a tile in one page): then every TMA
// box of a tile lies in one page.
bool pages_fit(int head_dim, int page_size);

// Launches on p.stream. FA_ERROR_UNSUPPORTED means "use the fallback".
fa_status run_forward(const AttentionParams& p, const KvPages& pages = {});

// Bytes run_forward(p) allocates from the stream-ordered pool (the split
// tail's partial states; 0 for most calls).
size_t forward_workspace_size(const AttentionParams& p);

}  // namespace flashattn::cuda::sm90
