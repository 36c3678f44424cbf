// The tensor pipe's rate on the forward kernel's own wgmma shapes, with no
// softmax, loads or barriers around them: what a d = 128 key tile would cost
// if the tensor cores never waited (docs/performance.md).
//
// One CTA per SM, `wgs` warpgroups each looping over batches of the kernel's
// wgmmas on fixed shared-memory operands (the d = 128 forward's layout):
//   s     S = Q K^T: 8 x m64n128k16, A (Q) and B (K) from shared memory
//   pv    O += P V:  8 x m64n128k16, A (P) from registers, B (V) MN-major
//   s+pv  both, as one ping-pong turn issues them
//   s/pv  both, alternating (S's k-step i, then P V's key step i)
// Each batch is committed and waited for before the next (as in the kernel,
// where the softmax needs S); with two warpgroups one's batch runs while the
// other waits. Prints cycles per wgmma per SM and the flop/clk/SM that gives
// (dense bf16 peak: 4096, computed from the H100's 989 TFLOP/s at 1830 MHz).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc bench/probes/wgmma_rate.cu -o wgmma_rate && ./wgmma_rate
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "sm90_fwd_wgmmas.cuh"

using namespace flashattn::cuda::sm90;
using namespace fwd_wgmmas;

constexpr int kIters = 4096;
constexpr int kMaxWarpgroups = 2;  // warpgroups of 128 threads per CTA at most

enum Mode { kS = 1, kPV = 2, kInterleaved = 4 };

__global__ void __launch_bounds__(128 * kMaxWarpgroups, 1) rate_kernel(int mode, int wgs, long long* cycles, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = fill_operands(raw);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg >= wgs) return;
  Operands op;
  op.init(smem, wg);
  asm volatile("bar.sync 1, %0;" ::"r"(128 * wgs));
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if (mode & kInterleaved)
      op.issue_interleaved();
    else
      op.issue(mode & kS, mode & kPV);
    wgmma_wait<0>();
    fence_operands(op.s);
    fence_operands(op.o);
  }
  const long long t1 = clock64();
  const float acc = op.sum();
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
  const char* names[] = {"", "s", "pv", "s+pv", "", "", "", "s/pv"};
  for (int mode : {1, 2, 3, 7}) {
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
      const int batch = ((mode & kS) && (mode & kPV) ? 16 : 8);
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
