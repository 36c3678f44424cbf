// DeviceOps on CUDA memory: stream-ordered allocations and copies, and
// grid-stride kernels for the merge, the accumulations and the casts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "attention/state.h"
#include "flashattn/flashattn.hpp"
#include "ring/ops.h"

namespace flashattn::ring {
namespace {

// Threads per block of the element-wise kernels (any multiple of 32 works;
// these kernels are bound by memory bandwidth).
constexpr int kThreads = 256;
// Blocks per launch cap: a grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 4096;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(FA_ERROR_DEVICE, std::string("ring attention: ") + what + ": " +
                                     cudaGetErrorString(e));
  }
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ float load(const void* p, int64_t i, fa_dtype dtype) {
  if (dtype == FA_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dtype == FA_F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ void save(void* p, int64_t i, fa_dtype dtype, float x) {
  if (dtype == FA_BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x);
  else if (dtype == FA_F16) static_cast<__half*>(p)[i] = __float2half(x);
  else static_cast<float*>(p)[i] = x;
}

// (b, i, h) row number t of a block -> offsets of its values and its lse.
__device__ void row_offsets(const RowBlock& b, int64_t t, int64_t& o, int64_t& l) {
  const int64_t span = b.row_end - b.row_begin;
  const int64_t h = t % b.heads;
  const int64_t i = b.row_begin + (t / b.heads) % span;
  const int64_t n = t / (b.heads * span);
  o = ((n * b.rows + i) * b.heads + h) * b.dim;
  l = (n * b.heads + h) * b.rows + i;
}

__global__ void fill_kernel(float* p, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * int64_t(blockDim.x))
    p[i] = value;
}

// One thread per (b, i, h) row: the merge factors once, then the row.
__global__ void merge_kernel(float* acc_o, float* acc_lse, const void* step_o,
                             const float* step_lse, fa_dtype dtype, RowBlock b) {
  const int64_t rows = b.count();
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < rows; t += gridDim.x * int64_t(blockDim.x)) {
    int64_t o, l;
    row_offsets(b, t, o, l);
    const MergeFactors f = merge_factors(RowState::from_lse(acc_lse[l]),
                                         RowState::from_lse(step_lse[l]), OutputForm::kNormalized);
    for (int64_t c = 0; c < b.dim; ++c) acc_o[o + c] = acc_o[o + c] * f.a + load(step_o, o + c, dtype) * f.b;
    acc_lse[l] = f.merged.lse();
  }
}

__global__ void accumulate_kernel(float* acc, const void* src, fa_dtype dtype, RowBlock b) {
  const int64_t n = b.count() * b.dim;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += gridDim.x * int64_t(blockDim.x)) {
    int64_t o, l;
    row_offsets(b, t / b.dim, o, l);
    acc[o + t % b.dim] += load(src, o + t % b.dim, dtype);
  }
}

__global__ void store_kernel(void* dst, fa_dtype dtype, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * int64_t(blockDim.x))
    save(dst, i, dtype, src[i]);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class CudaOps final : public DeviceOps {
 public:
  void require_device(int index) const override {
    int current = -1;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != index) {
      throw Error(FA_ERROR_INVALID_ARGUMENT,
                  "ring attention: the tensors are on CUDA device " + std::to_string(index) +
                      " but the current device is " + std::to_string(current) +
                      " (call cudaSetDevice first)");
    }
  }
  void* allocate(size_t bytes, void* stream) const override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, as_stream(stream)), "cudaMallocAsync");
    return p;
  }
  void release(void* p, void* stream) const override { cudaFreeAsync(p, as_stream(stream)); }
  void copy(void* dst, const void* src, size_t bytes, void* stream) const override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)),
          "cudaMemcpyAsync");
  }
  void fill(float* p, int64_t n, float value, void* stream) const override {
    fill_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, n, value);
    check(cudaGetLastError(), "fill kernel");
  }
  void merge(float* acc_o, float* acc_lse, const void* step_o, const float* step_lse,
             fa_dtype dtype, const RowBlock& b, void* stream) const override {
    merge_kernel<<<blocks_for(b.count()), kThreads, 0, as_stream(stream)>>>(acc_o, acc_lse, step_o,
                                                                           step_lse, dtype, b);
    check(cudaGetLastError(), "merge kernel");
  }
  void accumulate(float* acc, const void* src, fa_dtype dtype, const RowBlock& b,
                  void* stream) const override {
    accumulate_kernel<<<blocks_for(b.count() * b.dim), kThreads, 0, as_stream(stream)>>>(acc, src,
                                                                                       dtype, b);
    check(cudaGetLastError(), "accumulate kernel");
  }
  void store(void* dst, fa_dtype dtype, const float* src, int64_t n, void* stream) const override {
    store_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, dtype, src, n);
    check(cudaGetLastError(), "store kernel");
  }
};

}  // namespace

const DeviceOps& cuda_ops() {
  static const CudaOps ops;
  return ops;
}

}  // namespace flashattn::ring
