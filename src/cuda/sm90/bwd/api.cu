// Dispatch of the Hopper backward: which params it takes (everything else falls
// back to the sm80 kernel, see tuning.h), and the head-dim / dtype switch.
#include <string>

#include "core/error.h"
#include "cuda/head_dims.h"
#include "cuda/sm90/bwd/api.h"
#include "cuda/sm90/bwd/launch.h"
#include "cuda/sm90/bwd/tuning.h"
#include "cuda/sm90/fwd/api.h"

namespace flashattn::cuda::sm90 {

bool supports_backward(const AttentionParams& p) {
  // Deterministic mode: ordered dQ adds (dq.cuh NOTES); d 64/128 order the TMA
  // reduce-adds, d 256 its red.global adds (launch_backward checks the tuning
  // allows one of them); varlen batches too (reduce_dq).
  // Block masks (ListedQueryWalk): tiles the mask lists in part test each
  // pair (zero_unlisted); varlen calls cut their steps to the sequence's
  // range; with dropout, its PhiloxDropout instantiation; deterministic mode
  // orders the dQ adds along the key tiles that list each query tile.
  // Softcap: exp_scores_softcap / ds_scores_softcap (softmax.cuh), which take
  // tanh back from P and lse (with ALiBi, less its bias: the kernel of
  // SoftcapAlibiMods, without dropout or a block mask; those combinations run
  // on the sm80 kernel).
  if (p.softcap > 0.0f && p.has_alibi() && (p.has_dropout() || p.has_block_mask())) return false;
  // Sinks need nothing of the main kernel (the lse holds them; their
  // gradient is bwd/sinks.cu's pass); ALiBi is exp_scores_alibi; dropout is
  // the kernel's PhiloxDropout instantiation (bwd/dropout.cuh).
  if (BackwardHeadDims::kernel_for(p.head_dim) == 0) return false;
  // The forward's checks (dtype, non-empty, int32 TMA coordinates, device 9.0)
  // hold for the backward's tensors too: dout/dq/dk/dv share q/k/v's shapes.
  return supports_forward(p);
}

bool can_run_backward(const AttentionParams& p) {
  // supports_backward already asks supports_forward (device and tensors).
  return !disabled_by_env() && supports_backward(p);
}

fa_status run_backward(const AttentionParams& p, const bwd::Workspace& ws) {
  const int kd = BackwardHeadDims::kernel_for(p.head_dim);
  if (kd == 0) return fail(FA_ERROR_UNSUPPORTED, "sm90 backward: no kernel for head_dim " + std::to_string(p.head_dim));
  if (ws.accum_dim != kd) return fail(FA_ERROR_UNSUPPORTED, "sm90 backward: dQ accumulator width != kernel head dim");
  const bool bf16 = p.dtype == FA_BF16;
  return BackwardHeadDims::dispatch(kd, [&](auto d) {
    return bf16 ? launch_backward<decltype(d)::value, __nv_bfloat16>(p, ws)
                : launch_backward<decltype(d)::value, __half>(p, ws);
  });
}

}  // namespace flashattn::cuda::sm90
