// The CUDA backend when the library is built without CUDA (-DFLASHATTN_CUDA=OFF).
#include "core/backends.h"
#include "core/error.h"

namespace flashattn::cuda {
namespace {
constexpr const char* kNotBuilt = "flashattn was built without CUDA (FLASHATTN_CUDA=OFF)";
fa_status not_built() { return fail(FA_ERROR_BACKEND_UNAVAILABLE, kNotBuilt); }
}  // namespace

bool available(const char** why) {
  *why = kNotBuilt;
  return false;
}
fa_status check_forward(const AttentionParams&) { return not_built(); }
fa_status check_backward(const AttentionParams&) { return not_built(); }
fa_status forward(const AttentionParams&) { return not_built(); }
fa_status backward(const AttentionParams&) { return not_built(); }
size_t backward_workspace_size(const AttentionParams&) { return 0; }
size_t forward_workspace_size(const AttentionParams&) { return 0; }
fa_status copy_to_host(void*, const void*, size_t, int, void*) { return not_built(); }
fa_status check_kvcache(const KvCacheParams&) { return not_built(); }
size_t kvcache_workspace_size(const KvCacheParams&) { return 0; }
fa_status forward_kvcache(const KvCacheParams&) { return not_built(); }
KvCacheRoute kvcache_route(const KvCacheParams&) { return KvCacheRoute::kDecode; }
int kvcache_ring_stages(const KvCacheParams&) { return 0; }
fa_status stream_is_capturing(void*, int, bool*) { return not_built(); }
}  // namespace flashattn::cuda
