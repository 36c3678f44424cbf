#include "device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>

#ifdef FLASHATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashattn::tools {
namespace {

#ifdef FLASHATTN_WITH_CUDA
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
#endif

#ifndef FLASHATTN_WITH_CUDA
[[noreturn]] void no_cuda() { throw std::runtime_error("this flashattn was built without CUDA"); }
#endif

}  // namespace

fa_device_type device_of(fa_backend backend) {
  return backend == FA_BACKEND_CUDA ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
}

Buffer::Buffer(fa_backend backend, size_t bytes) : backend_(backend), bytes_(bytes) {
  const size_t alloc = bytes == 0 ? 16 : bytes;
  if (backend == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    check(cudaMalloc(&data_, alloc), "cudaMalloc");
#else
    no_cuda();
#endif
  } else {
    data_ = std::aligned_alloc(64, (alloc + 63) / 64 * 64);
    if (data_ == nullptr) throw std::bad_alloc();
  }
}

Buffer::~Buffer() {
  if (backend_ == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    cudaFree(data_);
#endif
  } else {
    std::free(data_);
  }
}

// An empty buffer copies nothing (its host side may be a null pointer).
void Buffer::upload(const void* host) {
  if (bytes_ == 0) return;
  if (backend_ == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    check(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  } else {
    std::memcpy(data_, host, bytes_);
  }
}

void Buffer::download(void* host) const {
  if (bytes_ == 0) return;
  if (backend_ == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    check(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  } else {
    std::memcpy(host, data_, bytes_);
  }
}

void Buffer::fill_bytes(unsigned char value) {
  if (backend_ == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    check(cudaMemset(data_, value, bytes_), "cudaMemset");
#endif
  } else {
    std::memset(data_, value, bytes_);
  }
}

void synchronize(fa_backend backend) {
#ifdef FLASHATTN_WITH_CUDA
  if (backend == FA_BACKEND_CUDA) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)backend;
#endif
}

std::vector<double> time_calls(fa_backend backend, int warmup, int repeats,
                               const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  ms.reserve(repeats);
  if (backend == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int i = 0; i < repeats; ++i) {
      check(cudaEventRecord(start), "cudaEventRecord");
      fn();
      check(cudaEventRecord(stop), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0;
      check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
#else
    no_cuda();
#endif
  } else {
    for (int i = 0; i < repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  return ms;
}

std::string device_name(fa_backend backend) {
  if (backend == FA_BACKEND_CUDA) {
#ifdef FLASHATTN_WITH_CUDA
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) return prop.name;
#endif
    return "cuda";
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "cpu";
}

}  // namespace flashattn::tools
