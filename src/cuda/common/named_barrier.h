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

}  // namespace flashattn::cuda
