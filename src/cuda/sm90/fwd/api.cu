// Dispatch of the Hopper forward: which params it takes, and the head-dim /
// dtype switch.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/head_dims.h"
#include "cuda/sm90/fwd/api.h"
#include "cuda/sm90/fwd/launch.h"
#include "cuda/sm90/fwd/tuning.h"

namespace flashattn::cuda::sm90 {
namespace {

bool is_sm90(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // sm_90a code runs on 9.0 only (not on later majors).
  return major == 9 && minor == 0;
}

}  // namespace

bool disabled_by_env() {
  const char* v = std::getenv("FLASHATTN_DISABLE_SM90");
  return v != nullptr && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

bool supports_forward(const AttentionParams& p) {
  if (p.dtype != FA_F16 && p.dtype != FA_BF16) return false;
  if (ForwardHeadDims::kernel_for(p.head_dim) == 0) return false;
  // Dropout (fwd/dropout.cuh) has no KV-cache-source instantiation (the
  // KV-cache call refuses dropout; seqused_k on its own goes to sm80).
  if (p.has_dropout() && p.seqused_k != nullptr) return false;
  // Block masks have no KV-cache-source instantiation either (the KV-cache
  // API refuses block masks); with dropout they run block_sparse_forward_kernel's
  // PhiloxDropout instantiation.
  if (p.has_block_mask() && p.seqused_k != nullptr) return false;
  if (p.batch <= 0 || p.heads_q <= 0 || p.heads_kv <= 0 || p.total_q <= 0 || p.total_k <= 0)
    return false;
  // TMA: global strides must be 16-byte multiples and the base 16-byte aligned
  // (check_forward enforces both for q/k/v/out); coordinates are int32.
  if (p.total_q >= (1ll << 31) || p.total_k >= (1ll << 31)) return false;
  return is_sm90(p.device_index);
}

bool can_run_forward(const AttentionParams& p) { return !disabled_by_env() && supports_forward(p); }

// A head dim runs on the smallest kernel that holds it (head_dims.h; see
// kernel.cuh for how the columns past it are zero-filled and never stored).
fa_status run_forward(const AttentionParams& p, const KvPages& pages) {
  const int kd = ForwardHeadDims::kernel_for(p.head_dim);
  const bool bf16 = p.dtype == FA_BF16;
  const fa_status s = ForwardHeadDims::dispatch(kd, [&](auto d) {
    return bf16 ? launch_forward<decltype(d)::value, __nv_bfloat16>(p, pages)
                : launch_forward<decltype(d)::value, __half>(p, pages);
  });
  if (s == FA_ERROR_UNSUPPORTED && kd == 0)
    return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: no kernel for head_dim " + std::to_string(p.head_dim));
  return s;
}

// A paged call runs the kBlockN instantiation of its head dim (launch.cuh's
// visit_instantiation): its key tile is what the page must fit.
bool pages_fit(int head_dim, int page_size) {
  bool fit = false;
  ForwardHeadDims::dispatch(ForwardHeadDims::kernel_for(head_dim), [&](auto d) {
    constexpr int n = ForwardTuning<decltype(d)::value>::kBlockN;
    const bool power_of_two = page_size > 0 && (page_size & (page_size - 1)) == 0;
    fit = power_of_two && page_size >= 8 && (n % page_size == 0 || page_size % n == 0);
    return FA_OK;
  });
  return fit;
}

size_t forward_workspace_size(const AttentionParams& p) {
  size_t bytes = 0;
  ForwardHeadDims::dispatch(ForwardHeadDims::kernel_for(p.head_dim), [&](auto d) {
    bytes = forward_workspace_bytes<decltype(d)::value>(p);
    return FA_OK;
  });
  return bytes;
}

}  // namespace flashattn::cuda::sm90
