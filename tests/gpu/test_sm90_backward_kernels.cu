// The SM hog of sm90_backward_kernels.h.
#include <chrono>
#include <thread>

#include "sm90_backward_kernels.h"

namespace flashattn::testing {
namespace {

__global__ void hold_sm(volatile int* flags) {
  if (threadIdx.x != 0) return;
  flags[1 + blockIdx.x] = 1;
  __threadfence_system();
  while (flags[0] == 0) __nanosleep(1024);
}

}  // namespace

bool SmHog::start(int ctas, std::string& error) {
  void* host = nullptr;
  if (cudaHostAlloc(&host, sizeof(int) * (1 + ctas), cudaHostAllocMapped) != cudaSuccess) {
    error = "cudaHostAlloc";
    return false;
  }
  flags_ = static_cast<volatile int*>(host);
  for (int i = 0; i <= ctas; ++i) flags_[i] = 0;
  ctas_ = ctas;
  void* dev = nullptr;
  int smem = 0;
  if (cudaHostGetDevicePointer(&dev, host, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) != cudaSuccess ||
      cudaFuncSetAttribute(hold_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
    error = "hog setup";
    return false;
  }
  hold_sm<<<ctas, 32, smem, stream_>>>(static_cast<volatile int*>(dev));
  if (cudaGetLastError() != cudaSuccess) {
    error = "hog launch";
    return false;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    int running = 0;
    for (int c = 0; c < ctas; ++c) running += flags_[1 + c];
    if (running == ctas) return true;
    if (std::chrono::steady_clock::now() > until) {
      error = "the hog's CTAs did not all start";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void SmHog::release() {
  if (flags_ == nullptr) return;
  flags_[0] = 1;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
}

SmHog::~SmHog() {
  release();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (flags_ != nullptr) cudaFreeHost(const_cast<int*>(flags_));
}

}  // namespace flashattn::testing
