// What each backend provides to the dispatcher. Params arrive validated.
#pragma once

#include <cstddef>

#include "core/params.h"

namespace flashattn {

namespace cpu {
fa_status forward(const AttentionParams& params);
fa_status backward(const AttentionParams& params);
size_t forward_workspace_size(const AttentionParams& params);
size_t backward_workspace_size(const AttentionParams& params);
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
// Copies device memory to the host (used to validate cu_seqlens).
fa_status copy_to_host(void* dst, const void* src, size_t bytes, int device_index);
}  // namespace cuda

}  // namespace flashattn
