// Does a warpgroup's softmax slow down while the other warpgroup's wgmmas run?
// (The d128 forward's trace motivated it: the
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
// Also: the softmax with its own
// P V batch in flight (P from registers or shared memory), beside two tensor
// warpgroups, with some exponentials as cubics, and its own span (clock reads
// around the softmax alone, without the loop's wait and P conversion).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/probes/sm90_softmax_beside_wgmma.cu -o sbw && ./sbw
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

// 2^x as a cubic on the FMA and integer pipes instead of one MUFU.EX2
// (x <= 0; relative error 8e-5, enough for P in bf16): 2^x = 2^j * 2^f with
// j = round(x), f in [-0.5, 0.5]; j is added straight into the exponent bits.
__device__ __forceinline__ float poly_exp2(float x) {
  x = fmaxf(x, -127.0f);
  const float t = x + 12582912.0f;  // 1.5 * 2^23: j in the low mantissa bits
  const float f = x - (t - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.05508877f, f, 0.24260466f), f, 0.6932763f), f, 0.9999289f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// The forward's exponentials with every kPolyEvery-th element of each row as
// poly_exp2 (0: none), to see whether moving work off the MUFU shortens the
// softmax alone and beside wgmmas. Element i of s is column 2 (i / 4) + i % 2
// of this thread's part of row (i / 2) % 2.
template <int kPolyEvery>
struct MixedExp2 {
  __device__ __forceinline__ float operator()(float x, int i) const {
    if constexpr (kPolyEvery != 0) {
      const int col = 2 * (i / 4) + i % 2;
      if (col % kPolyEvery == 0) return poly_exp2(x);
    }
    return flashattn::cuda::fast_exp2(x);
  }
};

enum Tensor { kNone = 0, kS = 1, kPV = 2, kQueueFull = 4 };
enum Timed { kTimeSoftmax = 0, kTimeTensor = 1 };

// kTensorWgs warpgroups issue wgmmas (2: the tensor pipe saturated, as in the
// forward's ping-pong); kOwnPV has the softmax warpgroup issue its own
// O += P V batch before each softmax and wait for it after (the forward's
// intra-warpgroup overlap), with P from registers (kOwnPvRS, as the forward)
// or from shared memory (kOwnPvSS).
enum OwnPV { kNoOwnPv = 0, kOwnPvRS = 1, kOwnPvSS = 2 };
template <int kTensorWgs, int kOwnPV, int kPolyEvery = 0>
__global__ void __launch_bounds__(128 * (1 + kTensorWgs), 1)
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
    float o[kOwnPV != kNoOwnPv ? kD / 2 : 1];
    for (float& x : o) x = 0.0f;
    for (int kt = 0; kt < kN / 16; ++kt)
      for (int j = 0; j < 4; ++j) pa[kt][j] = 0x3c003c00u + threadIdx.x + kt + j;
    const uint64_t v_desc = make_smem_desc_sw128(smem_u32(smem + kQBytes + kKVBytes), kN * 128, 1024);
    const uint64_t p_desc = make_smem_desc_sw128(smem_u32(smem), 16, 1024);  // P in place of Q's rows
    long long t_softmax = 0;  // the softmax alone, without the wait for its own P V
    const long long t0 = clock64();
    for (int it = 0; run && (timed == kTimeSoftmax ? it < kSoftIters : done == 0); ++it) {
      fence_operands(s);  // a new S each time, as the wgmma would write it
      if constexpr (kOwnPV != kNoOwnPv) {
        flashattn::cuda::sm90::wgmma_fence();
#pragma unroll
        for (int kt = 0; kt < kN / 16; ++kt) {
          if constexpr (kOwnPV == kOwnPvRS)
            flashattn::cuda::sm90::WgmmaRS<kD, T>::run(o, pa[kt], desc_advance(v_desc, kt * 16 * 128), 1);
          else
            flashattn::cuda::sm90::WgmmaSST<kD, T>::run(
                o, desc_advance(p_desc, (kt / 4) * 128 * 128 + (kt % 4) * 32), desc_advance(v_desc, kt * 16 * 128), 1);
        }
        flashattn::cuda::sm90::wgmma_commit();
      }
      const long long ts = clock64();
      online_softmax(s, m, l, corr, 0.125f, MixedExp2<kPolyEvery>{});
      fence_operands(s);
      t_softmax += clock64() - ts;
      if constexpr (kOwnPV != kNoOwnPv) {
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(pa);
      }
#pragma unroll
      for (int kt = 0; kt < kN / 16; ++kt)
        for (int j = 0; j < 4; ++j) pa[kt][j] = pack2<T>(s[8 * kt + 2 * j], s[8 * kt + 2 * j + 1]);
      fence_operands(pa);
      m[0] = m[1] = -INFINITY;
    }
    t = clock64() - t0;
    if (timed == kTimeSoftmax && threadIdx.x == 0) done = 1;
    if (threadIdx.x == 0) cycles[blockIdx.x * 3 + 2] = t_softmax;
    acc = l[0] + l[1] + __uint_as_float(pa[0][0]) + o[0];
  } else {
    // The tensor warpgroup.
    Operands op;
    op.init(smem, wg - 1);
    // Whether to go on, the same for all four warps (wgmma is warpgroup-wide).
    __shared__ int go[kTensorWgs];
    auto keep_going = [&](int b) {
      if (threadIdx.x % 128 == 0) go[wg - 1] = tensor_mode != kNone && (timed == kTimeTensor ? b < kBatches : done == 0);
      asm volatile("bar.sync %0, 128;" ::"r"(wg) : "memory");
      const bool g = go[wg - 1] != 0;
      asm volatile("bar.sync %0, 128;" ::"r"(wg) : "memory");
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
    if (timed == kTimeTensor && threadIdx.x == 128) done = 1;  // the first tensor warpgroup is timed
    acc = op.sum();
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 128 == 0 && wg < 2) cycles[blockIdx.x * 3 + wg] = t;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sms * 3 * sizeof(long long));
  cudaMalloc(&d_sink, sms * 384 * sizeof(float));
  using Kernel = void (*)(int, int, int, long long*, float*);
  // Two launches (the first warms up); false if one failed.
  auto launch = [&](Kernel kernel, int tensor_wgs, int mode, int softmax_on, int timed) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    for (int rep = 0; rep < 2; ++rep)
      kernel<<<sms, 128 * (1 + tensor_wgs), kSmem>>>(mode, softmax_on, timed, d_cycles, d_sink);
    return cudaDeviceSynchronize() == cudaSuccess;
  };
  // Median over SMs of slot `slot` (0 softmax loop, 1 tensor loop, 2 softmax span) / per.
  auto median_of = [&](int slot, double per) {
    std::vector<long long> c(sms * 3);
    cudaMemcpy(c.data(), d_cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    std::vector<double> v;
    for (int b = 0; b < sms; ++b) v.push_back(c[b * 3 + slot] / per);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const char* tnames[] = {"none", "S (SS)", "P V (RS)", "S + P V", "", "", "", "S + P V, queue kept full"};
  std::printf("| timed | beside | cycles |\n|---|---|---|\n");
  for (int mode : {0, 1, 2, 3, 7}) {  // none, S, P V, S + P V, S + P V queue kept full
    if (!launch(probe_kernel<1, kNoOwnPv>, 1, mode, 1, kTimeSoftmax)) return 1;
    std::printf("| softmax (per 64x128 tile) | %s | %.0f |\n", tnames[mode], median_of(0, kSoftIters));
  }
  // The forward's situation: the softmax with its own P V batch in flight.
  for (int mode : {0, 3, 7}) {
    for (int own : {kOwnPvRS, kOwnPvSS}) {
      if (!launch(own == kOwnPvRS ? probe_kernel<1, kOwnPvRS> : probe_kernel<1, kOwnPvSS>, 1, mode, 1, kTimeSoftmax))
        return 1;
      std::printf("| softmax + own P V batch, P from %s (until its wait / the softmax's own span) | %s | %.0f / %.0f |\n",
                  own == kOwnPvRS ? "registers" : "shared memory", tnames[mode], median_of(0, kSoftIters),
                  median_of(2, kSoftIters));
    }
  }
  // Every 4th / 2nd exponential as a cubic on the FMA pipe (the softmax's own span).
  for (int mode : {0, 3}) {
    for (int poly : {4, 2}) {
      if (!launch(poly == 4 ? probe_kernel<1, kNoOwnPv, 4> : probe_kernel<1, kNoOwnPv, 2>, 1, mode, 1, kTimeSoftmax))
        return 1;
      std::printf("| softmax, 1 in %d exponentials a cubic (the softmax's own span) | %s | %.0f |\n", poly,
                  tnames[mode], median_of(2, kSoftIters));
    }
  }
  // Beside two warpgroups feeding the tensor pipe (saturated, as in the forward's ping-pong).
  for (int mode : {3, 7}) {
    if (!launch(probe_kernel<2, kNoOwnPv>, 2, mode, 1, kTimeSoftmax)) return 1;
    std::printf("| softmax | %s on two warpgroups | %.0f |\n", tnames[mode], median_of(0, kSoftIters));
  }
  for (int mode : {0, 3}) {
    if (!launch(probe_kernel<1, kNoOwnPv>, 1, mode, 1, kTimeSoftmax)) return 1;
    std::printf("| softmax (the softmax's own span) | %s | %.0f |\n", tnames[mode], median_of(2, kSoftIters));
  }
  for (int mode : {1, 2, 3, 7}) {
    const int per_batch = (mode & kS) && (mode & kPV) ? 16 : 8;
    for (int soft = 0; soft <= 1; ++soft) {
      if (!launch(probe_kernel<1, kNoOwnPv>, 1, mode, soft, kTimeTensor)) return 1;
      std::printf("| wgmma %s (per wgmma) | %s | %.1f |\n", tnames[mode], soft ? "softmax" : "none",
                  median_of(1, static_cast<double>(kBatches) * per_batch));
    }
  }
  return 0;
}
