// The Hopper (sm_90a) backward main kernel: wgmma + TMA + warp specialization.
// The dispatcher (src/cuda/dispatch.cu) runs the shared pre-pass, then this
// main kernel where can_run_backward() says so, then the post-pass;
// FA_ERROR_UNSUPPORTED from run_backward means "use the sm80 main kernel"
// (nothing was launched).
#pragma once

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::sm90 {

// True when the device of p is compute capability 9.0 and p is a case this
// kernel handles (f16/bf16, head dims up to 256 on the kernels of head_dims.h,
// softcap with ALiBi only without dropout or a block mask, not dropout with
// seqused_k).
bool supports_backward(const AttentionParams& p);

// supports_backward(p), unless disabled_by_env() (FLASHATTN_DISABLE_SM90).
bool can_run_backward(const AttentionParams& p);

// Launches the main kernel on p.stream, reading ws.row_d and adding into
// ws.dq_accum ([heads_q][total_q][ws.accum_dim], accum_dim == the kernel head dim).
fa_status run_backward(const AttentionParams& p, const bwd::Workspace& ws);

}  // namespace flashattn::cuda::sm90
