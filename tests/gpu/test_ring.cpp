// Ring attention on one GPU: P simulated ranks (threads) whose blocks move by
// device copies, on the CUDA backend, forward and backward against the
// float64 reference and single-device attention. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "device.h"
#include "ring_device.h"
#include "test_ring_shards.h"

namespace flashattn::testing {
namespace {

class GpuRing : public ::testing::TestWithParam<GpuRingCase> {};

TEST_P(GpuRing, MatchesFloat64ReferenceAndSingleDevice) {
  FA_REQUIRE_GPU();
  const GpuRingCase g = GetParam();
  const auto device_copy = [](void* dst, const void* src, size_t bytes) {
    if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
      throw Error(FA_ERROR_DEVICE, "device copy between simulated ranks failed");
  };
  check_gpu_ring(g, simulated_ring(device_copy), [](int) { return 0; });
}

INSTANTIATE_TEST_SUITE_P(Suite, GpuRing,
                         ::testing::Values(GpuRingCase{1, true, 128}, GpuRingCase{2, false, 128},
                                           GpuRingCase{2, true, 128}, GpuRingCase{4, true, 64},
                                           GpuRingCase{4, false, 64}, GpuRingCase{3, true, 128}),
                         [](const auto& info) { return gpu_ring_name(info.param); });

}  // namespace
}  // namespace flashattn::testing
