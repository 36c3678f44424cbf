// sm80::run_backward_main: the sm80 backward main kernel's head-dim and dtype switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/error.h"
#include "cuda/head_dims.h"
#include "cuda/sm80/api.h"
#include "cuda/sm80/bwd/launch.h"

namespace flashattn::cuda::sm80 {

fa_status run_backward_main(const AttentionParams& p, const bwd::Workspace& ws) {
  const bool bf16 = p.dtype == FA_BF16;
  const fa_status s = BackwardHeadDims::dispatch(ws.accum_dim, [&](auto d) {
    return bf16 ? bwd::run_main<decltype(d)::value, __nv_bfloat16>(p, ws) : bwd::run_main<decltype(d)::value, __half>(p, ws);
  });
  if (s == FA_ERROR_UNSUPPORTED && !BackwardHeadDims::exact(ws.accum_dim))
    return fail(FA_ERROR_UNSUPPORTED, "sm80 backward: no kernel for head dim " + std::to_string(ws.accum_dim));
  return s;
}

}  // namespace flashattn::cuda::sm80
