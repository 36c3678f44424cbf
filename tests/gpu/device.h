// Device copies of a test Problem for the GPU suites: upload inputs, make
// poisoned device outputs, download results into HostTensors for comparison.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "common/harness.h"

namespace flashattn::testing {

#define FA_CUDA_CHECK(expr)                                                          \
  do {                                                                               \
    cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) FAIL() << #expr << ": " << cudaGetErrorString(e_);        \
  } while (0)

// Skips the test when no GPU is visible.
#define FA_REQUIRE_GPU()                                                              \
  do {                                                                                \
    if (!fa_backend_available(FA_BACKEND_CUDA))                                       \
      GTEST_SKIP() << "no GPU: " << fa_backend_unavailable_reason(FA_BACKEND_CUDA);   \
  } while (0)

// True on a compute capability 9.0 GPU (the Hopper kernels' target).
inline bool device_is_sm90() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

// Skips the test unless a compute capability 9.0 GPU is visible.
#define FA_REQUIRE_SM90()                                                       \
  do {                                                                          \
    FA_REQUIRE_GPU();                                                           \
    if (!device_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU";  \
  } while (0)

// A call's status and then the device's: the call was accepted and its kernels
// ran to completion without a device error.
inline ::testing::AssertionResult call_completed(fa_status s) {
  if (s != FA_OK) return ::testing::AssertionFailure() << fa_status_string(s) << ": " << fa_last_error();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "sync: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// FLASHATTN_SM90_TEST_SMALL=1: the sm90 suites keep only a few cases (for
// compute-sanitizer runs).
inline bool sanitizer_subset_only() {
  const char* v = std::getenv("FLASHATTN_SM90_TEST_SMALL");
  return v != nullptr && v[0] == '1';
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;

inline DeviceMemory device_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 16 : bytes) != cudaSuccess) return nullptr;
  return DeviceMemory(p);
}

// A host tensor's twin in device memory (same shape, strides and bytes).
struct DeviceTensor {
  DeviceMemory memory;
  fa_tensor desc{};
  size_t bytes = 0;

  static DeviceTensor upload(const HostTensor& h) {
    DeviceTensor d;
    d.bytes = h.bytes.size();
    d.memory = device_alloc(d.bytes);
    d.desc = h.desc;
    d.desc.device = FA_DEVICE_CUDA;
    d.desc.device_index = 0;
    d.desc.data = d.memory.get();
    if (d.bytes) cudaMemcpy(d.memory.get(), h.bytes.data(), d.bytes, cudaMemcpyHostToDevice);
    return d;
  }
  // Back into `like` (same layout), rebinding its descriptor to host memory.
  HostTensor download(const HostTensor& like) const {
    HostTensor h = like;
    if (bytes) cudaMemcpy(h.bytes.data(), memory.get(), bytes, cudaMemcpyDeviceToHost);
    h.rebind();
    return h;
  }
};

// Inputs of a Problem on the device, cu_seqlens included.
struct DeviceProblem {
  DeviceTensor q, k, v, dout;
  DeviceMemory cu_q, cu_k;
  fa_varlen varlen{};
  const Problem* host = nullptr;

  explicit DeviceProblem(const Problem& p)
      : q(DeviceTensor::upload(p.q)), k(DeviceTensor::upload(p.k)), v(DeviceTensor::upload(p.v)),
        dout(DeviceTensor::upload(p.dout)), host(&p) {
    varlen = p.varlen;
    if (p.c.is_varlen()) {
      const size_t bytes = p.cu_seqlens_q.size() * sizeof(int32_t);
      cu_q = device_alloc(bytes);
      cu_k = device_alloc(bytes);
      cudaMemcpy(cu_q.get(), p.cu_seqlens_q.data(), bytes, cudaMemcpyHostToDevice);
      cudaMemcpy(cu_k.get(), p.cu_seqlens_k.data(), bytes, cudaMemcpyHostToDevice);
      varlen.cu_seqlens_q = static_cast<const int32_t*>(cu_q.get());
      varlen.cu_seqlens_k = static_cast<const int32_t*>(cu_k.get());
    }
  }
  const fa_varlen* varlen_ptr() const { return host->c.is_varlen() ? &varlen : nullptr; }
  fa_options options() const {
    fa_options o = host->options;
    o.backend = FA_BACKEND_CUDA;
    return o;
  }
};

}  // namespace flashattn::testing
