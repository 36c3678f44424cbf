// Dropout in the Hopper (sm_90a) forward and backward against the fp64
// reference, which applies the library's keep bits itself
// (attention/dropout.h's keep(), not the kernels' fragment paths). The
// kernels are called directly (sm90::run_forward; the sm80 pre-pass,
// sm90::run_backward and the post-pass; on params built by the library's own
// validation and extras), so a pass cannot come from the sm80 kernels; the
// public entries must give the same bits (they dispatched here: the forward's
// out and lse, the backward's dK and dV). The backward takes the Hopper
// forward's out and lse: the mask must be the same in both. Skipped unless the
// GPU is compute capability 9.0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "attention/work_plan.h"
#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "core/extras.h"
#include "core/validate.h"
#include "cuda/dispatch.h"
#include "cuda/sm90/bwd/api.h"
#include "cuda/sm90/fwd/api.h"
#include "backward_check.h"
#include "device.h"
#include "forward_check.h"
#include "variants_run.h"

namespace flashattn::testing {
namespace {

// The Hopper forward of p called directly, with its extras (dropout, ALiBi,
// sinks) applied as fa_forward_ex applies them; max_ctas > 0 caps the
// persistent grid (the split tail).
::testing::AssertionResult run_sm90(const Problem& p, VariantRun& r, int max_ctas = 0) {
  DeviceProblem d(p);
  DeviceExtras x(p);
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  DeviceTensor dout = DeviceTensor::upload(out), dlse = DeviceTensor::upload(lse);
  const fa_options o = d.options();
  const fa_extras fx = x.forward(p);
  AttentionParams params;
  const ForwardArgs args{&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc, &dlse.desc, d.varlen_ptr(), &o};
  if (make_forward_params(args, &params) != FA_OK || apply_extras(&fx, d.q.desc, Pass::kForward, &params) != FA_OK)
    return ::testing::AssertionFailure() << "params: " << fa_last_error();
  if (params.has_dropout() != (p.c.dropout_p > 0.0f))
    return ::testing::AssertionFailure() << "the params' dropout is not the case's";
  if (!cuda::sm90::supports_forward(params)) return ::testing::AssertionFailure() << "sm90::supports_forward said no";
  params.max_ctas = max_ctas;
  if (auto done = call_completed(cuda::sm90::run_forward(params)); !done) return done;
  r.out = dout.download(out);
  r.lse = dlse.download(lse);
  return ::testing::AssertionSuccess();
}

// The Hopper backward of p called directly (the dispatcher's workspace plan,
// the sm80 pre- and post-pass around sm90::run_backward), on the Hopper
// forward's out and lse.
::testing::AssertionResult run_sm90_backward(const Problem& p, bool deterministic, Grads* g) {
  VariantRun f;
  if (auto r = run_sm90(p, f); !r) return r;
  DeviceProblem d(p);
  DeviceExtras x(p);
  DeviceTensor out = DeviceTensor::upload(f.out), lse = DeviceTensor::upload(f.lse);
  DeviceTensor dq = DeviceTensor::upload(p.poisoned_like_q());
  DeviceTensor dk = DeviceTensor::upload(p.poisoned_like_k());
  DeviceTensor dv = DeviceTensor::upload(p.poisoned_like_k());
  fa_options o = d.options();
  o.deterministic = deterministic ? 1 : 0;
  const fa_extras bx = x.backward(p);
  AttentionParams params;
  const BackwardArgs args{&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &d.dout.desc, &lse.desc,
                          &dq.desc,  &dk.desc,  &dv.desc, d.varlen_ptr(), &o};
  if (make_backward_params(args, &params) != FA_OK || apply_extras(&bx, d.q.desc, Pass::kBackward, &params) != FA_OK)
    return ::testing::AssertionFailure() << "params: " << fa_last_error();
  if (!cuda::sm90::supports_backward(params)) return ::testing::AssertionFailure() << "sm90::supports_backward said no";
  const cuda::bwd::WorkspacePlan plan = cuda::plan_backward_workspace(params);
  DeviceMemory ws_mem = device_alloc(plan.total());
  cudaMemset(ws_mem.get(), 0xff, plan.row_d + plan.dq_accum);
  const cuda::bwd::Workspace ws = cuda::bwd::carve_workspace(params, plan, ws_mem.get());
  if (deterministic) cudaMemset(ws.dq_sem, 0, plan.sem);
  const bool bf16 = params.dtype == FA_BF16;
  fa_status s = bf16 ? cuda::bwd::run_prepass<__nv_bfloat16>(params, ws) : cuda::bwd::run_prepass<__half>(params, ws);
  if (s == FA_OK) s = cuda::sm90::run_backward(params, ws);
  if (s == FA_OK)
    s = bf16 ? cuda::bwd::run_postpass<__nv_bfloat16>(params, ws) : cuda::bwd::run_postpass<__half>(params, ws);
  if (auto done = call_completed(s); !done) return done;
  g->dq = dq.download(p.poisoned_like_q());
  g->dk = dk.download(p.poisoned_like_k());
  g->dv = dv.download(p.poisoned_like_k());
  return ::testing::AssertionSuccess();
}

class Sm90Dropout : public ::testing::TestWithParam<Case> {};

// Against the reference with the same mask; twice bitwise the same; the
// public entry gives the same bits (the dispatcher sent dropout here).
TEST_P(Sm90Dropout, MatchesFloat64ReferenceStableAndDispatched) {
  FA_REQUIRE_SM90();
  const Problem p = make_problem(GetParam());
  VariantRun a, b, api;
  ASSERT_TRUE(run_sm90(p, a));
  expect_forward_matches_reference(p, ForwardRun{a.out, a.lse});
  ASSERT_TRUE(run_sm90(p, b));
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.lse.bytes, b.lse.bytes);
  if (!cuda::sm90::disabled_by_env()) {
    ASSERT_TRUE(run_cuda(p, false, api));
    EXPECT_EQ(a.out.bytes, api.out.bytes);
    EXPECT_EQ(a.lse.bytes, api.lse.bytes);
  }
}

// The backward against the reference with the same mask; the public entry
// (the Hopper forward, then the dispatcher's backward) gives the same dK and
// dV bits (dQ's adds are unordered outside the deterministic mode).
TEST_P(Sm90Dropout, BackwardMatchesFloat64ReferenceAndIsDispatched) {
  FA_REQUIRE_SM90();
  const Case& c = GetParam();
  const Problem p = make_problem(c);
  if (c.softcap > 0.0f && c.alibi != Case::Alibi::kOff) {
    // Softcap with ALiBi and dropout: the Hopper backward refuses it and the
    // dispatcher runs the sm_80 backward (docs/variants.md); that public path
    // must match the reference.
    Grads refused;
    EXPECT_FALSE(run_sm90_backward(p, false, &refused));
    VariantRun api;
    ASSERT_TRUE(run_cuda(p, true, api));
    expect_backward_matches(p, api.dq, api.dk, api.dv, api.dsinks);
    return;
  }
  Grads g;
  ASSERT_TRUE(run_sm90_backward(p, false, &g));
  expect_matches_reference(p, g);
  if (!cuda::sm90::disabled_by_env()) {
    VariantRun api;
    ASSERT_TRUE(run_cuda(p, true, api));
    expect_backward_matches(p, api.dq, api.dk, api.dv, api.dsinks);
    EXPECT_EQ(g.dk.bytes, api.dk.bytes);
    EXPECT_EQ(g.dv.bytes, api.dv.bytes);
  }
}

// dropout_suite at d 64 (p 0.17 and 0.5: sizes 1, 7, 113, 203 with
// seqlen_q != seqlen_k, causal, window + softcap, ALiBi + sinks + GQA,
// varlen) and every head dim at p 0.3 (the padded ones run on the next
// kernel: 40 -> 64, 96 -> 128, 160 -> 192); p 0.1 with offsets past 2^32,
// a window, MQA; the d 128 long-key kernel (176-key tiles, which start on
// half a 32-key block every other tile) with causal and with ALiBi.
// Under compute-sanitizer (sanitizer_subset_only): one case per backward
// kernel's head dim, causal with GQA.
std::vector<Case> sm90_dropout_cases() {
  uint64_t seed = 5300;
  if (sanitizer_subset_only()) {
    std::vector<Case> small;
    for (const int d : {64, 128, 256}) {
      Case c = make_case(FA_BF16, 150, 200, d, seed++);
      c.causal = true;
      c.heads_q = 4;
      c.dropout_p = 0.5f;
      small.push_back(c);
    }
    return small;
  }
  std::vector<Case> cases = dropout_suite({FA_F16, FA_BF16}, {40, 64, 96, 128, 160, 192, 256});
  for (fa_dtype dt : {FA_F16, FA_BF16}) {
    for (const int d : {64, 128, 256}) {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.heads_q = 4;
      c.heads_kv = 1;
      c.window_left = 50;
      c.window_right = 7;
      c.dropout_p = 0.1f;
      c.dropout_offset = (uint64_t{0xffffffff} << 32) | 0xfffffff0u;
      cases.push_back(c);
    }
    Case l = make_case(dt, 77, 8300, 128, seed++);  // row 38 sees >= 8192 keys, causal too
    l.dropout_p = 0.1f;
    l.dropout_offset = (uint64_t{7} << 32) + 3;
    l.causal = dt == FA_F16;
    l.alibi = dt == FA_BF16 ? Case::Alibi::kPerHead : Case::Alibi::kOff;
    cases.push_back(l);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Suite, Sm90Dropout, ::testing::ValuesIn(sm90_dropout_cases()),
                         [](const auto& info) { return info.param.name(); });

// The deterministic backward with dropout is bitwise the same run to run (the
// mask is a function of the coordinates), at every backward kernel's head dim,
// with fixed lengths and a ragged varlen batch (a sequence of one query row,
// an empty one; every row sees at least 7 keys: dropout_suite's NOTES).
TEST(Sm90DropoutDeterminism, BackwardIsBitwiseStable) {
  FA_REQUIRE_SM90();
  for (const int d : {64, 128, 256}) {
    Case v = make_case(d == 128 ? FA_F16 : FA_BF16, 0, 0, d, 5700 + static_cast<uint64_t>(d));
    v.varlen_q = {300, 1, 0, 257};
    v.varlen_k = {333, 40, 7, 130};
    v.heads_q = 4;
    v.heads_kv = 2;
    v.dropout_p = 0.1f;
    for (const Case& c : {dropout_determinism_case(d, 5600 + static_cast<uint64_t>(d)), v}) {
      SCOPED_TRACE(c.name());
      const Problem p = make_problem(c);
      Grads a, b;
      ASSERT_TRUE(run_sm90_backward(p, true, &a));
      ASSERT_TRUE(run_sm90_backward(p, true, &b));
      EXPECT_EQ(a.bytes(), b.bytes());
      expect_matches_reference(p, a);
    }
  }
}

// The Hopper forward and backward of p (a block mask) called directly against
// the reference; the deterministic backward twice bitwise equal and right.
void expect_sm90_block_mask_matches(const Problem& p) {
  VariantRun f;
  ASSERT_TRUE(run_sm90(p, f));
  expect_forward_matches_reference(p, ForwardRun{f.out, f.lse});
  Grads a, b;
  ASSERT_TRUE(run_sm90_backward(p, false, &a));
  expect_matches_reference(p, a);
  ASSERT_TRUE(run_sm90_backward(p, true, &a));
  ASSERT_TRUE(run_sm90_backward(p, true, &b));
  EXPECT_EQ(a.bytes(), b.bytes());
  expect_matches_reference(p, a);
}

// A block mask on the Hopper kernels (block_sparse_forward_kernel /
// block_sparse_backward_kernel, plain and PhiloxDropout instantiations),
// called directly, against the reference with the same keep bits and the
// same lists: 128 x 128 blocks (whole on every tile; GQA with per-head lists
// at d 128), 64 x 96 and 16 x 32 (tiles listed in part: the backward's
// per-pair test, zero_unlisted), forward and backward, the deterministic
// backward twice bitwise the same. Without dropout also causal (the element
// mask and the per-pair test on one tile); with it no causal mask or window:
// a row could then see a single key, which dropout's tolerance has no room for.
TEST(Sm90DropoutBlockMask, MatchesFloat64Reference) {
  FA_REQUIRE_SM90();
  uint64_t seed = 5800;
  for (const int d : {64, 128, 192, 256}) {
    for (const auto [bq, bk] : std::vector<std::pair<int, int>>{{128, 128}, {64, 96}, {16, 32}}) {
      for (const float dropout : {0.17f, 0.0f}) {
        Case c = make_case(d == 192 ? FA_F16 : FA_BF16, 384, 512, d, seed++);
        c.block_q = bq;
        c.block_k = bk;
        c.block_density = 0.5;
        c.dropout_p = dropout;
        c.dropout_offset = (uint64_t{3} << 32) + 5;
        c.causal = dropout == 0.0f && bq != 128;
        if (d == 128) {
          c.heads_q = 4;
          c.heads_kv = 2;
        }
        SCOPED_TRACE(c.name());
        expect_sm90_block_mask_matches(make_problem(c));
      }
    }
  }
}

// A block mask on a varlen batch (sequences of 0 to 300 query rows and 64 to
// 400 keys) on the Hopper kernels called directly:
// the backward's steps are built over the maximum lengths and cut to each
// sequence's range by the kernel (ListedQueryWalk::narrow); blocks whole on
// the tiles (128 x 128) and cut (64 x 96, 16 x 32), causal and not, GQA,
// with and without dropout, the deterministic backward twice bitwise equal.
TEST(Sm90BlockMaskVarlen, MatchesFloat64Reference) {
  FA_REQUIRE_SM90();
  uint64_t seed = 5900;
  for (const int d : {64, 128, 256}) {
    for (const auto [bq, bk] : std::vector<std::pair<int, int>>{{128, 128}, {64, 96}, {16, 32}}) {
      for (const bool causal : {false, true}) {
        Case c = make_case(FA_BF16, 0, 0, d, seed++);
        c.varlen_q = {300, 0, 129, 77};
        c.varlen_k = {288, 64, 96, 400};  // every listed block of a row holds >= 16 keys
        c.heads_q = 4;
        c.heads_kv = 2;
        c.block_q = bq;
        c.block_k = bk;
        c.block_density = 0.5;
        c.causal = causal;
        // Dropout without causal: a row must not see a single key (dropout_suite).
        c.dropout_p = causal ? 0.0f : 0.17f;
        SCOPED_TRACE(c.name());
        expect_sm90_block_mask_matches(make_problem(c));
      }
    }
  }
}

// The split tail (few CTAs: whole rounds, then the last round's tiles cut
// along the keys and merged) with dropout, on the d 128 long-key and the d 256
// kernels.
TEST(Sm90DropoutSplitTail, MatchesFloat64Reference) {
  FA_REQUIRE_SM90();
  struct Shape {
    int d, heads, max_ctas, block_n;
  };
  uint64_t seed = 5400;
  for (const Shape s : {Shape{128, 7, 3, 176}, Shape{256, 3, 4, 80}}) {
    Case c = make_case(FA_BF16, s.d == 128 ? 64 : 300, 8300, s.d, seed++);
    c.heads_q = c.heads_kv = s.heads;
    c.dropout_p = 0.5f;
    c.dropout_offset = (uint64_t{1} << 32) + 9;
    SCOPED_TRACE(c.name());
    const int tiles = c.heads_q * ((c.seqlen_q + 127) / 128);
    ASSERT_GT(plan_split_tail(tiles, s.max_ctas, (c.seqlen_k + s.block_n - 1) / s.block_n, true).tiles, 0);
    const Problem p = make_problem(c);
    VariantRun r;
    ASSERT_TRUE(run_sm90(p, r, s.max_ctas));
    expect_forward_matches_reference(p, ForwardRun{r.out, r.lse});
  }
}

// The mask the Hopper forward applies, read off its output
// (expect_output_shows_the_dropout_mask, variants_run.h), at p 0.1, 0.5, 0.9:
// every key-tile width (128, 112 and 80: tiles starting on half a 32-key
// block), GQA, two sequences, offsets past 2^32.
TEST(Sm90DropoutMask, KernelMaskIsTheVisibleMaskWithinBinomialBounds) {
  FA_REQUIRE_SM90();
  uint64_t seed = 5500;
  for (const int d : {64, 128, 192, 256})
    for (const float drop : {0.1f, 0.5f, 0.9f}) {
      const Case c = dropout_mask_case(d == 192 ? FA_F16 : FA_BF16, d, drop, seed++);
      SCOPED_TRACE(c.name());
      Problem p = make_problem(c);
      unit_vector_values(p);
      VariantRun r;
      ASSERT_TRUE(run_sm90(p, r));
      expect_output_shows_the_dropout_mask(p, r.out);
    }
}

}  // namespace
}  // namespace flashattn::testing
