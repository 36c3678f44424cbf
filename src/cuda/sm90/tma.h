// TMA (cp.async.bulk.tensor): host-side tensor maps and the device-side load.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only; libcuda is not linked
#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// A rank-4 tiled map over a 16-bit (or, for the backward's f32 dQ accumulator,
// FA_F32) tensor: dims innermost first, strides in
// bytes for dims 1..3 (dim 0 is contiguous), box innermost first. Swizzle is
// 128B (the box's inner extent must be 128 bytes): the layout wgmma's SW128
// descriptors read. Elements outside the tensor are zero-filled. Fails with
// FA_ERROR_UNSUPPORTED when the driver entry point is missing or the map is
// rejected (the caller then falls back).
fa_status make_tma_map_4d(CUtensorMap* map, const void* base, fa_dtype dtype,
                          const uint64_t dims[4], const uint64_t strides_bytes[3],
                          const uint32_t box[4]);

// A map over one of the attention tensors q, k, v, out, dout (16-bit, row
// stride in elements): (cols, rows, heads, batch) with boxes of 64 columns x
// box_rows rows, 128B-swizzled. cols may be less than the kernel's head dim:
// TMA zero-fills the box columns past it. Variable-length batches pack every
// sequence's rows into one: rows = all tokens, batch 1.
struct AttentionTensor {
  const void* base;
  int64_t rows;
  int heads;
  int64_t row_stride, head_stride, batch_stride;  // elements
};
fa_status make_attention_map(CUtensorMap* map, const AttentionParams& p, const AttentionTensor& t,
                             int cols, uint32_t box_rows);

// The call's own tensors by name: rows are the query tokens (q, out, dout) or
// the key tokens (k, v), fixed-length or packed varlen.
enum class CallTensor { kQ, kK, kV, kOut, kDout };
AttentionTensor call_tensor(const AttentionParams& p, CallTensor which);
inline fa_status make_call_map(CUtensorMap* map, const AttentionParams& p, CallTensor which, int cols,
                               uint32_t box_rows) {
  return make_attention_map(map, p, call_tensor(p, which), cols, box_rows);
}

#if defined(__CUDACC__)
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads one box at coordinates (c0..c3, elements) into shared memory; the bytes
// complete on `bar` (whose expected transaction count the caller has raised).
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(reinterpret_cast<uint64_t>(map)),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

// Adds the box at `smem_src` into global memory at coordinates (c0..c3),
// element-wise (f32 add, as one bulk operation; out-of-bounds elements are
// skipped). Completes in the issuing thread's bulk group: bulk_commit(), then
// bulk_wait_read<0>() before the shared memory is rewritten.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* smem_src,
                                                  int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_src))), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most kPending bulk groups of this thread still read shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most kPending bulk groups of this thread are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Non-tensor bulk copy of `bytes` (a multiple of 16, both addresses 16-byte
// aligned) from global to shared memory, completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}
#endif

}  // namespace flashattn::cuda::sm90
