// The CUDA backend against the NaN/Inf semantics of flashattn.h (the cases of
// tests/common/nan_semantics.h): planted NaN/Inf reach exactly the results
// the fp64 reference says, masked keys never contribute, rows that see
// nothing give 0 / -inf. Runs on every kernel family the dispatcher picks for
// the case's head dim (sm80 everywhere, sm90 on Hopper; FLASHATTN_DISABLE_SM90=1
// for the sm80 path there), plus the kernel paths the shared cases do not
// reach: d 256, a padded head dim, several GQA groups, the deterministic
// backward, the score extras, dropout and block masks. Skips without a GPU.
#include <gtest/gtest.h>

#include <limits>

#include "backward_check.h"
#include "common/nan_semantics.h"
#include "device.h"
#include "variants_run.h"

namespace flashattn::testing {
namespace {

// The CPU backend's forward with the problem's extras (it follows the semantics).
::testing::AssertionResult cpu_forward_ex(const Problem& p, HostTensor* out, HostTensor* lse) {
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  *out = p.poisoned_like_q();
  *lse = p.poisoned_lse();
  const fa_extras x = p.extras();
  if (fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out->desc, &lse->desc, p.varlen_ptr(), &o, &x) != FA_OK)
    return ::testing::AssertionFailure() << "CPU forward: " << fa_last_error();
  return ::testing::AssertionSuccess();
}

class CudaNanSemantics : public ::testing::TestWithParam<NanCase> {};

TEST_P(CudaNanSemantics, Forward) {
  FA_REQUIRE_GPU();
  Problem p = make_nan_problem(GetParam());
  DeviceProblem d(p);
  DeviceExtras x(p);
  DeviceTensor out = DeviceTensor::upload(p.poisoned_like_q()), lse = DeviceTensor::upload(p.poisoned_lse());
  const fa_options o = d.options();
  const fa_extras fx = x.forward(p);
  ASSERT_TRUE(call_completed(
      fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &lse.desc, d.varlen_ptr(), &o, &fx)));
  expect_forward_semantics(p, out.download(p.q), lse.download(p.poisoned_lse()));
}

TEST_P(CudaNanSemantics, Backward) {
  FA_REQUIRE_GPU();
  Problem p = make_nan_problem(GetParam());
  HostTensor out_h, lse_h;
  ASSERT_TRUE(cpu_forward_ex(p, &out_h, &lse_h));
  DeviceProblem d(p);
  DeviceExtras x(p);
  DeviceTensor out = DeviceTensor::upload(out_h), lse = DeviceTensor::upload(lse_h);
  DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q()), dk = DeviceTensor::upload(p.poisoned_like_k()),
               dv = DeviceTensor::upload(p.poisoned_like_k());
  fa_options o = d.options();
  o.deterministic = GetParam().deterministic ? 1 : 0;
  const fa_extras bx = x.backward(p);
  ASSERT_TRUE(call_completed(fa_backward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &d.dout.desc, &lse.desc,
                                            &dq.desc, &dk.desc, &dv.desc, d.varlen_ptr(), &o, &bx, nullptr, 0)));
  expect_backward_semantics(p, dq.download(p.q), dk.download(p.k), dv.download(p.k));
}

std::vector<NanCase> gpu_cases() {
  std::vector<NanCase> cases;
  for (auto [dt, d] : {std::pair{FA_BF16, 64}, std::pair{FA_F16, 128}}) {
    for (NanCase nc : nan_semantics_cases(dt, d)) {
      nc.name += std::string("_") + fa_dtype_name(dt) + "_d" + std::to_string(d);
      cases.push_back(nc);
    }
  }
  for (const NanCase& nc : nan_semantics_path_cases()) cases.push_back(nc);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaNanSemantics, ::testing::ValuesIn(gpu_cases()),
                         [](const auto& info) { return info.param.name; });

// The masked-keys case and the same problem with finite values there.
struct PlantedAndClean {
  Problem planted, clean;
  PlantedAndClean() {
    const NanCase nc = nan_semantics_cases(FA_BF16, 64)[6];  // masked_keys_nan_inf
    planted = make_problem(nc.c);
    clean = make_problem(nc.c);
    plant(planted, nc.plants);
  }
};

void copy_to_device(const DeviceTensor& d, const HostTensor& h) {
  ASSERT_EQ(cudaMemcpy(d.desc.data, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
}

// A forward captured into a CUDA graph: each replay's epilogues fix what that
// replay's inputs need (masked NaN/Inf, then none, then again).
TEST(CudaNanSemanticsGraph, EveryReplayFollowsTheRules) {
  FA_REQUIRE_GPU();
  const PlantedAndClean pc;
  DeviceProblem d(pc.planted);
  DeviceTensor out = DeviceTensor::upload(pc.planted.poisoned_like_q());
  DeviceTensor lse = DeviceTensor::upload(pc.planted.poisoned_lse());
  cudaStream_t stream = nullptr;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fa_options o = d.options();
  o.stream = stream;
  cudaGraph_t graph = nullptr;
  FA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const fa_status s = fa_forward(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &lse.desc, nullptr, &o);
  FA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(s, FA_OK) << fa_last_error();
  cudaGraphExec_t exec = nullptr;
  FA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const Problem* p : {&pc.planted, &pc.clean, &pc.planted}) {
    SCOPED_TRACE(p == &pc.clean ? "clean inputs" : "planted inputs");
    copy_to_device(d.k, p->k);
    copy_to_device(d.v, p->v);
    copy_to_device(out, p->poisoned_like_q());
    FA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_forward_semantics(*p, out.download(p->q), lse.download(p->poisoned_lse()));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Two streams at once, one call with masked NaN/Inf and one without: the
// recompute of one call's rows never touches the other's.
TEST(CudaNanSemanticsStreams, ConcurrentCallsKeepTheirFlags) {
  FA_REQUIRE_GPU();
  const PlantedAndClean pc;
  DeviceProblem dp(pc.planted), dc(pc.clean);
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& st : streams) FA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  constexpr int kRounds = 8;
  for (int r = 0; r < kRounds; ++r) {
    DeviceTensor out[2] = {DeviceTensor::upload(pc.planted.poisoned_like_q()),
                           DeviceTensor::upload(pc.clean.poisoned_like_q())};
    DeviceTensor lse[2] = {DeviceTensor::upload(pc.planted.poisoned_lse()),
                           DeviceTensor::upload(pc.clean.poisoned_lse())};
    DeviceProblem* ds[2] = {&dp, &dc};
    for (int i = 0; i < 2; ++i) {
      fa_options o = ds[i]->options();
      o.stream = streams[(i + r) % 2];
      ASSERT_EQ(fa_forward(&ds[i]->q.desc, &ds[i]->k.desc, &ds[i]->v.desc, &out[i].desc, &lse[i].desc, nullptr, &o),
                FA_OK)
          << fa_last_error();
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    expect_forward_semantics(pc.planted, out[0].download(pc.planted.q), lse[0].download(pc.planted.poisoned_lse()));
    expect_forward_semantics(pc.clean, out[1].download(pc.clean.q), lse[1].download(pc.clean.poisoned_lse()));
  }
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
}

}  // namespace
}  // namespace flashattn::testing
