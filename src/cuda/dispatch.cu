// The CUDA backend's one dispatcher: the only place that chooses between the
// Hopper (sm90) and the sm80 kernels, and that owns the backward's workspace
// and its pre/post passes around whichever main kernel runs.
//   forward:  sm90 where can_run_forward(p) (a 9.0 device, shapes TMA can
//             describe, FLASHATTN_DISABLE_SM90 unset), else sm80;
//             FA_ERROR_UNSUPPORTED from sm90 falls back to sm80; a block
//             mask runs either (sm90/fwd/scheduler.cuh's ListedKeys), with
//             or without dropout.
//   backward: pre-pass, then the sm90 main kernel where can_run_backward(p)
//             (a block mask: FA_ERROR_UNSUPPORTED before any launch from
//             its list build, e.g. past 2^31 steps), else
//             sm80's, then the post-pass, all on p.stream.
//   both:     a varlen call captured into a CUDA graph reads a checked copy
//             of its cu_seqlens (common/captured_varlen.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/backends.h"
#include "core/error.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/block_tiles.h"
#include "cuda/common/captured_varlen.h"
#include "cuda/common/device_guard.h"
#include "cuda/dispatch.h"
#include "cuda/head_dims.h"
#include "cuda/sm80/api.h"
#include "cuda/sm80/bwd/config.h"
#include "cuda/sm90/bwd/api.h"
#include "cuda/sm90/fwd/api.h"

namespace flashattn::cuda {
namespace {

fa_status device_error(cudaError_t err, const char* what) {
  cudaGetLastError();
  return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
}

// The tile shape of the block-mask copy the dq post-pass reads (any shape
// lists the same pairs; whole tiles of FlexAttention's 128 x 128 blocks need
// no bit table).
constexpr int kFixupTile = 128;

template <typename T>
fa_status run_backward_passes(const AttentionParams& p, const bwd::Workspace& ws) {
  FA_RETURN_IF_ERROR(bwd::run_prepass<T>(p, ws));
  FA_RETURN_IF_ERROR(bwd::run_sink_grad(p, ws));
  fa_status s = FA_ERROR_UNSUPPORTED;
  if (sm90::can_run_backward(p)) s = sm90::run_backward(p, ws);
  if (s == FA_ERROR_UNSUPPORTED) s = sm80::run_backward_main(p, ws);
  FA_RETURN_IF_ERROR(s);
  // The post-pass's recompute of non-finite dq rows tests pairs against the
  // block mask's lists (none without one).
  BlockTileBuffer blocks;
  FA_RETURN_IF_ERROR(blocks.build(p, kFixupTile, kFixupTile, BlockWalk::kForward));
  const BlockTiles view = blocks.view();
  return bwd::run_postpass<T>(p, ws, ListedPairs{view.key_tiles, view.blocks, kFixupTile, kFixupTile});
}

}  // namespace

// The backward workspace for p: the dQ accumulator rows are as wide as the
// head dim of the kernel that runs (the Hopper kernel's where it takes the
// call; every Hopper kernel width is in the sm80 list too, so the sm80 kernel
// can still take a call the Hopper one turns down), and deterministic-mode
// semaphores count the sm80 kernel's query tiles (the sm90 kernel checks that
// its tiles match and falls back to sm80 where they do not).
bwd::WorkspacePlan plan_backward_workspace(const AttentionParams& p) {
  const int kd = sm90::can_run_backward(p) ? sm90::BackwardHeadDims::kernel_for(p.head_dim)
                                           : sm80::BackwardHeadDims::kernel_for(p.head_dim);
  int block_m = bwd::Config<256>::kBlockM;
  sm80::BackwardHeadDims::dispatch(kd, [&](auto d) {
    block_m = bwd::Config<decltype(d)::value>::kBlockM;
    return FA_OK;
  });
  return bwd::plan_workspace(p, kd, block_m);
}

fa_status forward(const AttentionParams& params) {
  DeviceGuard guard(params.device_index);
  AttentionParams p = params;
  CapturedVarlen varlen;
  FA_RETURN_IF_ERROR(varlen.prepare(&p));
  fa_status s = FA_ERROR_UNSUPPORTED;
  if (sm90::can_run_forward(p)) s = sm90::run_forward(p);
  if (s == FA_ERROR_UNSUPPORTED) s = sm80::run_forward(p);
  const fa_status freed = varlen.release();
  return s != FA_OK ? s : freed;
}

// The sm80 forward uses no scratch; the Hopper forward's split tail does.
size_t forward_workspace_size(const AttentionParams& p) {
  DeviceGuard guard(p.device_index);
  return sm90::can_run_forward(p) ? sm90::forward_workspace_size(p) : 0;
}

size_t backward_workspace_size(const AttentionParams& p) { return plan_backward_workspace(p).total(); }

fa_status backward(const AttentionParams& params) {
  DeviceGuard guard(params.device_index);
  AttentionParams p = params;
  CapturedVarlen varlen;
  FA_RETURN_IF_ERROR(varlen.prepare(&p));
  const bwd::WorkspacePlan w = plan_backward_workspace(p);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  void* owned = nullptr;
  unsigned char* base = static_cast<unsigned char*>(p.workspace);
  if (base == nullptr && w.total() > 0) {
    const cudaError_t err = cudaMallocAsync(&owned, w.total(), stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(FA_ERROR_OUT_OF_MEMORY, "could not allocate the backward workspace (" +
                                              std::to_string(w.total()) + " bytes): " + cudaGetErrorString(err));
    }
    base = static_cast<unsigned char*>(owned);
  }
  const bwd::Workspace ws = bwd::carve_workspace(p, w, base);

  fa_status status = FA_OK;
  if (p.deterministic && w.sem > 0) {
    const cudaError_t err = cudaMemsetAsync(ws.dq_sem, 0, w.sem, stream);
    if (err != cudaSuccess) status = device_error(err, "cudaMemsetAsync of the dQ semaphores");
  }
  if (status == FA_OK) {
    status = p.dtype == FA_BF16 ? run_backward_passes<__nv_bfloat16>(p, ws) : run_backward_passes<__half>(p, ws);
  }
  if (owned != nullptr) {
    const cudaError_t err = cudaFreeAsync(owned, stream);
    if (err != cudaSuccess && status == FA_OK) status = device_error(err, "cudaFreeAsync of the backward workspace");
  }
  const fa_status freed = varlen.release();
  return status != FA_OK ? status : freed;
}

}  // namespace flashattn::cuda
