// Host cost of the CUDA runtime calls a library call makes (the CUDA backend's
// checks and launches), so the host time of an eager decode step can be
// attributed: microseconds per call, median of 7 runs of 2000 calls, GPU idle.
//
//   nvcc -O2 -std=c++17 -o /tmp/cuda_api_costs bench/probes/cuda_api_costs.cu && /tmp/cuda_api_costs
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void empty_kernel(int* p) {
  if (p != nullptr && threadIdx.x == 1024) *p = 0;
}

template <class F>
double us_per_call(F f) {
  constexpr int kCalls = 2000, kRuns = 7;
  for (int i = 0; i < 200; ++i) f();
  cudaDeviceSynchronize();
  std::vector<double> runs;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    runs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
  }
  std::sort(runs.begin(), runs.end());
  return runs[kRuns / 2];
}

int main() {
  int* d = nullptr;
  cudaMalloc(&d, 1 << 20);
  cudaStream_t s;
  cudaStreamCreate(&s);
  int host = 0, value = 0, dev = 0;
  cudaPointerAttributes attr{};
  cudaFuncAttributes fattr{};
  cudaStreamCaptureStatus cap{};
  const struct {
    const char* name;
    double us;
  } rows[] = {
      {"cudaGetDevice", us_per_call([&] { cudaGetDevice(&dev); })},
      {"cudaGetDeviceCount", us_per_call([&] { cudaGetDeviceCount(&value); })},
      {"cudaDeviceGetAttribute", us_per_call([&] { cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0); })},
      {"cudaPointerGetAttributes (device)", us_per_call([&] { cudaPointerGetAttributes(&attr, d + 64); })},
      {"cudaStreamIsCapturing", us_per_call([&] { cudaStreamIsCapturing(s, &cap); })},
      {"cudaFuncGetAttributes", us_per_call([&] { cudaFuncGetAttributes(&fattr, empty_kernel); })},
      {"cudaFuncSetAttribute (max dynamic smem)",
       us_per_call([&] { cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024); })},
      {"kernel launch <<<1, 32, 0, s>>>", us_per_call([&] { empty_kernel<<<1, 32, 0, s>>>(d); })},
      {"cudaMallocAsync + cudaFreeAsync (64 KiB)", us_per_call([&] {
         void* w = nullptr;
         cudaMallocAsync(&w, 1 << 16, s);
         cudaFreeAsync(w, s);
       })},
      {"cudaMemcpyAsync D2H 4 B + cudaStreamSynchronize", us_per_call([&] {
         cudaMemcpyAsync(&host, d, sizeof(int), cudaMemcpyDeviceToHost, s);
         cudaStreamSynchronize(s);
       })},
      {"cudaMemcpy D2H 4 B (legacy stream)", us_per_call([&] { cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost); })},
  };
  char name[256];
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::snprintf(name, sizeof name, "%s", prop.name);
  std::printf("%s\n| runtime call | host us per call |\n|---|---|\n", name);
  for (const auto& r : rows) std::printf("| %s | %.2f |\n", r.name, r.us);
  std::printf("(last error: %s)\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
