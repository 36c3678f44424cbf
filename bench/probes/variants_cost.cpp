// What ALiBi and attention sinks cost: forward and forward + backward time of
// one shape with no extra, ALiBi, sinks and both, through the C ABI of the
// libflashattn.so named on the command line (loaded with dlopen, so an older
// build without fa_forward_ex times the plain runs only: the same probe
// compares builds). bf16, CUDA events, median of the repeats.
//
//   g++ -O2 -std=c++17 -Iinclude -I/usr/local/cuda/include bench/probes/variants_cost.cpp -L/usr/local/cuda/lib64 -lcudart -ldl -o variants_cost
//   ./variants_cost build/libflashattn.so [batch seqlen heads head_dim]
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "flashattn/flashattn.h"

namespace {

constexpr int kWarmup = 5;
constexpr int kRepeats = 30;

using ForwardFn = decltype(&fa_forward);
using ForwardExFn = decltype(&fa_forward_ex);
using BackwardFn = decltype(&fa_backward);
using BackwardExFn = decltype(&fa_backward_ex);
using OptionsFn = decltype(&fa_default_options);
using ErrorFn = decltype(&fa_last_error);

struct Lib {
  ForwardFn forward;
  ForwardExFn forward_ex;  // null in builds without extras
  BackwardFn backward;
  BackwardExFn backward_ex;
  OptionsFn options;
  ErrorFn error;
};

void check(fa_status s, const Lib& lib, const char* what) {
  if (s != FA_OK) {
    std::fprintf(stderr, "%s: %s\n", what, lib.error());
    std::exit(1);
  }
}

void* device_random(size_t elems, bool bf16, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint8_t> host(elems * (bf16 ? 2 : 4));
  for (size_t i = 0; i < elems; ++i) {
    const float x = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (bf16) {
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&host[2 * i], &b, 2);
    } else {
      std::memcpy(&host[4 * i], &x, 4);
    }
  }
  void* d = nullptr;
  cudaMalloc(&d, host.size());
  cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice);
  return d;
}

fa_tensor tensor(void* data, fa_dtype dtype, std::vector<int64_t> shape) {
  fa_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = FA_DEVICE_CUDA;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

template <typename F>
float median_ms(F&& call) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < kWarmup; ++i) call();
  std::vector<float> ms;
  for (int i = 0; i < kRepeats; ++i) {
    cudaEventRecord(a);
    call();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s libflashattn.so [batch seqlen heads head_dim]\n", argv[0]);
    return 2;
  }
  void* so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  const Lib lib{reinterpret_cast<ForwardFn>(dlsym(so, "fa_forward")),
                reinterpret_cast<ForwardExFn>(dlsym(so, "fa_forward_ex")),
                reinterpret_cast<BackwardFn>(dlsym(so, "fa_backward")),
                reinterpret_cast<BackwardExFn>(dlsym(so, "fa_backward_ex")),
                reinterpret_cast<OptionsFn>(dlsym(so, "fa_default_options")),
                reinterpret_cast<ErrorFn>(dlsym(so, "fa_last_error"))};
  const int b = argc > 5 ? std::atoi(argv[2]) : 4, s = argc > 5 ? std::atoi(argv[3]) : 4096;
  const int h = argc > 5 ? std::atoi(argv[4]) : 16, d = argc > 5 ? std::atoi(argv[5]) : 128;
  std::mt19937 rng(7);
  const size_t n = size_t(b) * s * h * d;
  void* q = device_random(n, true, rng, 1.0f);
  void* k = device_random(n, true, rng, 1.0f);
  void* v = device_random(n, true, rng, 1.0f);
  void* dout = device_random(n, true, rng, 1.0f);
  void* slopes = device_random(h, false, rng, 0.1f);
  void* sinks = device_random(h, false, rng, 1.0f);
  void *out, *lse, *dq, *dk, *dv, *dsinks;
  cudaMalloc(&out, n * 2);
  cudaMalloc(&lse, size_t(b) * h * s * 4);
  cudaMalloc(&dq, n * 2);
  cudaMalloc(&dk, n * 2);
  cudaMalloc(&dv, n * 2);
  cudaMalloc(&dsinks, h * 4);
  // ALiBi slopes must be finite; their sign does not matter to the cost.
  const fa_tensor tq = tensor(q, FA_BF16, {b, s, h, d}), tk = tensor(k, FA_BF16, {b, s, h, d});
  const fa_tensor tv = tensor(v, FA_BF16, {b, s, h, d}), tdo = tensor(dout, FA_BF16, {b, s, h, d});
  fa_tensor to = tensor(out, FA_BF16, {b, s, h, d}), tl = tensor(lse, FA_F32, {b, h, s});
  fa_tensor tdq = tensor(dq, FA_BF16, {b, s, h, d}), tdk = tensor(dk, FA_BF16, {b, s, h, d});
  fa_tensor tdv = tensor(dv, FA_BF16, {b, s, h, d});
  const fa_tensor tslopes = tensor(slopes, FA_F32, {h}), tsinks = tensor(sinks, FA_F32, {h});
  fa_tensor tdsinks = tensor(dsinks, FA_F32, {h});

  std::printf("%s: bf16 %dx%dx%dx%d, median of %d (ms)\n", argv[1], b, s, h, d, kRepeats);
  std::printf("%-8s %-7s %9s %9s\n", "mask", "extras", "fwd", "fwd+bwd");
  for (int causal = 0; causal < 2; ++causal) {
    fa_options o = lib.options();
    o.causal = causal;
    for (int extras = 0; extras < 4; ++extras) {
      if (extras > 0 && lib.forward_ex == nullptr) break;
      fa_extras x{};
      if (extras & 1) x.alibi_slopes = &tslopes;
      if (extras & 2) x.sinks = &tsinks;
      fa_extras bx = x;
      if (extras & 2) bx.dsinks = &tdsinks;
      auto fwd = [&] {
        check(extras ? lib.forward_ex(&tq, &tk, &tv, &to, &tl, nullptr, &o, &x)
                     : lib.forward(&tq, &tk, &tv, &to, &tl, nullptr, &o),
              lib, "forward");
      };
      auto both = [&] {
        fwd();
        check(extras ? lib.backward_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, nullptr, &o, &bx,
                                       nullptr, 0)
                     : lib.backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, nullptr, &o, nullptr, 0),
              lib, "backward");
      };
      const char* names[] = {"none", "alibi", "sinks", "both"};
      std::printf("%-8s %-7s %9.3f %9.3f\n", causal ? "causal" : "full", names[extras], median_ms(fwd),
                  median_ms(both));
    }
  }
  return 0;
}
