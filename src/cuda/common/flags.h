// Acquire/release flags in global memory, GPU scope: the deterministic
// backward passes the turn to add into a dQ tile from one CTA to the next.
#pragma once

namespace flashattn::cuda {

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace flashattn::cuda
