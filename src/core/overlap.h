// Memory extents and overlap of strided tensors, in 64-bit byte arithmetic:
// the validator proves that every byte a kernel touches lies inside a tensor
// whose end does not wrap the address space, and that no output shares a byte
// with another output or with an input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "flashattn/flashattn.h"

namespace flashattn {

// [begin, end) bytes a non-empty tensor can touch. Strides are non-negative
// here (the validator rejects negative ones first).
struct ByteSpan {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool intersects(const ByteSpan& o) const { return begin < o.end && o.begin < end; }
};

inline bool tensor_is_empty(const fa_tensor& t) {
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return true;
  }
  return false;
}

// The bytes of t, or false when the last byte's offset overflows 64 bits or
// data + offset wraps the address space.
inline bool tensor_byte_span(const fa_tensor& t, ByteSpan* span) {
  const int64_t item = static_cast<int64_t>(dtype_size(t.dtype));
  int64_t last = 0;  // byte offset of the last element
  for (int i = 0; i < t.ndim; ++i) {
    int64_t term = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.strides[i], &term) ||
        __builtin_mul_overflow(term, item, &term) || __builtin_add_overflow(last, term, &last)) {
      return false;
    }
  }
  const uint64_t base = reinterpret_cast<uintptr_t>(t.data);
  uint64_t end = 0;
  if (__builtin_add_overflow(base, static_cast<uint64_t>(last) + static_cast<uint64_t>(item), &end)) {
    return false;
  }
  *span = {base, end};
  return true;
}

namespace overlap_detail {

// NOTES: two tensors with the same strides and element size (packed qkv / dqkv
// views of one buffer, or one tensor passed twice) share an element exactly
// when their base distance, in elements, is sum_k delta_k * stride_k with
// -(nb_k - 1) <= delta_k <= na_k - 1. Dimensions are walked by decreasing
// stride; at each the remaining dimensions can add at most [lo, hi], which
// leaves a few candidate deltas (one when strides nest). The walk is capped:
// past the cap the answer is "may overlap", which callers reject.
constexpr int kMaxNodes = 1 << 12;

struct Dim {
  int64_t stride, na, nb;
};

inline bool solve(const Dim* dims, int count, int64_t residual, int* budget) {
  if (--*budget < 0) return true;
  if (count == 0) return residual == 0;
  int64_t lo = 0, hi = 0;  // what dimensions 1.. of dims can still add
  for (int i = 1; i < count; ++i) {
    lo -= (dims[i].nb - 1) * dims[i].stride;
    hi += (dims[i].na - 1) * dims[i].stride;
  }
  const Dim& d = dims[0];
  // delta with lo <= residual - delta * stride <= hi
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const int64_t first = std::max(-(d.nb - 1), -floor_div(-(residual - hi), d.stride));
  const int64_t last = std::min(d.na - 1, floor_div(residual - lo, d.stride));
  for (int64_t delta = first; delta <= last; ++delta) {
    if (solve(dims + 1, count - 1, residual - delta * d.stride, budget)) return true;
  }
  return false;
}

// Both tensors have the same dtype and the same strides on every dimension
// that either of them extends over.
inline bool same_layout(const fa_tensor& a, const fa_tensor& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i) {
    if ((a.shape[i] > 1 || b.shape[i] > 1) && a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

}  // namespace overlap_detail

// True when a and b (validated tensors: in-range spans, positive strides) may
// share a byte. Exact for disjoint spans and for equal layouts; otherwise
// spans that intersect count as overlapping.
inline bool tensors_may_overlap(const fa_tensor& a, const fa_tensor& b) {
  using namespace overlap_detail;
  if (tensor_is_empty(a) || tensor_is_empty(b)) return false;
  ByteSpan sa, sb;
  if (!tensor_byte_span(a, &sa) || !tensor_byte_span(b, &sb)) return true;
  if (!sa.intersects(sb)) return false;
  if (!same_layout(a, b)) return true;
  const int64_t item = static_cast<int64_t>(dtype_size(a.dtype));
  const int64_t distance = static_cast<int64_t>(sb.begin - sa.begin);
  if (distance % item != 0) return true;  // elements straddle each other
  Dim dims[FA_MAX_DIMS];
  int count = 0;
  for (int i = 0; i < a.ndim && i < FA_MAX_DIMS; ++i) {
    if (a.shape[i] > 1 || b.shape[i] > 1) dims[count++] = {a.strides[i], a.shape[i], b.shape[i]};
  }
  for (int i = 1; i < count; ++i) {  // by decreasing stride (insertion sort of <= 4)
    for (int j = i; j > 0 && dims[j - 1].stride < dims[j].stride; --j) std::swap(dims[j - 1], dims[j]);
  }
  int budget = kMaxNodes;
  return solve(dims, count, distance / item, &budget);
}

}  // namespace flashattn
