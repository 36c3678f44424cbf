// DeviceOps on host memory.
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "attention/state.h"
#include "core/dtype.h"
#include "ring/ops.h"

namespace flashattn::ring {
namespace {

// Calls f(row_offset, lse_offset) for every (b, i, h) row of the block.
template <typename F>
void for_each_row(const RowBlock& b, F f) {
  for (int64_t n = 0; n < b.batch; ++n)
    for (int64_t i = b.row_begin; i < b.row_end; ++i)
      for (int64_t h = 0; h < b.heads; ++h)
        f(((n * b.rows + i) * b.heads + h) * b.dim, (n * b.heads + h) * b.rows + i);
}

class CpuOps final : public DeviceOps {
 public:
  void require_device(int) const override {}
  void* allocate(size_t bytes, void*) const override {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* p, void*) const override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes, void*) const override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void fill(float* p, int64_t n, float value, void*) const override {
    for (int64_t i = 0; i < n; ++i) p[i] = value;
  }
  void merge(float* acc_o, float* acc_lse, const void* step_o, const float* step_lse,
             fa_dtype dtype, const RowBlock& b, void*) const override {
    std::vector<float> row(static_cast<size_t>(b.dim));
    for_each_row(b, [&](int64_t o, int64_t l) {
      for (int64_t c = 0; c < b.dim; ++c) row[c] = load_as_float(step_o, o + c, dtype);
      RowState state = RowState::from_lse(acc_lse[l]);
      flashattn::merge(acc_o + o, state, row.data(), RowState::from_lse(step_lse[l]),
            static_cast<int>(b.dim), OutputForm::kNormalized);
      acc_lse[l] = state.lse();
    });
  }
  void accumulate(float* acc, const void* src, fa_dtype dtype, const RowBlock& b,
                  void*) const override {
    for_each_row(b, [&](int64_t o, int64_t) {
      for (int64_t c = 0; c < b.dim; ++c) acc[o + c] += load_as_float(src, o + c, dtype);
    });
  }
  void store(void* dst, fa_dtype dtype, const float* src, int64_t n, void*) const override {
    for (int64_t i = 0; i < n; ++i) store_from_float(dst, i, dtype, src[i]);
  }
};

}  // namespace

const DeviceOps& cpu_ops() {
  static const CpuOps ops;
  return ops;
}

}  // namespace flashattn::ring
