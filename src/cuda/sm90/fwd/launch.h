// The Hopper forward's launchers, one instantiation per (head dim, dtype) in fwd_hdim*.cu.
// launch_forward<D> takes any head_dim that is a multiple of 8 and at most D.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

template <int kD, typename T>
fa_status launch_forward(const AttentionParams& p);

#define FLASHATTN_SM90_FWD_EXTERN(D)                                            \
  extern template fa_status launch_forward<D, __half>(const AttentionParams&);  \
  extern template fa_status launch_forward<D, __nv_bfloat16>(const AttentionParams&);
FLASHATTN_SM90_FWD_EXTERN(64)
FLASHATTN_SM90_FWD_EXTERN(128)
FLASHATTN_SM90_FWD_EXTERN(192)
FLASHATTN_SM90_FWD_EXTERN(256)
#undef FLASHATTN_SM90_FWD_EXTERN

}  // namespace flashattn::cuda::sm90
