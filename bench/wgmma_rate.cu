// The tensor pipe's rate on the forward kernel's own wgmma shapes, with no
// softmax, loads or barriers around them: what a d = 128 key tile would cost
// if the tensor cores never waited (docs/perf-notes.md, session 11).
//
// One CTA per SM, `wgs` warpgroups each looping over batches of the kernel's
// wgmmas on fixed shared-memory operands (the d = 128 forward's layout):
//   s     S = Q K^T: 8 x m64n128k16, A (Q) and B (K) from shared memory
//   pv    O += P V:  8 x m64n128k16, A (P) from registers, B (V) MN-major
//   s+pv  both, as one ping-pong turn issues them
// Each batch is committed and waited for before the next (as in the kernel,
// where the softmax needs S); with two warpgroups one's batch runs while the
// other waits. Prints cycles per wgmma per SM and the flop/clk/SM that gives
// (dense bf16 peak: 4096, computed from the H100's 989 TFLOP/s at 1830 MHz).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc bench/wgmma_rate.cu -o wgmma_rate && ./wgmma_rate
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90/wgmma.h"

using namespace flashattn::cuda::sm90;
using T = __nv_bfloat16;

constexpr int kN = 128, kD = 128;                      // key tile, head dim
constexpr int kQBytes = 128 * kD * 2;                  // two warpgroups' 64 rows
constexpr int kKVBytes = kN * kD * 2;
constexpr int kSmem = kQBytes + 2 * kKVBytes + 1024;  // Q, K, V (+ alignment)
constexpr int kIters = 4096;
constexpr int kMaxWarpgroups = 2;  // warpgroups of 128 threads per CTA at most

enum Mode { kS = 1, kPV = 2 };

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__global__ void __launch_bounds__(128 * kMaxWarpgroups, 1) rate_kernel(int mode, int wgs, long long* cycles, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
  // Small nonzero operands (zeros could let the datapath idle and flatter the rate).
  for (int i = threadIdx.x; i < (kQBytes + 2 * kKVBytes) / 2; i += blockDim.x)
    reinterpret_cast<T*>(smem)[i] = __float2bfloat16(((i * 37) % 17 - 8) * (1.0f / 64));
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg >= wgs) return;
  const uint64_t q_desc = make_smem_desc_sw128(smem_u32(smem) + wg * 64 * 128, 16, 1024);
  const uint64_t k_desc = make_smem_desc_sw128(smem_u32(smem + kQBytes), 16, 1024);
  const uint64_t v_desc = make_smem_desc_sw128(smem_u32(smem + kQBytes + kKVBytes), kN * 128, 1024);
  float s[kN / 2], o[kD / 2];
  uint32_t pa[kN / 16][4];
  for (int i = 0; i < kN / 2; ++i) s[i] = 0.0f;
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  for (int i = 0; i < kN / 16; ++i)
    for (int j = 0; j < 4; ++j) pa[i][j] = 0x3c003c00u + threadIdx.x + i + j;  // bf16 pairs near 2^-7
  asm volatile("bar.sync 1, %0;" ::"r"(128 * wgs));
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    wgmma_fence();
    if (mode & kS) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        WgmmaSS<kN, T>::run(s, desc_advance(q_desc, (kk / 4) * 128 * 128 + (kk % 4) * 32),
                            desc_advance(k_desc, (kk / 4) * kN * 128 + (kk % 4) * 32), kk > 0 ? 1 : 0);
    }
    if (mode & kPV) {
#pragma unroll
      for (int kt = 0; kt < kN / 16; ++kt) WgmmaRS<kD, T>::run(o, pa[kt], desc_advance(v_desc, kt * 16 * 128), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);
    fence_operands(o);
  }
  const long long t1 = clock64();
  float acc = 0.0f;
  for (int i = 0; i < kN / 2; ++i) acc += s[i];
  for (int i = 0; i < kD / 2; ++i) acc += o[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * kMaxWarpgroups + wg] = t1 - t0;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sms * kMaxWarpgroups * sizeof(long long));
  cudaMalloc(&d_sink, sms * 128 * kMaxWarpgroups * sizeof(float));
  std::printf("| mode | warpgroups | wgmmas per batch | cycles per wgmma per SM (median) | flop/clk/SM | of 4096 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const char* names[] = {"", "s", "pv", "s+pv"};
  for (int mode = kS; mode <= (kS | kPV); ++mode) {
    for (int wgs = 1; wgs <= kMaxWarpgroups; ++wgs) {
      for (int rep = 0; rep < 2; ++rep)  // the first launch warms up
        rate_kernel<<<sms, 128 * kMaxWarpgroups, kSmem>>>(mode, wgs, d_cycles, d_sink);
      if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
      std::vector<long long> c(sms * kMaxWarpgroups);
      cudaMemcpy(c.data(), d_cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost);
      std::vector<double> per;
      const int batch = (mode == (kS | kPV) ? 16 : 8);
      for (int b = 0; b < sms; ++b) {
        long long longest = 0;
        for (int w = 0; w < wgs; ++w) longest = std::max(longest, c[b * kMaxWarpgroups + w]);
        per.push_back(static_cast<double>(longest) / (static_cast<double>(kIters) * batch * wgs));
      }
      std::sort(per.begin(), per.end());
      const double med = per[per.size() / 2];
      const double flop = 2.0 * 64 * 128 * 16;  // one m64n128k16
      std::printf("| %s | %d | %d | %.1f | %.0f | %.2f |\n", names[mode], wgs, batch, med, flop / med,
                  flop / med / 4096);
    }
  }
  return 0;
}
