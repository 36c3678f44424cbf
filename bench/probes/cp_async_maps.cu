// Micro-benchmark behind the decode kernel's K/V copies (src/cuda/decode,
// docs/performance.md 3.6): ncu counts 24 L2 sectors per warp cp.async of 512
// bytes there, cuDNN's decode kernel 16. Each variant streams 256-byte rows
// (one head dim 128 row of bf16) into a 3-stage shared-memory ring of 128-row
// tiles, 264 CTAs of 128 threads (two an SM), nothing else, and prints GB/s:
//   rows      where a CTA's rows are: strided (2 KB apart: the (b, s, h, d)
//             cache, one of 8 heads) or contiguous (the (b, h, s, d) layout)
//   map       row: 16 threads a 256-byte row (the decode kernel's contiguous
//             map); line: 8 threads a 128-byte line, both lines of a row a
//             thread (its paged map, and cuDNN's)
//   smem      pad16: rows of 272 bytes (the decode ring); plain: 256; xor:
//             256 with 16-byte chunk c at c ^ (row % 8)
//   copy      the cp.async qualifiers (Copy below), bare unless named
// Run under ncu with
//   --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum
// for the request counts. Not part of the library build:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/probes/cp_async_maps.cu -o cp_async_maps
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kThreads = 128, kCtas = 264, kHeads = 8;
constexpr int kRowBytes = 256, kChunks = kRowBytes / 16;
constexpr int kTileRows = 128, kStages = 3;
constexpr int kRowsPerCta = 32768;  // 8 MB a CTA, 2.2 GB in all
constexpr int kTiles = kRowsPerCta / kTileRows;

enum Smem { kPad16, kPlain, kXor };

template <Smem S>
__device__ __forceinline__ int smem_offset(int row, int chunk) {
  if constexpr (S == kPad16) return row * (kRowBytes + 16) + chunk * 16;
  if constexpr (S == kPlain) return row * kRowBytes + chunk * 16;
  return row * kRowBytes + ((chunk ^ (row % 8)) * 16);
}
template <Smem S>
__host__ __device__ constexpr int stage_bytes() { return kTileRows * (S == kPad16 ? kRowBytes + 16 : kRowBytes); }

// The copy's qualifiers: none; the zero-fill form (a source size operand, as
// the decode kernel's rows past a sequence need); the L2's 128-byte fetch; an
// L2 evict-first policy; all three (the decode kernel's copy).
enum Copy { kBare, kZfill, kFetch128, kPolicy, kAll };

template <Copy C>
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint64_t policy) {
  const int size = 16;
  if constexpr (C == kBare) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  if constexpr (C == kZfill)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size));
  if constexpr (C == kFetch128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  if constexpr (C == kPolicy)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "l"(policy));
  if constexpr (C == kAll)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(size), "l"(policy));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Byte offset of row j of this CTA's rows.
template <bool kStrided>
__device__ __forceinline__ int64_t row_offset(int j) {
  const int64_t cta = blockIdx.x;
  if constexpr (kStrided) return ((cta / kHeads * kRowsPerCta + j) * kHeads + cta % kHeads) * kRowBytes;
  return (cta * kRowsPerCta + j) * kRowBytes;
}

template <bool kStrided, bool kLineMap, Smem S, Copy C>
__device__ __forceinline__ void load(const uint8_t* src, uint8_t* stage, int tile, uint64_t policy) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  if constexpr (kLineMap) {
    const int c = threadIdx.x % 8, r0 = threadIdx.x / 8;
#pragma unroll
    for (int n = 0; n < kTileRows / (kThreads / 8); ++n) {
      const int r = r0 + n * (kThreads / 8);
      const uint8_t* row = src + row_offset<kStrided>(tile * kTileRows + r);
#pragma unroll
      for (int h = 0; h < 2; ++h) cp_async_16<C>(base + smem_offset<S>(r, c + 8 * h), row + (c + 8 * h) * 16, policy);
    }
  } else {
    const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
#pragma unroll
    for (int n = 0; n < kTileRows / (kThreads / kChunks); ++n) {
      const int r = r0 + n * (kThreads / kChunks);
      cp_async_16<C>(base + smem_offset<S>(r, c), src + row_offset<kStrided>(tile * kTileRows + r) + c * 16, policy);
    }
  }
}

template <bool kStrided, bool kLineMap, Smem S, Copy C>
__global__ void __launch_bounds__(kThreads, 2) stream(const uint8_t* src, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t ring[];
  constexpr int kStage = stage_bytes<S>();
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  uint32_t acc = 0;
  for (int s = 0; s < kStages - 1; ++s) {
    load<kStrided, kLineMap, S, C>(src, ring + s * kStage, s, policy);
    commit();
  }
  for (int it = 0; it < kTiles; ++it) {
    wait_group<kStages - 2>();
    __syncthreads();  // tile it landed; the stage read last turn is free
    const int ahead = it + kStages - 1;
    if (ahead < kTiles) load<kStrided, kLineMap, S, C>(src, ring + (ahead % kStages) * kStage, ahead, policy);
    commit();
    // every thread reads a word of the tile, so the copies are used
    acc += reinterpret_cast<const uint32_t*>(ring + (it % kStages) * kStage)[threadIdx.x];
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

template <bool kStrided, bool kLineMap, Smem S, Copy C = kBare>
void run(const char* name, const uint8_t* src, uint32_t* sink) {
  auto kernel = stream<kStrided, kLineMap, S, C>;
  const int smem = kStages * stage_bytes<S>();
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int rep = 0; rep < 7; ++rep) {
    cudaEventRecord(a);
    kernel<<<kCtas, kThreads, smem>>>(src, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double bytes = double(kCtas) * kRowsPerCta * kRowBytes;
  std::printf("%-28s %7.1f GB/s  (median of 7, %.3f ms)\n", name, bytes / (ms[3] * 1e-3) / 1e9, ms[3]);
}

}  // namespace

int main() {
  const size_t bytes = size_t(kCtas) * kRowsPerCta * kRowBytes;
  uint8_t* src = nullptr;
  uint32_t* sink = nullptr;
  if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&sink, 4096) != cudaSuccess) return 1;
  cudaMemset(src, 1, bytes);
  run<true, false, kPad16>("strided row pad16", src, sink);
  run<true, false, kPlain>("strided row plain", src, sink);
  run<true, false, kXor>("strided row xor", src, sink);
  run<true, true, kPad16>("strided line pad16", src, sink);
  run<true, true, kPlain>("strided line plain", src, sink);
  run<true, true, kXor>("strided line xor", src, sink);
  run<false, false, kPad16>("contiguous row pad16", src, sink);
  run<false, false, kPlain>("contiguous row plain", src, sink);
  run<false, false, kXor>("contiguous row xor", src, sink);
  run<false, true, kPad16>("contiguous line pad16", src, sink);
  run<false, true, kPlain>("contiguous line plain", src, sink);
  run<false, true, kXor>("contiguous line xor", src, sink);
  run<true, false, kPad16, kZfill>("strided row pad16 zfill", src, sink);
  run<true, false, kPad16, kFetch128>("strided row pad16 fetch128", src, sink);
  run<true, false, kPad16, kPolicy>("strided row pad16 policy", src, sink);
  run<true, false, kPad16, kAll>("strided row pad16 all", src, sink);
  run<true, false, kXor, kZfill>("strided row xor zfill", src, sink);
  run<true, false, kXor, kFetch128>("strided row xor fetch128", src, sink);
  run<true, false, kXor, kPolicy>("strided row xor policy", src, sink);
  run<true, false, kXor, kAll>("strided row xor all", src, sink);
  run<true, true, kXor, kAll>("strided line xor all", src, sink);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) std::printf("error: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
