// The Hopper (sm_90a) forward kernel against the fp64 reference. The kernel is
// called directly (sm90::run_forward on params built by the library's own
// validation), so a pass cannot come from the sm80 fallback; skipped unless the
// GPU is compute capability 9.0. Every head dim that is a multiple of 8 up to
// 256 runs here (the ones between the kernels' dims on the next larger one).
// Also: run-to-run bitwise stability, and the
// public fa_forward choosing this kernel (same bits) unless
// FLASHATTN_DISABLE_SM90 is set.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "core/validate.h"
#include "cuda/sm90/fwd/api.h"
#include "attention/work_plan.h"
#include "cuda/sm90/fwd/tuning.h"
#include "device.h"
#include "forward_check.h"

namespace flashattn::testing {
namespace {

enum class Path { kSm90Direct, kPublicApi };

// The direct call captured on a fresh stream into a CUDA graph, which is then
// launched twice (inference engines replay their forward passes as graphs).
fa_status run_captured(AttentionParams params) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return FA_ERROR_DEVICE;
  params.stream = stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  fa_status s = FA_ERROR_DEVICE;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    s = cuda::sm90::run_forward(params);
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess && s == FA_OK) s = FA_ERROR_DEVICE;
  }
  if (s == FA_OK && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) s = FA_ERROR_DEVICE;
  for (int i = 0; i < 2 && s == FA_OK; ++i) {
    if (cudaGraphLaunch(exec, stream) != cudaSuccess) s = FA_ERROR_DEVICE;
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess && s == FA_OK) s = FA_ERROR_DEVICE;
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return s;
}

// max_ctas > 0: at most that many persistent CTAs (the split-tail cases);
// captured: through run_captured.
::testing::AssertionResult run_forward(const Problem& p, bool with_lse, Path path, ForwardRun& r,
                                       int max_ctas = 0, bool captured = false) {
  DeviceProblem d(p);
  HostTensor out = p.poisoned_like_q();
  HostTensor lse = p.poisoned_lse();
  DeviceTensor dout = DeviceTensor::upload(out);
  DeviceTensor dlse = DeviceTensor::upload(lse);
  const fa_options o = d.options();
  fa_status s;
  if (path == Path::kSm90Direct) {
    AttentionParams params;
    const ForwardArgs args{&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc,
                           with_lse ? &dlse.desc : nullptr, d.varlen_ptr(), &o};
    s = make_forward_params(args, &params);
    if (s != FA_OK) return ::testing::AssertionFailure() << "params: " << fa_last_error();
    if (!cuda::sm90::supports_forward(params))
      return ::testing::AssertionFailure() << "sm90::supports_forward said no";
    params.max_ctas = max_ctas;
    s = captured ? run_captured(params) : cuda::sm90::run_forward(params);
  } else {
    s = fa_forward(&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc, with_lse ? &dlse.desc : nullptr,
                   d.varlen_ptr(), &o);
  }
  if (auto done = call_completed(s); !done) return done;
  r.out = dout.download(out);
  r.lse = dlse.download(lse);
  return ::testing::AssertionSuccess();
}

class Sm90Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Sm90Forward, MatchesFloat64Reference) {
  FA_REQUIRE_SM90();
  const Problem p = make_problem(GetParam());
  ForwardRun r;
  ASSERT_TRUE(run_forward(p, true, Path::kSm90Direct, r));
  expect_forward_matches_reference(p, r);
}

// Same inputs twice: bitwise the same output and lse; the lse-less run writes
// the same output; fa_forward (the public entry) gives the same bits, i.e. it
// dispatched here, unless FLASHATTN_DISABLE_SM90 asks for the sm80 kernel.
TEST_P(Sm90Forward, BitwiseStableAndDispatched) {
  FA_REQUIRE_SM90();
  const Problem p = make_problem(GetParam());
  ForwardRun a, b, c, api;
  ASSERT_TRUE(run_forward(p, true, Path::kSm90Direct, a));
  ASSERT_TRUE(run_forward(p, true, Path::kSm90Direct, b));
  ASSERT_TRUE(run_forward(p, false, Path::kSm90Direct, c));
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.lse.bytes, b.lse.bytes);
  EXPECT_EQ(a.out.bytes, c.out.bytes);
  if (!cuda::sm90::disabled_by_env()) {
    ASSERT_TRUE(run_forward(p, true, Path::kPublicApi, api));
    EXPECT_EQ(a.out.bytes, api.out.bytes);
    EXPECT_EQ(a.lse.bytes, api.lse.bytes);
  }
}

// Shapes whose middle query row sees >= 8192 keys, on the head dims the d 128
// kernel runs: they take its long-key instantiation (176-key tiles, one Q
// buffer, O stored from registers; tuning.h's kLongKeys), with the ragged last
// tile, every mask kind, softcap, GQA, varlen (short sequences in a batch whose
// longest picks the wide tiles) and large logits.
std::vector<Case> long_key_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (fa_dtype dt : {FA_BF16, FA_F16}) {
    Case c = make_case(dt, 77, 8219, 128, seed++);
    cases.push_back(c);
    c = make_case(dt, 203, 9001, dt == FA_BF16 ? 96 : 120, seed++);
    c.causal = true;
    cases.push_back(c);
    c = make_case(dt, 130, 8400, 128, seed++);
    c.window_left = 8300;
    c.window_right = 40;
    c.heads_q = 4;
    c.heads_kv = 1;
    cases.push_back(c);
    c = make_case(dt, 64, 8192, 128, seed++);
    c.softcap = 4.0f;
    c.scale = 12.0f / std::sqrt(128.0f);
    cases.push_back(c);
    c = make_case(dt, 0, 0, 128, seed++);
    c.varlen_q = {77, 1, 0, 130};
    c.varlen_k = {8250, 9000, 3, 200};
    c.heads_q = 4;
    c.heads_kv = 2;
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> sm90_suite() {
  if (sanitizer_subset_only()) {
    std::vector<Case> cases;
    uint64_t seed = 500;
    for (int d : {40, 64, 96, 128, 192, 256}) {
      Case c = make_case(FA_BF16, 150, 200, d, seed++);
      c.causal = true;
      cases.push_back(c);
    }
    Case c = make_case(FA_F16, 0, 0, 64, seed++);
    c.varlen_q = {7, 0, 130, 1};
    c.varlen_k = {9, 5, 203, 1};
    c.heads_q = 4;
    cases.push_back(c);
    // Several tiles per CTA (cross-tile overlap), keyless tiles among them.
    Case m = make_case(FA_BF16, 300, 150, 128, seed++);
    m.heads_q = 96;
    m.heads_kv = 96;
    m.causal = true;
    cases.push_back(m);
    cases.push_back(long_key_cases(seed).front());
    return cases;
  }
  // Every head dim of the shared suite (8 ... 256: below 64, between the
  // kernels' dims, and on them).
  std::vector<Case> cases = attention_suite({FA_F16, FA_BF16}, suite_head_dims(), true);
  // Several K/V tiles (partial last one), windows narrower than a tile, GQA +
  // varlen, more query tiles than SMs-worth of work per head.
  uint64_t seed = 2000;
  for (fa_dtype dt : {FA_BF16, FA_F16}) {
    for (int d : {40, 64, 80, 96, 128, 192, 256}) {
      Case c = make_case(dt, 300, 517, d, seed++);
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
      c.causal = false;
      c.window_left = 70;
      c.window_right = 5;
      cases.push_back(c);
      c.window_left = -1;
      c.window_right = -1;
      c.softcap = 3.0f;
      c.causal = true;
      cases.push_back(c);
    }
    Case c = make_case(dt, 0, 0, 128, seed++);
    c.varlen_q = {130, 1, 257, 64, 0};
    c.varlen_k = {300, 77, 257, 129, 3};
    c.heads_q = 6;
    c.heads_kv = 2;
    c.causal = true;
    cases.push_back(c);
    for (int d : {96, 192}) {  // padded / dedicated head dims with GQA, varlen, padded rows
      Case v = make_case(dt, 0, 0, d, seed++);
      v.varlen_q = {130, 1, 257, 0};
      v.varlen_k = {300, 77, 257, 3};
      v.heads_q = 6;
      v.heads_kv = 3;
      v.causal = true;
      cases.push_back(v);
      Case r = make_case(dt, 213, 411, d, seed++);
      r.batch = 2;
      r.row_pad = 8;
      r.window_left = 100;
      r.window_right = 0;
      cases.push_back(r);
    }
    Case big = make_case(dt, 600, 600, 128, seed++);
    big.batch = 2;
    big.heads_q = 20;  // 2 * 20 * 5 = 200 query tiles: more than one per persistent CTA
    big.heads_kv = 4;
    big.causal = true;
    cases.push_back(big);
  }
  // Several tiles per persistent CTA (more than 2 * 132 tiles), so tiles hand
  // over to the next one inside a CTA (the cross-tile overlap): tiles without
  // visible keys between tiles with keys (more queries than keys, causal or
  // windowed), GQA, varlen with empty and one-row sequences.
  {
    Case c = make_case(FA_BF16, 300, 300, 128, seed++);
    c.batch = 3;
    c.heads_q = 32;
    c.heads_kv = 8;
    c.causal = true;
    cases.push_back(c);
    c = make_case(FA_BF16, 400, 150, 64, seed++);
    c.batch = 2;
    c.heads_q = 72;
    c.heads_kv = 72;
    c.causal = true;
    cases.push_back(c);
    c = make_case(FA_F16, 600, 100, 64, seed++);
    c.batch = 2;
    c.heads_q = 40;
    c.heads_kv = 20;
    c.window_left = 20;
    c.window_right = 5;
    cases.push_back(c);
    c = make_case(FA_BF16, 0, 0, 96, seed++);
    c.varlen_q = {300, 0, 129, 257, 1, 513};
    c.varlen_k = {310, 7, 129, 100, 64, 513};
    c.heads_q = 24;
    c.heads_kv = 6;
    cases.push_back(c);
    c.causal = true;
    c.dtype = FA_F16;
    c.seed = seed++;
    cases.push_back(c);
  }
  for (const Case& c : large_logit_cases({64, 128, 192, 256}, seed)) cases.push_back(c);
  seed += 100;
  for (const Case& c : long_key_cases(seed)) cases.push_back(c);
  seed += 100;
  // Every multiple of 8 up to 256, each with a different option, dtype and
  // odd lengths: the column zero-fill and the epilogue's column bound at every
  // position inside a kernel's head dim.
  const int kOptions = 5;
  for (int d = 8; d <= 256; d += 8) {
    Case c = make_case(d % 16 ? FA_F16 : FA_BF16, 97 + d, 203, d, seed++);
    switch ((d / 8) % kOptions) {
      case 0: c.causal = true; break;
      case 1: c.window_left = 31; c.window_right = 17; break;
      case 2: c.softcap = 4.0f; c.scale = 0.2f; break;
      case 3: c.heads_q = 4; c.heads_kv = 1; c.causal = true; break;
      default: c.row_pad = 8; break;
    }
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Suite, Sm90Forward, ::testing::ValuesIn(sm90_suite()),
                         [](const auto& info) { return info.param.name(); });

// The split tail (attention/work_plan.h; unmasked, fixed lengths, at least
// kSplitTailMinKeys keys, the d 128 long-key and d 256 kernels):
// few CTAs, so that small problems walk whole rounds and then a last round
// cut along the keys, its parts merged through the workspace. The merge runs
// in part order: bitwise the same on every run, and under CUDA graph capture
// (the workspace from the stream-ordered allocator, the tail kernel a
// programmatic dependent launch: both capturable).
struct SplitTailCase {
  Case c;
  int max_ctas;
  int block_n = 128;  // keys per K/V tile of the kernel the case runs on (tuning.h)
};
void PrintTo(const SplitTailCase& t, std::ostream* os) { *os << t.c.name() << "_ctas" << t.max_ctas; }

std::vector<SplitTailCase> split_tail_cases() {
  std::vector<SplitTailCase> cases;
  uint64_t seed = 3000;
  // At least kSplitTailMinKeys keys: d <= 128 on the long-key kernel (176-key
  // tiles), d > 128 on the d 256 one (80-key tiles); ragged last key tiles.
  // A case on max_ctas CTAs, on the kernel with block_n-key tiles.
  auto add = [&](fa_dtype dt, int sq, int sk, int d, int heads_q, int heads_kv, int max_ctas,
                 int block_n) -> Case& {
    Case c = make_case(dt, sq, sk, d, seed++);
    c.heads_q = heads_q;
    c.heads_kv = heads_kv;
    cases.push_back({c, max_ctas, block_n});
    return cases.back().c;
  };
  // 64 rows x 7 heads = 7 tiles on 3 CTAs: 2 rounds, then one tile of 47 key
  // tiles cut over all 3 (also the compute-sanitizer case).
  add(FA_BF16, 64, 8192, 128, 7, 7, 3, 176);
  if (sanitizer_subset_only()) return cases;
  // 5 query tiles x 2 heads = 10 tiles on 4 CTAs: 2 rounds, 2 tail tiles.
  add(FA_F16, 600, 8300, 128, 2, 2, 4, 176);
  // 11 tiles on 10 CTAs: one tail tile cut over all 10.
  add(FA_BF16, 128, 8200, 128, 11, 11, 10, 176);
  // GQA, softcap with large logits, a padded head dim, a one-row last query tile.
  Case& softcap = add(FA_BF16, 129, 8250, 96, 6, 2, 5, 176);
  softcap.softcap = 4.0f;
  softcap.scale = 12.0f / std::sqrt(96.0f);
  // Strided rows, d 120, batch 3.
  Case& strided = add(FA_F16, 200, 8400, 120, 2, 2, 5, 176);
  strided.batch = 3;
  strided.row_pad = 8;
  // d 256: 9 tiles on 4 CTAs, one tail tile of 104 key tiles; d 200 with MQA.
  add(FA_BF16, 300, 8300, 256, 3, 3, 4, 80);
  add(FA_F16, 257, 8193, 200, 2, 1, 5, 80).batch = 2;
  return cases;
}

class Sm90SplitTail : public ::testing::TestWithParam<SplitTailCase> {};

TEST_P(Sm90SplitTail, MatchesFloat64ReferenceAndGraphReplayGivesTheSameBits) {
  const SplitTailCase& t = GetParam();
  // The case does reach the split tail (128-row query tiles).
  const int tiles = t.c.batch * t.c.heads_q * ((t.c.seqlen_q + 127) / 128);
  const int key_tiles = (t.c.seqlen_k + t.block_n - 1) / t.block_n;
  ASSERT_GE(t.c.seqlen_k, cuda::sm90::kSplitTailMinKeys);
  ASSERT_GT(plan_split_tail(tiles, t.max_ctas, key_tiles, true).tiles, 0);
  FA_REQUIRE_SM90();
  const Problem p = make_problem(t.c);
  ForwardRun a, b;
  ASSERT_TRUE(run_forward(p, true, Path::kSm90Direct, a, t.max_ctas));
  expect_forward_matches_reference(p, a);
  ASSERT_TRUE(run_forward(p, true, Path::kSm90Direct, b, t.max_ctas, true));
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.lse.bytes, b.lse.bytes);
}

// The workspace contract: the forward's workspace query reports exactly the
// split tail's partial-state bytes the launch allocates ([tiles][parts][warps]
// slots of 32 lanes x (D/2 + 4) floats, then a counter per tile and warp), and
// 0 where the call has no split tail (here: the same shape made causal).
TEST_P(Sm90SplitTail, WorkspaceQueryReportsTheSplitTailBytes) {
  const SplitTailCase& t = GetParam();
  FA_REQUIRE_SM90();
  const Problem p = make_problem(t.c);
  DeviceProblem d(p);
  HostTensor out = p.poisoned_like_q();
  DeviceTensor dout = DeviceTensor::upload(out);
  fa_options o = d.options();
  AttentionParams params;
  const ForwardArgs args{&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc, nullptr, d.varlen_ptr(), &o};
  ASSERT_EQ(make_forward_params(args, &params), FA_OK) << fa_last_error();
  params.max_ctas = t.max_ctas;
  const int kernel_d = t.block_n == 176 ? 128 : 256;  // the long-key d128 kernel, or d256's
  const int tiles = t.c.batch * t.c.heads_q * ((t.c.seqlen_q + 127) / 128);
  const SplitTail tail = plan_split_tail(tiles, t.max_ctas, (t.c.seqlen_k + t.block_n - 1) / t.block_n, true);
  const size_t warps = 8;  // two consumer warpgroups
  const size_t want = static_cast<size_t>(tail.tiles) * tail.max_parts * warps * 32 * (kernel_d / 2 + 4) * 4 +
                      static_cast<size_t>(tail.tiles) * warps * 4;
  EXPECT_EQ(cuda::sm90::forward_workspace_size(params), want);
  params.window_right = 0;  // causal: no split tail
  params.causal = true;
  EXPECT_EQ(cuda::sm90::forward_workspace_size(params), 0u);
  // Through the C ABI (one CTA per SM): the same rule, whatever it gives here.
  size_t abi_bytes = 1;
  ASSERT_EQ(fa_forward_workspace_size(&d.q.desc, &d.k.desc, &d.v.desc, d.varlen_ptr(), &o, &abi_bytes), FA_OK);
  params.window_right = -1;
  params.causal = false;
  params.max_ctas = 0;
  EXPECT_EQ(abi_bytes, cuda::sm90::forward_workspace_size(params));
}

INSTANTIATE_TEST_SUITE_P(Suite, Sm90SplitTail, ::testing::ValuesIn(split_tail_cases()),
                         [](const auto& info) {
                           return info.param.c.name() + "_ctas" + std::to_string(info.param.max_ctas);
                         });

}  // namespace
}  // namespace flashattn::testing
