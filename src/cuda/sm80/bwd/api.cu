// The sm80 backward's entry points: workspace sizing, carving and dispatch
// (pre-pass, main kernel for the head dim, post-pass), all on p.stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/backends.h"
#include "core/error.h"
#include "core/numeric.h"
#include "cuda/common/device_guard.h"
#include "cuda/sm80/bwd/config.h"
#include "cuda/sm80/bwd/launch.h"
#include "cuda/sm90/bwd/api.h"

namespace flashattn::cuda {
namespace {

constexpr size_t kAlign = 256;  // every workspace region starts 256-byte aligned
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int block_m(int kernel_dim) {
  switch (kernel_dim) {
    case 32: return bwd::Config<32>::kBlockM;
    case 64: return bwd::Config<64>::kBlockM;
    case 96: return bwd::Config<96>::kBlockM;
    case 128: return bwd::Config<128>::kBlockM;
    case 160: return bwd::Config<160>::kBlockM;
    case 192: return bwd::Config<192>::kBlockM;
    default: return bwd::Config<256>::kBlockM;
  }
}

template <typename T>
fa_status run_main_for(int kernel_dim, const AttentionParams& p, const bwd::Workspace& ws) {
  switch (kernel_dim) {
    case 32: return bwd::run_main<32, T>(p, ws);
    case 64: return bwd::run_main<64, T>(p, ws);
    case 96: return bwd::run_main<96, T>(p, ws);
    case 128: return bwd::run_main<128, T>(p, ws);
    case 160: return bwd::run_main<160, T>(p, ws);
    case 192: return bwd::run_main<192, T>(p, ws);
    default: return bwd::run_main<256, T>(p, ws);
  }
}

template <typename T>
fa_status run_all(const AttentionParams& p, const bwd::Workspace& ws) {
  FA_RETURN_IF_ERROR(bwd::run_prepass<T>(p, ws));
  // Hopper main kernel where it applies (same workspace and passes; see
  // src/cuda/sm90/bwd/tuning.h for what falls back); FLASHATTN_DISABLE_SM90=1
  // forces this file's sm80 kernel.
  fa_status s = FA_ERROR_UNSUPPORTED;
  if (sm90::can_run_backward(p)) s = sm90::run_backward(p, ws);
  if (s == FA_ERROR_UNSUPPORTED) s = run_main_for<T>(ws.accum_dim, p, ws);
  FA_RETURN_IF_ERROR(s);
  return bwd::run_postpass<T>(p, ws);
}

fa_status device_error(cudaError_t err, const char* what) {
  cudaGetLastError();
  return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

namespace bwd {

WorkspacePlan plan_workspace(const AttentionParams& p) {
  WorkspacePlan w;
  w.accum_dim = kernel_head_dim(p.head_dim);
  const size_t rows = static_cast<size_t>(p.heads_q) * static_cast<size_t>(p.total_q);
  w.row_d = align_up(rows * sizeof(float));
  w.dq_accum = align_up(rows * w.accum_dim * sizeof(float));
  if (p.deterministic) {
    const int bm = block_m(w.accum_dim);
    w.q_tiles = (p.seqlen_q + bm - 1) / bm;
    w.sem = align_up(static_cast<size_t>(p.batch) * p.heads_q * w.q_tiles * sizeof(int));
  }
  return w;
}

Workspace carve_workspace(const AttentionParams& p, const WorkspacePlan& w, void* base) {
  unsigned char* bytes = static_cast<unsigned char*>(base);
  Workspace ws;
  ws.row_d = reinterpret_cast<float*>(bytes);
  ws.dq_accum = reinterpret_cast<float*>(bytes + w.row_d);
  ws.dq_sem = p.deterministic ? reinterpret_cast<int*>(bytes + w.row_d + w.dq_accum) : nullptr;
  ws.q_tiles = w.q_tiles;
  ws.accum_dim = w.accum_dim;
  ws.scale_log2 = p.scale * kLog2e;
  ws.inv_softcap = p.softcap > 0.0f ? p.scale / p.softcap : 0.0f;
  return ws;
}

}  // namespace bwd

size_t backward_workspace_size(const AttentionParams& p) { return bwd::plan_workspace(p).total(); }

fa_status backward(const AttentionParams& params) {
  DeviceGuard guard(params.device_index);
  AttentionParams p = params;
  const bwd::WorkspacePlan w = bwd::plan_workspace(p);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  void* owned = nullptr;
  unsigned char* base = static_cast<unsigned char*>(p.workspace);
  if (base == nullptr && w.total() > 0) {
    cudaError_t err = cudaMallocAsync(&owned, w.total(), stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(FA_ERROR_OUT_OF_MEMORY, "could not allocate the backward workspace (" +
                                              std::to_string(w.total()) + " bytes): " +
                                              cudaGetErrorString(err));
    }
    base = static_cast<unsigned char*>(owned);
  }
  const bwd::Workspace ws = bwd::carve_workspace(p, w, base);

  fa_status status = FA_OK;
  if (p.deterministic && w.sem > 0) {
    cudaError_t err = cudaMemsetAsync(ws.dq_sem, 0, w.sem, stream);
    if (err != cudaSuccess) status = device_error(err, "cudaMemsetAsync of the dQ semaphores");
  }
  if (status == FA_OK) {
    status = p.dtype == FA_BF16 ? run_all<__nv_bfloat16>(p, ws) : run_all<__half>(p, ws);
  }
  if (owned != nullptr) {
    cudaError_t err = cudaFreeAsync(owned, stream);
    if (err != cudaSuccess && status == FA_OK) status = device_error(err, "cudaFreeAsync of the backward workspace");
  }
  return status;
}

}  // namespace flashattn::cuda
