// The C ABI: validate, pick the backend, dispatch.
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

#include "core/abi_enum.h"
#include "core/backends.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/extras.h"
#include "core/validate.h"
#include "flashattn/flashattn.h"

using namespace flashattn;

namespace {

// C++ exceptions never cross the C ABI.
template <typename F>
fa_status guarded(F&& f) {
  try {
    clear_error();
    const fa_status status = f();
    // A backend may try a faster path, fail, and fall back: success leaves no message.
    if (status == FA_OK) clear_error();
    return status;
  } catch (const std::bad_alloc&) {
    return fail(FA_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(FA_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(FA_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

// Validates shapes and options, then asks the chosen backend for a size.
template <typename SizeFn>
fa_status workspace_query(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                          const fa_varlen* varlen, const fa_options* options, size_t* bytes,
                          SizeFn size) {
  return guarded([&]() -> fa_status {
    if (bytes == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "bytes is a null pointer");
    AttentionParams p;
    FA_RETURN_IF_ERROR(make_shape_params(q, k, v, varlen, options, &p));
    *bytes = size(p, resolve_backend(*options, *q) == FA_BACKEND_CUDA);
    return FA_OK;
  });
}

// The index arrays are checked on the host unless the caller vouches for them
// or the call is being captured into a CUDA graph (no copy back is allowed
// there; the kernels guard every index instead).
fa_status check_indices_unless_trusted(const KvCacheParams& kp, bool use_cuda) {
  if (kp.trust_indices) return FA_OK;
  if (use_cuda) {
    bool capturing = false;
    FA_RETURN_IF_ERROR(cuda::stream_is_capturing(kp.attn.stream, kp.attn.device_index, &capturing));
    if (capturing) return FA_OK;
  }
  return check_kvcache_indices(kp);
}

bool cpu_available(const char** why) {
  *why = "";
  return true;
}

}  // namespace

extern "C" {

fa_options fa_default_options(void) {
  fa_options o{};
  o.softmax_scale = 0.0f;
  o.causal = 0;
  o.window_left = -1;
  o.window_right = -1;
  o.softcap = 0.0f;
  o.deterministic = 0;
  o.backend = FA_BACKEND_AUTO;
  o.stream = nullptr;
  o.num_threads = 0;
  return o;
}

fa_extras fa_default_extras(void) { return fa_extras{}; }

const char* fa_last_error(void) { return last_error(); }

const char* fa_status_string(fa_status status) {
  switch (enum_code(status)) {
    case FA_OK: return "ok";
    case FA_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERROR_UNSUPPORTED: return "unsupported";
    case FA_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case FA_ERROR_DEVICE: return "device error";
    case FA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fa_dtype_name(fa_dtype dtype) {
  switch (enum_code(dtype)) {
    case FA_F32: return "f32";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    case FA_I32: return "i32";
  }
  return "unknown";
}

const char* fa_version(void) { return "0.1.0"; }
const char* fa_build_commit(void) { return flashattn::kBuildCommit; }
const char* fa_build_cuda_architectures(void) { return flashattn::kBuildCudaArchitectures; }

int fa_backend_available(fa_backend backend) {
  const char* why = "";
  switch (enum_code(backend)) {
    case FA_BACKEND_AUTO:
    case FA_BACKEND_CPU: return cpu_available(&why) ? 1 : 0;
    case FA_BACKEND_CUDA: return cuda::available(&why) ? 1 : 0;
  }
  return 0;
}

const char* fa_backend_unavailable_reason(fa_backend backend) {
  const char* why = "unknown backend";
  switch (enum_code(backend)) {
    case FA_BACKEND_AUTO:
    case FA_BACKEND_CPU: cpu_available(&why); break;
    case FA_BACKEND_CUDA: cuda::available(&why); break;
  }
  return why;
}

fa_status fa_forward(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v, fa_tensor* out,
                     fa_tensor* lse, const fa_varlen* varlen, const fa_options* options) {
  return fa_forward_ex(q, k, v, out, lse, varlen, options, nullptr);
}

fa_status fa_forward_ex(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v, fa_tensor* out,
                        fa_tensor* lse, const fa_varlen* varlen, const fa_options* options,
                        const fa_extras* extras) {
  return guarded([&]() -> fa_status {
    AttentionParams p;
    FA_RETURN_IF_ERROR(make_forward_params({q, k, v, out, lse, varlen, options}, &p));
    FA_RETURN_IF_ERROR(apply_extras(extras, *q, Pass::kForward, &p));
    if (resolve_backend(*options, *q) == FA_BACKEND_CUDA) {
      FA_RETURN_IF_ERROR(cuda::check_forward(p));
      return cuda::forward(p);
    }
    return cpu::forward(p);
  });
}

fa_status fa_dropout_mask(const fa_extras* extras, fa_tensor* mask) {
  return guarded([&]() -> fa_status { return dropout_mask(extras, mask); });
}

fa_status fa_forward_workspace_size(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                                    const fa_varlen* varlen, const fa_options* options,
                                    size_t* bytes) {
  return workspace_query(q, k, v, varlen, options, bytes, [](const AttentionParams& p, bool cuda) {
    return cuda ? cuda::forward_workspace_size(p) : cpu::forward_workspace_size(p);
  });
}

fa_status fa_backward_workspace_size(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                                     const fa_varlen* varlen, const fa_options* options,
                                     size_t* bytes) {
  return workspace_query(q, k, v, varlen, options, bytes, [](const AttentionParams& p, bool cuda) {
    return cuda ? cuda::backward_workspace_size(p) : cpu::backward_workspace_size(p);
  });
}

fa_status fa_backward(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                      const fa_tensor* out, const fa_tensor* dout, const fa_tensor* lse,
                      fa_tensor* dq, fa_tensor* dk, fa_tensor* dv, const fa_varlen* varlen,
                      const fa_options* options, void* workspace, size_t workspace_bytes) {
  return fa_backward_ex(q, k, v, out, dout, lse, dq, dk, dv, varlen, options, nullptr, workspace,
                        workspace_bytes);
}

fa_status fa_backward_ex(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                         const fa_tensor* out, const fa_tensor* dout, const fa_tensor* lse,
                         fa_tensor* dq, fa_tensor* dk, fa_tensor* dv, const fa_varlen* varlen,
                         const fa_options* options, const fa_extras* extras, void* workspace,
                         size_t workspace_bytes) {
  return guarded([&]() -> fa_status {
    AttentionParams p;
    FA_RETURN_IF_ERROR(
        make_backward_params({q, k, v, out, dout, lse, dq, dk, dv, varlen, options}, &p));
    FA_RETURN_IF_ERROR(check_workspace({q, k, v, out, dout, lse, dq, dk, dv, varlen, options},
                                       workspace, workspace_bytes));
    FA_RETURN_IF_ERROR(apply_extras(extras, *q, Pass::kBackward, &p));
    const bool use_cuda = resolve_backend(*options, *q) == FA_BACKEND_CUDA;
    const size_t needed = use_cuda ? cuda::backward_workspace_size(p) : cpu::backward_workspace_size(p);
    if (workspace != nullptr && workspace_bytes < needed) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "workspace has " + std::to_string(workspace_bytes) +
                                                 " bytes, the backward pass needs " +
                                                 std::to_string(needed));
    }
    p.workspace = workspace;
    p.workspace_bytes = workspace != nullptr ? workspace_bytes : 0;
    if (use_cuda) {
      FA_RETURN_IF_ERROR(cuda::check_backward(p));
      return cuda::backward(p);
    }
    return cpu::backward(p);
  });
}

fa_kvcache fa_default_kvcache(void) {
  fa_kvcache c{};
  return c;
}

fa_status fa_forward_kvcache_workspace_size(const fa_tensor* q, const fa_kvcache* cache,
                                            const fa_options* options, size_t* bytes) {
  return guarded([&]() -> fa_status {
    if (bytes == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "bytes is a null pointer");
    KvCacheParams kp;
    FA_RETURN_IF_ERROR(make_kvcache_params({q, cache, nullptr, nullptr, options}, &kp));
    const bool use_cuda = resolve_backend(*options, *q) == FA_BACKEND_CUDA;
    *bytes = use_cuda ? cuda::kvcache_workspace_size(kp) : cpu::kvcache_workspace_size(kp);
    return FA_OK;
  });
}

fa_status fa_forward_kvcache(const fa_tensor* q, const fa_kvcache* cache, fa_tensor* out,
                             fa_tensor* lse, const fa_options* options, void* workspace,
                             size_t workspace_bytes) {
  return fa_forward_kvcache_ex(q, cache, out, lse, options, nullptr, workspace, workspace_bytes);
}

fa_status fa_forward_kvcache_ex(const fa_tensor* q, const fa_kvcache* cache, fa_tensor* out,
                                fa_tensor* lse, const fa_options* options, const fa_extras* extras,
                                void* workspace, size_t workspace_bytes) {
  return guarded([&]() -> fa_status {
    if (out == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "out is a null pointer");
    KvCacheParams kp;
    FA_RETURN_IF_ERROR(make_kvcache_params({q, cache, out, lse, options}, &kp));
    FA_RETURN_IF_ERROR(apply_kvcache_extras(extras, *q, &kp.attn));
    const bool use_cuda = resolve_backend(*options, *q) == FA_BACKEND_CUDA;
    if (use_cuda) FA_RETURN_IF_ERROR(cuda::check_kvcache(kp));
    FA_RETURN_IF_ERROR(check_indices_unless_trusted(kp, use_cuda));
    const size_t needed = use_cuda ? cuda::kvcache_workspace_size(kp) : cpu::kvcache_workspace_size(kp);
    if (workspace != nullptr && workspace_bytes < needed) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "workspace has " + std::to_string(workspace_bytes) +
                                                 " bytes, the call needs " + std::to_string(needed));
    }
    kp.attn.workspace = workspace;
    kp.attn.workspace_bytes = workspace != nullptr ? workspace_bytes : 0;
    return use_cuda ? cuda::forward_kvcache(kp) : cpu::forward_kvcache(kp);
  });
}

}  // extern "C"
