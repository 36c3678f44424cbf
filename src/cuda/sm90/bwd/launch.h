// The Hopper backward's launchers, one instantiation per (head dim, dtype) in bwd_hdim*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::sm90 {

// The main kernel only: the shared pre-pass (cuda/bwd: D = rowsum(dO * O), dQ
// accumulator zeroed) has run before it and the post-pass (dQ accumulator ->
// dq) runs after it. Instantiated in bwd_hdim*.cu (head_dims.h's list); the
// definition is not visible elsewhere, so nothing else instantiates it.
template <int kD, typename T>
fa_status launch_backward(const AttentionParams& p, const bwd::Workspace& ws);

}  // namespace flashattn::cuda::sm90
