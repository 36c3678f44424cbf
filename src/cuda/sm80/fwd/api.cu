// flashattn::cuda::forward: picks the kernel head dim (the smallest of 32, 64,
// 96, 128, 192, 256 that holds p.head_dim; the extra columns are zero-filled
// on load and never stored) and the dtype, and launches on p.stream.
#include <string>

#include "core/backends.h"
#include "core/error.h"
#include "cuda/common/device_guard.h"
#include "cuda/sm80/fwd/launch.h"
#include "cuda/sm90/fwd/api.h"

namespace flashattn::cuda {
namespace {

template <typename T>
fa_status dispatch_head_dim(const AttentionParams& p) {
  const int d = p.head_dim;
  if (d <= 32) return sm80::launch_forward<32, T>(p);
  if (d <= 64) return sm80::launch_forward<64, T>(p);
  if (d <= 96) return sm80::launch_forward<96, T>(p);
  if (d <= 128) return sm80::launch_forward<128, T>(p);
  if (d <= 192) return sm80::launch_forward<192, T>(p);
  if (d <= 256) return sm80::launch_forward<256, T>(p);
  return fail(FA_ERROR_UNSUPPORTED, "head_dim " + std::to_string(d) + " > 256");
}

}  // namespace

fa_status forward(const AttentionParams& p) {
  DeviceGuard guard(p.device_index);
  // Hopper kernel first where it applies (FLASHATTN_DISABLE_SM90=1 forces sm80).
  if (sm90::can_run_forward(p))
    if (const fa_status s = sm90::run_forward(p); s != FA_ERROR_UNSUPPORTED) return s;
  switch (p.dtype) {
    case FA_F16: return dispatch_head_dim<__half>(p);
    case FA_BF16: return dispatch_head_dim<__nv_bfloat16>(p);
    default:
      return fail(FA_ERROR_UNSUPPORTED,
                  std::string("the CUDA forward takes f16 and bf16, not ") + fa_dtype_name(p.dtype));
  }
}

}  // namespace flashattn::cuda
