// The head dims each CUDA kernel family is instantiated for, in one place: a
// call runs on the smallest kernel that holds its head dim (the columns past
// it are zero-filled on load and never stored). The instantiation files
// (fwd_hdim*.cu, hdim*.cu, bwd_hdim*.cu) must match these lists; dispatch()
// turns a run-time kernel head dim into the compile-time one.
#pragma once

#include <type_traits>

#include "core/params.h"
#include "flashattn/flashattn.h"

namespace flashattn::cuda {

// Every list stays within core/params.h's kMaxHeadDim (multiples of
// kHeadDimMultiple); backend.cu's check_common checks a call against them.
template <int... Ds>
struct HeadDims {
  // The smallest kernel head dim >= d, or 0 when none holds it.
  static constexpr int kernel_for(int d) {
    int best = 0;
    ((best == 0 && d <= Ds ? (best = Ds, true) : false), ...);
    return best;
  }
  // Whether d has a kernel of exactly its size.
  static constexpr bool exact(int d) { return ((d == Ds) || ...); }
  // f(std::integral_constant<int, D>{}) for the kernel head dim kd.
  template <class F>
  static fa_status dispatch(int kd, F&& f) {
    fa_status s = FA_ERROR_UNSUPPORTED;
    ((kd == Ds ? (s = f(std::integral_constant<int, Ds>{}), true) : false) || ...);
    return s;
  }
};

namespace sm80 {
using ForwardHeadDims = HeadDims<32, 64, 96, 128, 192, 256>;
using BackwardHeadDims = HeadDims<32, 64, 96, 128, 160, 192, 256>;
}  // namespace sm80

namespace sm90 {
// 96 pads to 128: a 96-column tile is not a whole number of 128-byte swizzle atoms.
using ForwardHeadDims = HeadDims<64, 128, 192, 256>;
// The backward too: 96 runs on 128, 192 on 256 (the dQ accumulator is as wide
// as the kernel, dK and dV are stored for the real columns only).
using BackwardHeadDims = HeadDims<64, 128, 256>;
}  // namespace sm90

}  // namespace flashattn::cuda
