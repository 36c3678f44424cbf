// Host-side facts a kernel launch picks its path by: the device's shared
// memory per CTA, and the test-only switches that force a fallback path so it
// is tested on any GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>

namespace flashattn::cuda {

// Shared memory one CTA may opt in to on the current device (0 if the query fails).
inline int current_device_smem_optin() {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return optin;
}

// True when environment variable `name` starts with '1' (FLASHATTN_BWD_SINGLE_STAGE,
// FLASHATTN_FWD_NO_PAIR_SPLIT: no tuning knobs, they force the path smaller GPUs take).
inline bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '1';
}

}  // namespace flashattn::cuda
