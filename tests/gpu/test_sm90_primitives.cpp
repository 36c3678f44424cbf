// The src/cuda/sm90 primitives, each against a simple host reference: TMA tensor
// maps + bulk tensor loads (swizzle, out-of-bounds fill) on an mbarrier, wgmma
// from shared memory (K-major descriptors) and from registers (MN-major B),
// stmatrix from the accumulator layout, and an mbarrier producer/consumer
// ring with named-barrier turn taking.
// Skipped unless the GPU is compute capability 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "device.h"
#include "sm90_primitives_kernels.h"

namespace flashattn::testing {
namespace {

TEST(Sm90Primitives, TmaLoadSwizzledWithOutOfBoundsFill) {
  FA_REQUIRE_SM90();
  std::string error;
  const long bad = sm90prim::tma_load_mismatches(error);
  ASSERT_GE(bad, 0) << error;
  EXPECT_EQ(bad, 0);
}

// fp32 accumulation of 128 (or 32) products of 16-bit inputs: a wrong
// descriptor or fragment layout gives O(1) relative errors, rounding ~1e-6.
TEST(Sm90Primitives, WgmmaSharedSharedKMajor) {
  FA_REQUIRE_SM90();
  for (bool bf16 : {true, false}) {
    std::string error;
    const double e = sm90prim::wgmma_ss_rel_error(bf16, error);
    ASSERT_GE(e, 0) << error;
    EXPECT_LT(e, 1e-5) << (bf16 ? "bf16" : "fp16");
  }
}

TEST(Sm90Primitives, WgmmaRegisterAMnMajorB) {
  FA_REQUIRE_SM90();
  for (bool bf16 : {true, false}) {
    std::string error;
    const double e = sm90prim::wgmma_rs_rel_error(bf16, error);
    ASSERT_GE(e, 0) << error;
    EXPECT_LT(e, 1e-5) << (bf16 ? "bf16" : "fp16");
  }
}

TEST(Sm90Primitives, WgmmaSharedSharedMnMajor) {
  FA_REQUIRE_SM90();
  for (bool bf16 : {true, false}) {
    std::string error;
    const double e = sm90prim::wgmma_sstt_rel_error(bf16, error);
    ASSERT_GE(e, 0) << error;
    EXPECT_LT(e, 1e-5) << (bf16 ? "bf16" : "fp16");
  }
}

TEST(Sm90Primitives, StmatrixFromAccumulatorLayout) {
  FA_REQUIRE_SM90();
  std::string error;
  const long bad = sm90prim::stmatrix_mismatches(error);
  ASSERT_GE(bad, 0) << error;
  EXPECT_EQ(bad, 0);
}

// NOTES: compute-sanitizer racecheck reports this kernel's ordinary loads of a
// stage against the bulk copy (UBLKCP) that filled it: racecheck does not model
// the mbarrier complete_tx -> try_wait ordering. The forward kernel reads its
// stages only through wgmma and is racecheck-clean.
TEST(Sm90Primitives, MbarrierRingAndNamedBarrierTurns) {
  FA_REQUIRE_SM90();
  std::string error;
  const long bad = sm90prim::pipeline_errors(error);
  ASSERT_GE(bad, 0) << error;
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace flashattn::testing
