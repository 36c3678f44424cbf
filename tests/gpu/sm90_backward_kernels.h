// Host entry points of test_sm90_backward_kernels.cu: a kernel that holds SMs
// while a test runs beside it.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace flashattn::testing {

// Holds `ctas` SMs, one CTA each (their shared memory leaves no room for a
// backward CTA beside them), each spinning on a flag in mapped host memory
// until release(): a kernel that another stream's work cannot displace.
class SmHog {
 public:
  SmHog() = default;
  SmHog(const SmHog&) = delete;
  SmHog& operator=(const SmHog&) = delete;
  ~SmHog();
  // Launches and returns once every CTA is running (false, with `error`, if
  // they did not all start within a few seconds).
  bool start(int ctas, std::string& error);
  // Lets the CTAs end and waits for the kernel.
  void release();

 private:
  volatile int* flags_ = nullptr;  // [0]: release; [1 + c]: CTA c runs
  int ctas_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace flashattn::testing
