// Ring attention across real GPUs: one thread per GPU, NcclTransport over
// communicators from ncclCommInitAll, P = 2, 4, 8 as the visible GPUs allow,
// forward and backward against the float64 reference and single-GPU
// attention. Skips with fewer than P GPUs, or in a build without NCCL.
// Run with NCCL_NVLS_ENABLE=0 (docs/ring.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "device.h"
#include "ring_device.h"
#include "test_ring_shards.h"

#if FLASHATTN_TEST_NCCL
#include "flashattn/ring_nccl.hpp"
#endif

namespace flashattn::testing {
namespace {

class NcclRing : public ::testing::TestWithParam<GpuRingCase> {};

#if FLASHATTN_TEST_NCCL
// Ranks r = 0 .. world-1 on GPUs 0 .. world-1, one communicator each.
Launcher nccl_ring() {
  return [](int world, const RankBody& body) {
    std::vector<ncclComm_t> comms(static_cast<size_t>(world));
    std::vector<int> devices(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) devices[r] = r;
    ASSERT_EQ(ncclCommInitAll(comms.data(), world, devices.data()), ncclSuccess);
    run_threads(world, [&](int r) {
      if (cudaSetDevice(r) != cudaSuccess) throw Error(FA_ERROR_DEVICE, "cudaSetDevice failed");
      ring::NcclTransport transport(comms[r]);
      body(r, transport);
      if (cudaDeviceSynchronize() != cudaSuccess) throw Error(FA_ERROR_DEVICE, "rank failed");
    }, [&] {
      for (ncclComm_t c : comms) ncclCommAbort(c);
    });
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  };
}
#endif

TEST_P(NcclRing, MatchesFloat64ReferenceAndSingleDevice) {
  FA_REQUIRE_GPU();
#if FLASHATTN_TEST_NCCL
  const GpuRingCase g = GetParam();
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < g.world) GTEST_SKIP() << g.world << " GPUs needed, " << devices << " visible";
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  check_gpu_ring(g, nccl_ring(), [](int r) { return r; });
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

INSTANTIATE_TEST_SUITE_P(Suite, NcclRing,
                         ::testing::Values(GpuRingCase{2, false, 128}, GpuRingCase{2, true, 128},
                                           GpuRingCase{4, true, 128}, GpuRingCase{4, false, 64},
                                           GpuRingCase{8, true, 128}, GpuRingCase{8, false, 128}),
                         [](const auto& info) { return gpu_ring_name(info.param); });

}  // namespace
}  // namespace flashattn::testing
