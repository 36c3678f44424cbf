// Does a warpgroup's softmax slow down while the other warpgroup's wgmmas run?
// (bench/results/2026-11-24-h100-session15.md, 7: in the d128 forward the
// softmax that runs beside the other warpgroup's S and P V takes 1.9k cycles
// per key tile, the one that runs while the tensor cores finish 1.3k.)
//
// One CTA per SM, two warpgroups. The softmax warpgroup repeats the forward's
// own online_softmax on a 64 x 128 S fragment and converts P to bf16 pairs;
// the tensor warpgroup repeats batches of the d128 forward's wgmmas (8 x
// m64n128k16 S = Q K^T from shared memory and/or 8 x m64n128k16 O += P V with
// P from registers), each batch committed and waited for (or, "queue kept
// full", the next batch issued while the last one runs). Each side is timed
// alone and beside the other (the other side runs until the timed side is
// done). Prints cycles per softmax and per wgmma (median over SMs).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/sm90_softmax_beside_wgmma.cu -o sbw && ./sbw
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90/fwd/kernel.cuh"
#include "sm90_fwd_wgmmas.cuh"

using namespace flashattn::cuda::sm90;
using namespace fwd_wgmmas;

constexpr int kSoftIters = 2048, kBatches = 1024;

enum Tensor { kNone = 0, kS = 1, kPV = 2, kQueueFull = 4 };
enum Timed { kTimeSoftmax = 0, kTimeTensor = 1 };

__global__ void __launch_bounds__(256, 1)
    probe_kernel(int tensor_mode, int softmax_on, int timed, long long* cycles, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = fill_operands(raw);
  __shared__ volatile int done;
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  const int wg = warpgroup_index();
  float acc = 0.0f;
  long long t = 0;
  if (wg == 0) {
    // The softmax warpgroup.
    const bool run = softmax_on != 0;
    float s[kN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
    uint32_t pa[kN / 16][4];
    for (int i = 0; i < kN / 2; ++i) s[i] = ((threadIdx.x * 7 + i * 13) % 29) * 0.25f;
    const long long t0 = clock64();
    for (int it = 0; run && (timed == kTimeSoftmax ? it < kSoftIters : done == 0); ++it) {
      fence_operands(s);  // a new S each time, as the wgmma would write it
      online_softmax(s, m, l, corr, 0.125f);
#pragma unroll
      for (int kt = 0; kt < kN / 16; ++kt)
        for (int j = 0; j < 4; ++j) pa[kt][j] = pack2<T>(s[8 * kt + 2 * j], s[8 * kt + 2 * j + 1]);
      fence_operands(pa);
      m[0] = m[1] = -INFINITY;
    }
    t = clock64() - t0;
    if (timed == kTimeSoftmax && threadIdx.x == 0) done = 1;
    acc = l[0] + l[1] + __uint_as_float(pa[0][0]);
  } else {
    // The tensor warpgroup.
    Operands op;
    op.init(smem, 0);
    // Whether to go on, the same for all four warps (wgmma is warpgroup-wide).
    __shared__ int go;
    auto keep_going = [&](int b) {
      if (threadIdx.x == 128) go = tensor_mode != kNone && (timed == kTimeTensor ? b < kBatches : done == 0);
      asm volatile("bar.sync 1, 128;" ::: "memory");
      const bool g = go != 0;
      asm volatile("bar.sync 1, 128;" ::: "memory");
      return g;
    };
    const long long t0 = clock64();
    for (int b = 0; keep_going(b); ++b) {
      op.issue(tensor_mode & kS, tensor_mode & kPV);
      if (tensor_mode & kQueueFull) {
        wgmma_wait<1>();  // the next batch issued while this one runs: issue stalls on a full queue
      } else {
        wgmma_wait<0>();
        fence_operands(op.s);
        fence_operands(op.o);
      }
    }
    wgmma_wait<0>();
    t = clock64() - t0;
    if (timed == kTimeTensor && threadIdx.x == 128) done = 1;
    acc = op.sum();
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sms * 2 * sizeof(long long));
  cudaMalloc(&d_sink, sms * 256 * sizeof(float));
  auto median_of = [&](int wg, double per) {
    std::vector<long long> c(sms * 2);
    cudaMemcpy(c.data(), d_cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    std::vector<double> v;
    for (int b = 0; b < sms; ++b) v.push_back(c[b * 2 + wg] / per);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const char* tnames[] = {"none", "S (SS)", "P V (RS)", "S + P V", "", "", "", "S + P V, queue kept full"};
  std::printf("| timed | beside | cycles |\n|---|---|---|\n");
  for (int mode : {0, 1, 2, 3, 7}) {  // none, S, P V, S + P V, S + P V queue kept full
    for (int rep = 0; rep < 2; ++rep) probe_kernel<<<sms, 256, kSmem>>>(mode, 1, kTimeSoftmax, d_cycles, d_sink);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    std::printf("| softmax (per 64x128 tile) | %s | %.0f |\n", tnames[mode], median_of(0, kSoftIters));
  }
  for (int mode : {1, 2, 3, 7}) {
    const int per_batch = (mode & kS) && (mode & kPV) ? 16 : 8;
    for (int soft = 0; soft <= 1; ++soft) {
      for (int rep = 0; rep < 2; ++rep) probe_kernel<<<sms, 256, kSmem>>>(mode, soft, kTimeTensor, d_cycles, d_sink);
      if (cudaDeviceSynchronize() != cudaSuccess) return 1;
      std::printf("| wgmma %s (per wgmma) | %s | %.1f |\n", tnames[mode], soft ? "softmax" : "none",
                  median_of(1, static_cast<double>(kBatches) * per_batch));
    }
  }
  return 0;
}
