// Ring attention on one GPU: P simulated ranks (threads) whose blocks move by
// device copies, on the CUDA backend, forward and backward against the
// float64 reference and single-device attention. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "device.h"
#include "test_ring_shards.h"

namespace flashattn::testing {
namespace {

// A rank's tensors as device copies; get() downloads into the host tensor.
class GpuMemory final : public RankMemory {
 public:
  fa_tensor put(HostTensor& h) override {
    DeviceTensor& d = copies_[&h] = DeviceTensor::upload(h);
    return d.desc;
  }
  void get(HostTensor& h) override {
    // The legacy default stream orders this after every rank's work.
    h = copies_.at(&h).download(h);
  }

 private:
  std::map<const HostTensor*, DeviceTensor> copies_;
};

struct GpuRingCase {
  int world;
  bool causal;
  int head_dim;
};

class GpuRing : public ::testing::TestWithParam<GpuRingCase> {};

TEST_P(GpuRing, MatchesFloat64ReferenceAndSingleDevice) {
  FA_REQUIRE_GPU();
  const GpuRingCase g = GetParam();
  Case c;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 2 * g.world * 40 + 3;  // uneven chunks
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = g.head_dim;
  c.dtype = FA_BF16;
  c.causal = g.causal;
  c.seed = 5 + g.world;
  const Problem p = make_problem(c);
  Options o;
  o.causal = g.causal;
  o.backend = FA_BACKEND_CUDA;
  const auto device_copy = [](void* dst, const void* src, size_t bytes) {
    if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
      throw Error(FA_ERROR_DEVICE, "device copy between simulated ranks failed");
  };
  const RingResult ring = run_ring(p, g.world, o, [] { return std::make_unique<GpuMemory>(); },
                                   device_copy);
  GpuMemory memory;
  const RingResult single = run_single(p, o, memory);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_ring_matches(p, ring, single);
}

INSTANTIATE_TEST_SUITE_P(Suite, GpuRing,
                         ::testing::Values(GpuRingCase{1, true, 128}, GpuRingCase{2, false, 128},
                                           GpuRingCase{2, true, 128}, GpuRingCase{4, true, 64},
                                           GpuRingCase{4, false, 64}, GpuRingCase{3, true, 128}),
                         [](const auto& info) {
                           return "P" + std::to_string(info.param.world) +
                                  (info.param.causal ? "_causal" : "_full") + "_d" +
                                  std::to_string(info.param.head_dim);
                         });

}  // namespace
}  // namespace flashattn::testing
