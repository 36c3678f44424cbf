// stmatrix (registers -> shared, in the
// accumulator layout) and TMA stores (cp.async.bulk.tensor, shared -> global).
// (The forward's epilogue is their only user today.)
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

#if defined(__CUDACC__)
// Four 8x8 matrices of 16-bit values to shared memory: register i of lane l
// holds row l / 4, columns 2 * (l % 4) and +1 of matrix i (an mma / wgmma
// accumulator's layout, packed), and lane l gives the address of row l % 8 of
// matrix l / 8 (16 contiguous bytes). One instruction for what takes four
// 4-byte stores per lane.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
// Stores the box at coordinates (c0..c3, elements) of `map` from shared memory
// (laid out as the map's swizzle says). Elements outside the tensor are not
// written. Asynchronous: completes as part of this thread's bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int c0,
                                             int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_src))), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
// Closes this thread's bulk group of the stores issued since the last commit.
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until every committed store of this thread has read its shared memory
// (the buffer may be overwritten; the global writes may still be in flight).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until every committed store of this thread has completed.
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
#endif

}  // namespace flashattn::cuda::sm90
