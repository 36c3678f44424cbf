// Acquire/release flags in global memory, GPU scope: the deterministic
// backward passes the turn to add into a dQ tile from one CTA to the next.
#pragma once

#include "attention/mask.h"

namespace flashattn::cuda {

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// The turn order of a dQ query tile's semaphore (zeroed before the backward):
// key tiles add from the highest down, and key tile n publishes n + 1.
// Called by one thread: returns once key tile n has published its adds; the
// caller then passes the acquire on (barrier, proxy fence).
__device__ __forceinline__ void wait_dq_published(const int* sem, int n) {
  while (ld_acquire_gpu(sem) != n + 1) {
  }
}
// Called by one thread: returns once key tile n_tile + 1 has published its
// adds into query tile m, or at once if that key tile does not see m (or does
// not exist).
__device__ __forceinline__ void wait_dq_turn(const int* sem, const MaskPolicy& mask, int m, int n_tile,
                                             int block_m, int block_n, int seqlen_k) {
  const int n_next = n_tile + 1;
  if (n_next * block_n < seqlen_k && mask.query_begin(n_next * block_n) / block_m <= m) wait_dq_published(sem, n_next);
}
// Called by one thread once every thread's adds into the tile precede it:
// by a CTA barrier (the release store is cumulative) or, for adds through
// the async proxy (TMA), by waiting for their completion and a proxy fence.
__device__ __forceinline__ void publish_dq_turn(int* sem, int n_tile) { st_release_gpu(sem, n_tile + 1); }

}  // namespace flashattn::cuda
