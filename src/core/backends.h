// What each backend provides to the dispatcher. Params arrive validated.
#pragma once

#include <cstddef>

#include "core/kvcache.h"
#include "core/params.h"

namespace flashattn {

namespace cpu {
fa_status forward(const AttentionParams& params);
fa_status backward(const AttentionParams& params);
size_t forward_workspace_size(const AttentionParams& params);
size_t backward_workspace_size(const AttentionParams& params);
// Attention against a KV cache (appends first). Index arrays arrive checked.
fa_status forward_kvcache(const KvCacheParams& params);
size_t kvcache_workspace_size(const KvCacheParams& params);
}  // namespace cpu

namespace cuda {
// False (with the reason) when CUDA is not built in or no device is visible.
bool available(const char** why);
// Backend-specific checks (dtype, head dim, pointers on the device, alignment).
fa_status check_forward(const AttentionParams& params);
fa_status check_backward(const AttentionParams& params);
fa_status forward(const AttentionParams& params);
fa_status backward(const AttentionParams& params);
size_t backward_workspace_size(const AttentionParams& params);
// Bytes the forward allocates from the stream-ordered pool for these params.
size_t forward_workspace_size(const AttentionParams& params);
// Attention against a KV cache: GPU-specific checks, workspace (bytes on the
// device: rotated q, split partials) and the call. With no workspace given the
// call takes it from the stream-ordered pool.
fa_status check_kvcache(const KvCacheParams& params);
size_t kvcache_workspace_size(const KvCacheParams& params);
fa_status forward_kvcache(const KvCacheParams& params);
// Which kernels forward_kvcache runs for these params (tests assert it).
enum class KvCacheRoute { kDecode, kHopperForward };
KvCacheRoute kvcache_route(const KvCacheParams& params);
// K/V ring stages of the decode kernel those params run on this device (0 on
// the Hopper route): kRingBytes' ring or the smaller GPUs' (tests assert it).
int kvcache_ring_stages(const KvCacheParams& params);
// Whether `stream` is capturing a CUDA graph (nothing may synchronize then).
fa_status stream_is_capturing(void* stream, int device_index, bool* capturing);
// Copies device memory to the host in the order of `stream` (the call's stream, after the
// work queued on it, e.g. what wrote cu_seqlens), then waits for that stream alone (used to
// validate cu_seqlens and the KV cache's index arrays).
fa_status copy_to_host(void* dst, const void* src, size_t bytes, int device_index, void* stream);
}  // namespace cuda

}  // namespace flashattn
