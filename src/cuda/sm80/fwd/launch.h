// The sm80 forward kernels' launchers, one instantiation per (head dim, dtype)
// in fwd_hdim*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"

namespace flashattn::cuda::sm80 {

// Instantiated in fwd_hdim*.cu (head_dims.h's list); the definition is not
// visible elsewhere, so nothing else instantiates it.
template <int kD, typename T>
fa_status launch_forward(const AttentionParams& p);

}  // namespace flashattn::cuda::sm80
