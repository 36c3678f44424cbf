// sm80::run_forward: the sm80 forward's head-dim and dtype switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/error.h"
#include "cuda/head_dims.h"
#include "cuda/sm80/api.h"
#include "cuda/sm80/fwd/launch.h"

namespace flashattn::cuda::sm80 {

fa_status run_forward(const AttentionParams& p) {
  const int kd = ForwardHeadDims::kernel_for(p.head_dim);
  const bool bf16 = p.dtype == FA_BF16;
  const fa_status s = ForwardHeadDims::dispatch(kd, [&](auto d) {
    return bf16 ? launch_forward<decltype(d)::value, __nv_bfloat16>(p) : launch_forward<decltype(d)::value, __half>(p);
  });
  if (s == FA_ERROR_UNSUPPORTED && kd == 0)
    return fail(FA_ERROR_UNSUPPORTED, "sm80 forward: no kernel for head_dim " + std::to_string(p.head_dim));
  return s;
}

}  // namespace flashattn::cuda::sm80
