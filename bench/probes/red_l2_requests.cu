// Micro-benchmark behind the sm90 d256 backward's dQ write-out (kernel.cuh
// NOTES): the same f32 reduce-adds into a 64 x 256 tile, issued two ways by
// 8 warps laid out as the kernel's consumers (2 warpgroups x 4 warps, each warp
// 16 rows x 128 columns):
//   frag_v2  red.global.add.v2.f32 straight from the wgmma accumulator layout
//            (a lane holds 2 adjacent columns of every 8): 1-sector L2 requests;
//   rows_v4  red.global.add.v4.f32 with 8 lanes per 128-byte row segment (the
//            layout after the kernel's shared-memory transpose): 4 sectors each.
// Prints the f32-add bandwidth of each; run under ncu with
// --metrics lts__t_requests_op_red.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed
// to see the request counts. Not part of the library build:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a bench/probes/red_l2_requests.cu -o red_l2_requests
#include <cuda_runtime.h>

#include <cstdio>

namespace {

constexpr int kRows = 64, kCols = 256;  // one d256 dQ tile
constexpr int kTiles = 64;              // distinct tiles the blocks add into
constexpr int kBlocks = 1056, kThreads = 256, kReps = 20;

__device__ __forceinline__ void red_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void red_v4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// kRowContiguous false: frag_v2; true: rows_v4 (see above). Same tile, same adds.
template <bool kRowContiguous>
__global__ void add_tile(float* acc) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
  float* tile = acc + static_cast<size_t>(blockIdx.x % kTiles) * kRows * kCols;
  float* warp_rows = tile + warp * 16 * kCols + wg * 128;  // this warp's 16 rows x 128 columns
  for (int it = 0; it < kReps; ++it) {
    if constexpr (kRowContiguous) {
      for (int ch = 0; ch < 4; ++ch)
        for (int j = 0; j < 4; ++j)
          red_v4(warp_rows + (lane / 8 + 4 * j) * kCols + ch * 32 + 4 * (lane % 8), 1.f, 1.f, 1.f, 1.f);
    } else {
      for (int r = 0; r < 2; ++r)
        for (int i = 0; i < 16; ++i) red_v2(warp_rows + (lane / 4 + 8 * r) * kCols + 8 * i + 2 * (lane % 4), 1.f, 1.f);
    }
  }
}

}  // namespace

int main() {
  const size_t bytes = static_cast<size_t>(kTiles) * kRows * kCols * sizeof(float);
  float* acc = nullptr;
  if (cudaMalloc(&acc, bytes) != cudaSuccess) {
    std::fprintf(stderr, "no GPU memory\n");
    return 1;
  }
  cudaMemset(acc, 0, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const double added = static_cast<double>(kBlocks) * kRows * kCols * sizeof(float) * kReps;
  for (int pass = 0; pass < 2; ++pass) {
    for (int variant = 0; variant < 2; ++variant) {
      cudaEventRecord(start);
      if (variant == 0) {
        add_tile<false><<<kBlocks, kThreads>>>(acc);
      } else {
        add_tile<true><<<kBlocks, kThreads>>>(acc);
      }
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      std::printf("%s: %.3f ms, %.0f GB/s of f32 adds\n", variant ? "rows_v4" : "frag_v2", ms, added / ms / 1e6);
    }
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) std::fprintf(stderr, "%s\n", cudaGetErrorString(err));
  cudaFree(acc);
  return err == cudaSuccess ? 0 : 1;
}
