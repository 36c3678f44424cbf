// A ring rank's tensors as device copies on one GPU, for the GPU ring suites.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>

#include "device.h"
#include "test_ring_shards.h"

namespace flashattn::testing {

// put() uploads to `device` (made current), get() downloads into the host
// tensor; the legacy default stream orders the download after the rank's work.
class GpuMemory final : public RankMemory {
 public:
  explicit GpuMemory(int device) : device_(device) {}
  fa_tensor put(HostTensor& h) override {
    if (cudaSetDevice(device_) != cudaSuccess) throw Error(FA_ERROR_DEVICE, "cudaSetDevice failed");
    DeviceTensor& d = copies_[&h] = DeviceTensor::upload(h);
    d.desc.device_index = device_;
    return d.desc;
  }
  void get(HostTensor& h) override { h = copies_.at(&h).download(h); }

 private:
  int device_;
  std::map<const HostTensor*, DeviceTensor> copies_;
};

struct GpuRingCase {
  int world;
  bool causal;
  int head_dim;
};

inline std::string gpu_ring_name(const GpuRingCase& g) {
  return "P" + std::to_string(g.world) + (g.causal ? "_causal" : "_full") + "_d" +
         std::to_string(g.head_dim);
}

// bf16, GQA (4 query heads on 2), batch 2, 80P+3 tokens (uneven chunks).
inline Case gpu_ring_case(int world, bool causal, int head_dim) {
  Case c;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 2 * world * 40 + 3;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = head_dim;
  c.dtype = FA_BF16;
  c.causal = causal;
  c.seed = 5 + world;
  return c;
}

inline Options gpu_ring_options(bool causal) {
  Options o;
  o.causal = causal;
  o.backend = FA_BACKEND_CUDA;
  return o;
}

// The ring over `launch` (rank r's tensors on GPU device_of_rank(r)) against
// the fp64 reference and single-GPU attention on GPU 0.
inline void check_gpu_ring(const GpuRingCase& g, const Launcher& launch,
                           int (*device_of_rank)(int)) {
  const Problem p = make_problem(gpu_ring_case(g.world, g.causal, g.head_dim));
  const Options o = gpu_ring_options(g.causal);
  const RingResult ring = run_ring(
      p, g.world, o, [&](int r) { return std::make_unique<GpuMemory>(device_of_rank(r)); },
      launch);
  GpuMemory memory(0);
  const RingResult single = run_single(p, o, memory);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_ring_matches(p, ring, single);
}

}  // namespace flashattn::testing
