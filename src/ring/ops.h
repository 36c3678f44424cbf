// The element-wise work of a ring step, on the memory the tensors live in:
// buffers, copies, the fp32 merge of a step's (out, lse) into the running
// state, fp32 accumulation of gradients and the final casts. One CPU and one
// CUDA implementation (ops_cuda.cu; ops_no_cuda.cpp without CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/host_device.h"
#include "flashattn/flashattn.h"

namespace flashattn::ring {

// Rows [row_begin, row_end) of every sequence of a contiguous
// (batch, rows, heads, dim) tensor, and of its (batch, heads, rows) lse.
struct RowBlock {
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  FA_HOST_DEVICE int64_t count() const { return batch * (row_end - row_begin) * heads; }  // (b, i, h) rows
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Throws unless the tensors' device is the current one (where the buffers
  // and kernels of a ring call go).
  virtual void require_device(int index) const = 0;
  virtual void* allocate(size_t bytes, void* stream) const = 0;
  virtual void release(void* p, void* stream) const = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, void* stream) const = 0;
  virtual void fill(float* p, int64_t n, float value, void* stream) const = 0;
  // (acc_o, acc_lse) absorbs (step_o in `dtype`, step_lse) on rows `b`:
  // both normalised partials, merged in fp32 (state.h's merge).
  virtual void merge(float* acc_o, float* acc_lse, const void* step_o, const float* step_lse,
                     fa_dtype dtype, const RowBlock& b, void* stream) const = 0;
  // acc += src (in `dtype`) on rows `b` of two tensors of the same shape.
  virtual void accumulate(float* acc, const void* src, fa_dtype dtype, const RowBlock& b,
                          void* stream) const = 0;
  // dst (in `dtype`) = src, n contiguous values.
  virtual void store(void* dst, fa_dtype dtype, const float* src, int64_t n, void* stream) const = 0;
};

const DeviceOps& cpu_ops();
// Throws flashattn::Error (backend unavailable) in a build without CUDA.
const DeviceOps& cuda_ops();

}  // namespace flashattn::ring
