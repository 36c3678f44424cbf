// Does the P conversion (F2FP.BF16.F32.PACK_AB, cvt.rn.bf16x2.f32) share the
// MUFU pipe with the softmax's exponentials (MUFU.EX2)? Cycles per warp
// instruction per SM sub-partition for independent F2FPs, for independent
// EX2s, and for the two interleaved: a shared pipe takes about the sum, separate
// pipes about the larger (on the H100: separate pipes; ex2.approx.f16x2 is
// two MUFU ops on sm_90a).
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/probes/sm90_pipe_rates.cu -o pipe_rates && ./pipe_rates
#include <cuda_runtime.h>

#include <cstdio>

constexpr int kIters = 4096, kChains = 8;
enum Mode { kF2fp = 1, kEx2 = 2, kBoth = 3 };

template <int kMode>
__global__ void rate_kernel(const float* in, unsigned* out, long long* cycles) {
  float x[kChains];
  unsigned acc[kChains];
  for (int c = 0; c < kChains; ++c) {
    x[c] = in[threadIdx.x % 32 + c];
    acc[c] = 0;
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if (kMode & kF2fp) {
        unsigned packed;
        asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(x[c]), "f"(x[c] + 1.0f));
        acc[c] ^= packed;
      }
      if (kMode & kEx2) {
        float y;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[c]));
        x[c] = y * 0.5f;
      }
    }
  }
  const long long t1 = clock64();
  unsigned sink = 0;
  for (int c = 0; c < kChains; ++c) sink ^= acc[c] ^ __float_as_uint(x[c]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = sink;
  if (threadIdx.x == 0 && blockIdx.x == 0) *cycles = t1 - t0;
}

template <int kMode>
void report(const char* name, int warps_per_smsp, const float* in, unsigned* out, long long* cycles) {
  for (int rep = 0; rep < 2; ++rep)  // the first launch warms up
    rate_kernel<kMode><<<132, 128 * warps_per_smsp>>>(in, out, cycles);
  long long c = 0;
  cudaMemcpy(&c, cycles, sizeof(c), cudaMemcpyDeviceToHost);
  std::printf("%-5s %d warp(s) per SMSP: %.2f cycles per warp instruction (pair for 'both')\n", name,
              warps_per_smsp, static_cast<double>(c) / (static_cast<double>(kIters) * kChains * warps_per_smsp));
}

int main() {
  float* in = nullptr;
  unsigned* out = nullptr;
  long long* cycles = nullptr;
  cudaMalloc(&in, 64 * sizeof(float));
  cudaMemset(in, 0, 64 * sizeof(float));
  cudaMalloc(&out, 132 * 512 * sizeof(unsigned));
  cudaMalloc(&cycles, sizeof(long long));
  for (int w : {1, 2, 4}) {
    report<kF2fp>("f2fp", w, in, out, cycles);
    report<kEx2>("ex2", w, in, out, cycles);
    report<kBoth>("both", w, in, out, cycles);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
