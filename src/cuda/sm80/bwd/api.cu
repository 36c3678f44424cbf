// Placeholder until the sm80 backward kernel lands (issue: CUDA backward kernel).
#include "core/backends.h"
#include "core/error.h"

namespace flashattn::cuda {
fa_status backward(const AttentionParams&) {
  return fail(FA_ERROR_UNSUPPORTED, "the CUDA backward kernel is not implemented yet");
}
size_t backward_workspace_size(const AttentionParams&) { return 0; }
}  // namespace flashattn::cuda
