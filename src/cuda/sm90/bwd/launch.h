// The Hopper backward's launchers, one instantiation per (head dim, dtype) in bwd_hdim*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::sm90 {

// The main kernel only: the sm80 pre-pass (D = rowsum(dO * O), dQ accumulator
// zeroed) has run before it and the sm80 post-pass (dQ accumulator -> dq) runs
// after it; the workspace is the sm80 one (same dQ accumulator layout).
template <int kD, typename T>
fa_status launch_backward(const AttentionParams& p, const bwd::Workspace& ws);

#define FLASHATTN_SM90_BWD_EXTERN(D)                                                                  \
  extern template fa_status launch_backward<D, __half>(const AttentionParams&, const bwd::Workspace&); \
  extern template fa_status launch_backward<D, __nv_bfloat16>(const AttentionParams&, const bwd::Workspace&);
FLASHATTN_SM90_BWD_EXTERN(64)
FLASHATTN_SM90_BWD_EXTERN(128)
FLASHATTN_SM90_BWD_EXTERN(256)
#undef FLASHATTN_SM90_BWD_EXTERN

}  // namespace flashattn::cuda::sm90
