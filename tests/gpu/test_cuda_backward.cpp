// The CUDA backward kernel against the fp64 reference, plus its deterministic
// mode and workspace handling. out and lse come from the CPU forward on the
// host (uploaded), so these tests exercise the backward alone.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "backward_check.h"
#include "device.h"

namespace flashattn::testing {
namespace {

// Device inputs of a backward call: the problem's q/k/v/dout plus out and lse
// from the CPU forward.
struct BackwardInputs {
  DeviceProblem dev;
  DeviceTensor out, lse;
  explicit BackwardInputs(const Problem& p, const HostTensor& out_h, const HostTensor& lse_h)
      : dev(p), out(DeviceTensor::upload(out_h)), lse(DeviceTensor::upload(lse_h)) {}
};

// One CUDA backward into poisoned device gradients; `own_workspace` passes a
// caller buffer of exactly fa_backward_workspace_size() bytes, else NULL.
::testing::AssertionResult cuda_backward(const Problem& p, const BackwardInputs& in,
                                         bool deterministic, bool own_workspace, Grads* g) {
  fa_options o = in.dev.options();
  o.deterministic = deterministic ? 1 : 0;
  DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q());
  DeviceTensor dk = DeviceTensor::upload(p.poisoned_like_k());
  DeviceTensor dv = DeviceTensor::upload(p.poisoned_like_k());
  size_t bytes = 0;
  if (fa_backward_workspace_size(&in.dev.q.desc, &in.dev.k.desc, &in.dev.v.desc, in.dev.varlen_ptr(),
                                 &o, &bytes) != FA_OK) {
    return ::testing::AssertionFailure() << "workspace size: " << fa_last_error();
  }
  DeviceMemory ws;
  if (own_workspace) {
    ws = device_alloc(bytes);
    // Garbage in the caller's workspace must not leak into the result.
    cudaMemset(ws.get(), 0xff, bytes);
  }
  const fa_status st =
      fa_backward(&in.dev.q.desc, &in.dev.k.desc, &in.dev.v.desc, &in.out.desc, &in.dev.dout.desc,
                  &in.lse.desc, &dq.desc, &dk.desc, &dv.desc, in.dev.varlen_ptr(), &o,
                  own_workspace ? ws.get() : nullptr, own_workspace ? bytes : 0);
  if (st != FA_OK) return ::testing::AssertionFailure() << "fa_backward: " << fa_last_error();
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return ::testing::AssertionFailure() << "sync: " << cudaGetErrorString(err);
  g->dq = dq.download(p.poisoned_like_q());
  g->dk = dk.download(p.poisoned_like_k());
  g->dv = dv.download(p.poisoned_like_k());
  return ::testing::AssertionSuccess();
}

std::vector<int> gpu_head_dims() { return {32, 40, 64, 72, 80, 96, 128, 160, 192, 224, 256}; }

class CudaBackward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBackward, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const Problem p = make_problem(GetParam());
  HostTensor out, lse;
  ASSERT_TRUE(cpu_forward(p, &out, &lse));
  BackwardInputs in(p, out, lse);
  Grads g;
  ASSERT_TRUE(cuda_backward(p, in, /*deterministic=*/false, /*own_workspace=*/true, &g));
  expect_matches_reference(p, g);
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaBackward,
                         ::testing::ValuesIn(attention_suite({FA_F16, FA_BF16}, gpu_head_dims(), false)),
                         [](const auto& info) { return info.param.name(); });

// Deterministic mode: correct, and bitwise identical over 20 runs; the same
// bytes whether the library or the caller provides the workspace.
class CudaBackwardDeterministic : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBackwardDeterministic, BitwiseIdenticalAcrossRuns) {
  FA_REQUIRE_GPU();
  const Problem p = make_problem(GetParam());
  HostTensor out, lse;
  ASSERT_TRUE(cpu_forward(p, &out, &lse));
  BackwardInputs in(p, out, lse);
  Grads first;
  ASSERT_TRUE(cuda_backward(p, in, true, true, &first));
  expect_matches_reference(p, first);
  const std::vector<uint8_t> want = first.bytes();
  for (int run = 1; run < 20; ++run) {
    Grads g;
    ASSERT_TRUE(cuda_backward(p, in, true, run % 2 == 0, &g));
    const std::vector<uint8_t> got = g.bytes();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << "run " << run;
  }
}

std::vector<Case> deterministic_cases() {
  std::vector<Case> cases;
  // GQA + causal, many key tiles each adding to every query tile's dQ.
  Case c = make_case(FA_BF16, 777, 1029, 64, 31);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = true;
  cases.push_back(c);
  c.causal = false;
  c.dtype = FA_F16;
  c.head_dim = 128;
  cases.push_back(c);
  // MQA with a sliding window, and more queries than keys (masked rows).
  Case w = make_case(FA_BF16, 600, 300, 256, 32);
  w.heads_q = 3;
  w.heads_kv = 1;
  w.window_left = 100;
  w.window_right = 20;
  cases.push_back(w);
  // Variable-length batch.
  Case v = make_case(FA_F16, 0, 0, 96, 33);
  v.varlen_q = {300, 1, 0, 129};
  v.varlen_k = {257, 500, 3, 64};
  v.causal = true;
  cases.push_back(v);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaBackwardDeterministic, ::testing::ValuesIn(deterministic_cases()),
                         [](const auto& info) { return info.param.name(); });

// The atomic (default) mode on a longer problem than the suite's: many key
// tiles race on each dQ row; the result must still match the reference.
TEST(CudaBackwardLarge, ManyKeyTiles) {
  FA_REQUIRE_GPU();
  for (int d : {64, 128}) {
    Case c = make_case(FA_BF16, 1023, 1023, d, 41 + d);
    c.causal = d == 128;
    const Problem p = make_problem(c);
    HostTensor out, lse;
    ASSERT_TRUE(cpu_forward(p, &out, &lse));
    BackwardInputs in(p, out, lse);
    Grads g;
    ASSERT_TRUE(cuda_backward(p, in, false, /*own_workspace=*/false, &g));
    SCOPED_TRACE(c.name());
    expect_matches_reference(p, g);
  }
}

// The single-buffered Q/dO path (what GPUs with less shared memory than an
// H100 run for D 64, 128, 192, 256) forced on this GPU: same results.
TEST(CudaBackwardSingleStage, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  ASSERT_EQ(setenv("FLASHATTN_BWD_SINGLE_STAGE", "1", 1), 0);
  for (int d : {64, 128, 256}) {
    Case c = make_case(d == 128 ? FA_F16 : FA_BF16, 203, 333, d, 61 + d);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = d != 64;
    const Problem p = make_problem(c);
    HostTensor out, lse;
    ASSERT_TRUE(cpu_forward(p, &out, &lse));
    BackwardInputs in(p, out, lse);
    for (bool det : {false, true}) {
      Grads g;
      ASSERT_TRUE(cuda_backward(p, in, det, true, &g));
      SCOPED_TRACE(c.name() + (det ? " deterministic" : ""));
      expect_matches_reference(p, g);
    }
  }
  unsetenv("FLASHATTN_BWD_SINGLE_STAGE");
}

// A workspace one byte short is refused; the exact size is accepted.
TEST(CudaBackwardWorkspace, ExactSizeIsEnoughAndOneByteShortIsRefused) {
  FA_REQUIRE_GPU();
  Case c = make_case(FA_F16, 100, 90, 80, 51);
  const Problem p = make_problem(c);
  HostTensor out, lse;
  ASSERT_TRUE(cpu_forward(p, &out, &lse));
  BackwardInputs in(p, out, lse);
  for (int det : {0, 1}) {
    fa_options o = in.dev.options();
    o.deterministic = det;
    size_t bytes = 0;
    ASSERT_EQ(fa_backward_workspace_size(&in.dev.q.desc, &in.dev.k.desc, &in.dev.v.desc, nullptr, &o, &bytes), FA_OK);
    EXPECT_GT(bytes, 0u);
    DeviceMemory ws = device_alloc(bytes);
    DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q());
    DeviceTensor dk = DeviceTensor::upload(p.poisoned_like_k());
    DeviceTensor dv = DeviceTensor::upload(p.poisoned_like_k());
    EXPECT_EQ(fa_backward(&in.dev.q.desc, &in.dev.k.desc, &in.dev.v.desc, &in.out.desc, &in.dev.dout.desc,
                          &in.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &o, ws.get(), bytes - 1),
              FA_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(fa_backward(&in.dev.q.desc, &in.dev.k.desc, &in.dev.v.desc, &in.out.desc, &in.dev.dout.desc,
                          &in.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &o, ws.get(), bytes),
              FA_OK)
        << fa_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

}  // namespace
}  // namespace flashattn::testing
