// Placeholder until the sm80 forward kernel lands (issue: CUDA forward kernel).
#include "core/backends.h"
#include "core/error.h"

namespace flashattn::cuda {
fa_status forward(const AttentionParams&) {
  return fail(FA_ERROR_UNSUPPORTED, "the CUDA forward kernel is not implemented yet");
}
}  // namespace flashattn::cuda
