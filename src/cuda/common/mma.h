// Thin wrappers over the sm_80 tensor-core and async-copy instructions
// (mma.sync, ldmatrix, cp.async, ex2), so kernels read like the math.
//
// Fragment layouts of mma.sync.m16n8k16 (row.col), per lane: g = lane / 4,
// t = lane % 4.
//   A (16x16, row-major), 4 regs of 2 elements:
//     a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]   a2 = A[g][2t+8..]   a3 = A[g+8][2t+8..]
//   B (16x8, k x n), 2 regs: b0 = B[2t..2t+1][g]   b1 = B[2t+8..2t+9][g]
//   C/D (16x8, f32), 4 floats: c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
// A C fragment pair (n-tiles 2k, 2k+1), converted to 16 bits, is the A
// fragment of k-step k: that is how P = softmax(S) feeds O += P V without
// leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/math.h"

namespace flashattn::cuda {

// ---------------------------------------------------------------- dtypes

template <typename T>
struct MmaType;

template <>
struct MmaType<__half> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct MmaType<__nv_bfloat16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// D = A * B + D, f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------- shared memory

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// register i receives matrix i (lane holds row lane/4, columns 2*(lane%4)..+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// One 32-bit store to shared memory (an address from smem_addr).
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Same as ldmatrix_x4, each matrix transposed (lane holds column lane/4, rows 2*(lane%4)..+1).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Transposes the 8x8 16-bit matrix M held as a fragment (lane: row lane/4,
// columns 2*(lane%4)..+1): returns this lane's fragment of M^T. It turns the C
// fragment of a key-major product (keys x rows) into the B fragment of the
// next product over keys.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t m) {
  uint32_t t;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(t) : "r"(m));
  return t;
}

// ---------------------------------------------------------------- cp.async

// 16 bytes global -> shared, bypassing L1. When !valid nothing is read and the
// 16 bytes are zero-filled (src-size 0), so out-of-range rows/columns become 0.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// The same, always in bounds: no byte count to compute.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `Pending` of this thread's committed groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// ---------------------------------------------------------------- math

// 2^x on the SFU: fast_exp2 in attention/math.h (host and device).

// 1/x on the SFU (rcp.approx: ~1 ulp; 1/+-inf = +-0, 1/+-0 = +-inf).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reduction over the 4 lanes of a quad (the lanes sharing an accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashattn::cuda
