// mbarriers (transaction-counted, for TMA completion and producer/consumer
// rings) and named barriers (a subset of the block's warps). Device-only.
#pragma once

#include <cstdint>

#include "cuda/common/named_barrier.h"

namespace flashattn::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// threadIdx.x / 128, as a value ptxas knows to be warp-uniform (a shuffle from
// lane 0): what is derived from it (per-warpgroup shared-memory bases, wgmma
// descriptors) then lives in uniform registers instead of being moved there
// (R2UR) before every wgmma.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
}

// NOTES: one thread initializes; fence.mbarrier_init makes the init visible to
// the async proxy (TMA) before anyone uses the barrier; a block barrier must
// follow before other threads touch it.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives (count 1) and adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in
// phase 0, so waiting on parity 1 returns at once: producers start with
// parity 1 on their "empty" barriers and need no priming arrivals.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Named barriers: cuda/common/named_barrier.h, part of this layer too.
using cuda::named_arrive;
using cuda::named_sync;

// Ordinary shared-memory stores that the async proxy (wgmma, TMA) reads next.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Register reallocation between warpgroups (needs a register cap at entry:
// __launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Programmatic dependent launch: a kernel launched after this one with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every CTA
// of this one has called grid_launch_dependents (or exited); it calls
// grid_dependency_wait before it reads what this one wrote (it returns once
// this grid has completed and its memory is visible; at once without a
// programmatic launch).
__device__ __forceinline__ void grid_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

}  // namespace flashattn::cuda::sm90
