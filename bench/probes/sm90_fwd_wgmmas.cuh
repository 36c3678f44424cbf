// The d = 128 forward's wgmmas on fixed shared-memory operands, for the bench
// probes that time them (wgmma_rate.cu, sm90_softmax_beside_wgmma.cu):
//   S = Q K^T  8 x m64n128k16, A (Q) and B (K) from shared memory, K-major
//   O += P V   8 x m64n128k16, A (P) from registers, B (V) MN-major
// in the kernel's 128B-swizzled layout (two warpgroups' Q rows, one K/V tile).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/sm90/wgmma.h"

namespace fwd_wgmmas {

using T = __nv_bfloat16;
using flashattn::cuda::sm90::desc_advance;
using flashattn::cuda::sm90::make_smem_desc_sw128;

constexpr int kN = 128, kD = 128;                      // key tile, head dim
constexpr int kQBytes = 128 * kD * 2;                  // two warpgroups' 64 rows
constexpr int kKVBytes = kN * kD * 2;
constexpr int kSmem = kQBytes + 2 * kKVBytes + 1024;  // Q, K, V (+ alignment)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The 1024-byte aligned operand area of the dynamic shared memory, filled with
// small nonzero values (zeros could let the datapath idle and flatter the rate).
// Every thread of the block takes part; a __syncthreads() must follow.
__device__ __forceinline__ uint8_t* fill_operands(uint8_t* raw) {
  uint8_t* smem = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
  for (int i = threadIdx.x; i < (kQBytes + 2 * kKVBytes) / 2; i += blockDim.x)
    reinterpret_cast<T*>(smem)[i] = __float2bfloat16(((i * 37) % 17 - 8) * (1.0f / 64));
  return smem;
}

// One warpgroup's operands: its 64 Q rows, the K and V tiles, and P.
struct Operands {
  uint64_t q_desc, k_desc, v_desc;
  float s[kN / 2], o[kD / 2];
  uint32_t pa[kN / 16][4];

  __device__ __forceinline__ void init(const uint8_t* smem, int wg) {
    q_desc = make_smem_desc_sw128(smem_u32(smem) + wg * 64 * 128, 16, 1024);
    k_desc = make_smem_desc_sw128(smem_u32(smem + kQBytes), 16, 1024);
    v_desc = make_smem_desc_sw128(smem_u32(smem + kQBytes + kKVBytes), kN * 128, 1024);
    for (int i = 0; i < kN / 2; ++i) s[i] = 0.0f;
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
    for (int i = 0; i < kN / 16; ++i)
      for (int j = 0; j < 4; ++j) pa[i][j] = 0x3c003c00u + threadIdx.x + i + j;  // bf16 pairs near 2^-7
  }

  // Issues S (with_s) and/or O += P V (with_pv) as one committed group.
  __device__ __forceinline__ void issue(bool with_s, bool with_pv) {
    using flashattn::cuda::sm90::WgmmaRS;
    using flashattn::cuda::sm90::WgmmaSS;
    flashattn::cuda::sm90::wgmma_fence();
    if (with_s) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        WgmmaSS<kN, T>::run(s, desc_advance(q_desc, (kk / 4) * 128 * 128 + (kk % 4) * 32),
                            desc_advance(k_desc, (kk / 4) * kN * 128 + (kk % 4) * 32), kk > 0 ? 1 : 0);
    }
    if (with_pv) {
#pragma unroll
      for (int kt = 0; kt < kN / 16; ++kt) WgmmaRS<kD, T>::run(o, pa[kt], desc_advance(v_desc, kt * 16 * 128), 1);
    }
    flashattn::cuda::sm90::wgmma_commit();
  }

  // S and O += P V as one committed group, their wgmmas alternating (S's
  // k-step i, then P V's key step i): two independent accumulator chains
  // side by side in the issue order instead of one after the other.
  __device__ __forceinline__ void issue_interleaved() {
    using flashattn::cuda::sm90::WgmmaRS;
    using flashattn::cuda::sm90::WgmmaSS;
    flashattn::cuda::sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      WgmmaSS<kN, T>::run(s, desc_advance(q_desc, (kk / 4) * 128 * 128 + (kk % 4) * 32),
                          desc_advance(k_desc, (kk / 4) * kN * 128 + (kk % 4) * 32), kk > 0 ? 1 : 0);
      WgmmaRS<kD, T>::run(o, pa[kk], desc_advance(v_desc, kk * 16 * 128), 1);
    }
    flashattn::cuda::sm90::wgmma_commit();
  }

  // Sum of the accumulators, so the compiler keeps the wgmmas.
  __device__ __forceinline__ float sum() const {
    float acc = 0.0f;
    for (int i = 0; i < kN / 2; ++i) acc += s[i];
    for (int i = 0; i < kD / 2; ++i) acc += o[i];
    return acc;
  }
};

}  // namespace fwd_wgmmas
