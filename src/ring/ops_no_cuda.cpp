// cuda_ops() in a build without the CUDA backend.
#include "flashattn/flashattn.hpp"
#include "ring/ops.h"

namespace flashattn::ring {

const DeviceOps& cuda_ops() {
  throw Error(FA_ERROR_BACKEND_UNAVAILABLE,
              "ring attention: CUDA tensors given, but flashattn was built without CUDA");
}

}  // namespace flashattn::ring
