// wgmma (warpgroup matrix multiply-accumulate, sm_90a): shared-memory matrix
// descriptors for the 128B-swizzled layout TMA writes, the async fences, and
// the generated m64nNk16 wrappers (wgmma_ops.inc, from gen_wgmma.py).
//
// Accumulator layout (f32, per warpgroup, m64nN): warp w holds rows 16w..16w+15;
// register d[4i+e] of lane l is row 16w + l/4 + 8*(e>>1), column 8i + 2*(l%4) + (e&1).
// An A operand from registers (m64k16) has mma.sync's m16k16 A layout per warp,
// so two accumulator n8 tiles convert to one A fragment without shuffles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

// Descriptor of a 128B-swizzled operand tile whose atoms are 8 rows x 128 bytes
// (1024-byte aligned). Fields: start address, leading- and stride-byte offsets
// (all >> 4), layout type 1 = SWIZZLE_128B in bits 62-63.
//  K-major (rows = M or N, 64 K-elements per 128-byte row): SBO = 1024 (next
//  8-row group); LBO unused. Advance along K inside the 128-byte row by adding
//  bytes to the start address (the swizzle is applied to absolute address bits).
//  MN-major (rows = K, 64 MN-elements per row): LBO = stride between 64-wide MN
//  blocks, SBO = 1024 (next 8 K-rows).
__host__ __device__ constexpr uint64_t make_smem_desc_sw128(uint32_t smem_byte_addr,
                                                            uint32_t lbo_bytes,
                                                            uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// `desc` moved `bytes` (a multiple of 16) further into shared memory: only the
// start-address field changes, and it cannot carry out of its 14 bits while the
// operand stays in shared memory (< 256 KB). One 32-bit add, where building the
// descriptor from the moved address takes an add, two masks and a shift
// (ptxas cannot fold `& 0x3FFFF` across the add).
__host__ __device__ constexpr uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

template <int N, typename T>
struct WgmmaSS;  // D(64xN) (+)= A(64x16, smem, K-major) * B(16xN, smem, K-major)
template <int N, typename T>
struct WgmmaRS;  // D(64xN) (+)= A(64x16, registers) * B(16xN, smem, MN-major)
template <int N, typename T>
struct WgmmaSSTT;  // D(64xN) (+)= A(64x16, smem, MN-major) * B(16xN, smem, MN-major)
template <int N, typename T>
struct WgmmaSST;  // D(64xN) (+)= A(64x16, smem, K-major) * B(16xN, smem, MN-major)

#if defined(__CUDACC__)
#include "cuda/sm90/wgmma_ops.inc"

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads/writes of accumulator registers across
// an async wgmma's issue or wait.
template <int K>
__device__ __forceinline__ void fence_operands(float (&r)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int K, int J>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[K][J]) {
#pragma unroll
  for (int i = 0; i < K; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Two floats to a packed 16-bit pair (low half = first).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
#endif

}  // namespace flashattn::cuda::sm90
