// Named barriers (bar.sync / bar.arrive with an id and a thread count): PTX
// since sm_20, shared by the sm80 and sm90 kernels.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// Ids 1..15 (0 is __syncthreads). `threads` is a multiple of 32.
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.sync that also answers whether `pred` held in any of the threads.
__device__ __forceinline__ bool named_sync_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace flashattn::cuda
