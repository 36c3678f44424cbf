// The sm80 (mma.sync) kernels as the dispatcher (src/cuda/dispatch.cu) sees
// them: they run on every GPU from sm_80 on, any head dim the CUDA backend takes.
#pragma once

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::sm80 {

// The forward on the smallest kernel that holds p.head_dim (head_dims.h).
fa_status run_forward(const AttentionParams& p);

// The backward's main kernel for ws.accum_dim (a head dim of
// sm80::BackwardHeadDims), between the shared pre- and post-passes.
fa_status run_backward_main(const AttentionParams& p, const bwd::Workspace& ws);

}  // namespace flashattn::cuda::sm80
