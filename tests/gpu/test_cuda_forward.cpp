// The sm80 CUDA forward kernel against the fp64 reference: the shared suite
// (every option, odd head dims, varlen, padded rows), a tensor past 2^31
// elements, and run-to-run bitwise stability.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "core/dtype.h"
#include "device.h"
#include "forward_check.h"

namespace flashattn::testing {
namespace {

// This suite tests the sm80 (mma.sync) kernels, on every GPU: on an H100 the
// CUDA backend would otherwise route head dims 64/128/256 to the sm90 kernel
// (tested by test_sm90_forward). Set before any test runs; a value already in
// the environment wins.
const bool kForceSm80 = [] {
  setenv("FLASHATTN_DISABLE_SM90", "1", /*overwrite=*/0);
  return true;
}();

// Runs the CUDA forward on device copies of the problem's inputs, outputs
// poisoned with NaN, and brings the results back.
::testing::AssertionResult run_cuda_forward(const Problem& p, bool with_lse, ForwardRun& r) {
  DeviceProblem d(p);
  HostTensor out = p.poisoned_like_q();
  HostTensor lse = p.poisoned_lse();
  DeviceTensor dout = DeviceTensor::upload(out);
  DeviceTensor dlse = DeviceTensor::upload(lse);
  const fa_options o = d.options();
  const fa_status s = fa_forward(&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc,
                                 with_lse ? &dlse.desc : nullptr, d.varlen_ptr(), &o);
  if (auto done = call_completed(s); !done) return done;
  r.out = dout.download(out);
  r.lse = dlse.download(lse);
  return ::testing::AssertionSuccess();
}

class CudaForward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaForward, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const Problem p = make_problem(GetParam());
  ForwardRun r;
  ASSERT_TRUE(run_cuda_forward(p, true, r));
  expect_forward_matches_reference(p, r);
}

// Same inputs twice: bitwise the same output and lse (no races, no
// order-dependent reductions), and the lse-less path writes the same output.
TEST_P(CudaForward, BitwiseStableAndLseOptional) {
  FA_REQUIRE_GPU();
  const Problem p = make_problem(GetParam());
  ForwardRun a, b, c;
  ASSERT_TRUE(run_cuda_forward(p, true, a));
  ASSERT_TRUE(run_cuda_forward(p, true, b));
  ASSERT_TRUE(run_cuda_forward(p, false, c));
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.lse.bytes, b.lse.bytes);
  EXPECT_EQ(a.out.bytes, c.out.bytes);
}

std::vector<Case> gpu_suite() {
  return attention_suite({FA_F16, FA_BF16}, {32, 40, 64, 72, 80, 96, 128, 160, 192, 256}, true);
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaForward, ::testing::ValuesIn(gpu_suite()),
                         [](const auto& info) { return info.param.name(); });

// Extra shapes the suite does not reach: several K/V tiles with a partial last
// tile at every kernel head dim, windows narrower than a tile, GQA + varlen.
std::vector<Case> extra_cases() {
  std::vector<Case> cases;
  uint64_t seed = 1000;
  for (fa_dtype dt : {FA_BF16, FA_F16}) {
    for (int d : {32, 64, 96, 128, 192, 256}) {
      Case c = make_case(dt, 300, 517, d, seed++);
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
      c.causal = false;
      c.window_left = 70;
      c.window_right = 5;
      cases.push_back(c);
    }
    Case c = make_case(dt, 0, 0, 128, seed++);
    c.varlen_q = {130, 1, 257, 64};
    c.varlen_k = {300, 77, 257, 129};
    c.heads_q = 6;
    c.heads_kv = 2;
    c.causal = true;
    cases.push_back(c);
  }
  for (const Case& c : large_logit_cases({64, 128, 256}, seed)) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Extra, CudaForward, ::testing::ValuesIn(extra_cases()),
                         [](const auto& info) { return info.param.name(); });

// The plain warp layout that GPUs with 99 KB of shared memory per CTA (sm_86,
// sm_89) run at head dim 256 instead of the pair split, forced on this GPU.
TEST(CudaForwardWithoutPairSplit, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  ASSERT_EQ(setenv("FLASHATTN_FWD_NO_PAIR_SPLIT", "1", 1), 0);
  uint64_t seed = 3000;
  for (fa_dtype dt : {FA_BF16, FA_F16}) {
    for (int d : {200, 256}) {
      Case c = make_case(dt, 203, 333, d, seed++);
      c.heads_q = 4;
      c.heads_kv = 2;
      for (int variant = 0; variant < 3; ++variant) {
        c.causal = variant == 1;
        c.window_left = variant == 2 ? 70 : -1;
        c.window_right = variant == 2 ? 5 : -1;
        const Problem p = make_problem(c);
        ForwardRun r;
        ASSERT_TRUE(run_cuda_forward(p, true, r));
        SCOPED_TRACE(c.name());
        expect_forward_matches_reference(p, r);
      }
    }
  }
  unsetenv("FLASHATTN_FWD_NO_PAIR_SPLIT");
}

// ---------------------------------------------------------------------------
// A tensor over 2^31 elements: q and out of (batch 4, 270000 rows, 16 heads,
// head dim 128) = 2.2e9 elements each, k/v short (64 keys) so the run is cheap.
// The device buffers are filled with a host block of random values repeated
// with a period (a prime count of elements) that does not divide the row
// length, so every checked row has its own values; a handful of rows past
// element 2^31 are checked against softmax(q k^T) v in float64.

constexpr int64_t kPeriod = 1000003;

std::vector<uint16_t> random_block(uint64_t seed, fa_dtype dtype) {
  std::vector<uint16_t> block(kPeriod);
  uint64_t x = seed;
  for (auto& b : block) {
    // sum of 4 uniforms, centred and scaled to unit variance: close enough to normal
    double s = 0;
    for (int i = 0; i < 4; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s += static_cast<double>(x >> 11) / 9007199254740992.0;
    }
    const float v = static_cast<float>((s - 2.0) * std::sqrt(3.0));
    b = dtype == FA_BF16 ? float_to_bf16(v) : float_to_fp16(v);
  }
  return block;
}

// Fills n elements of device memory with the block repeated.
bool fill_periodic(void* dst, int64_t n, const std::vector<uint16_t>& block) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t filled = std::min<int64_t>(n, kPeriod);
  if (cudaMemcpy(d, block.data(), filled * 2, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  while (filled < n) {  // doubling copies keep element i == block[i % kPeriod]
    const int64_t len = std::min<int64_t>(filled, n - filled);
    if (cudaMemcpy(d + filled, d, len * 2, cudaMemcpyDeviceToDevice) != cudaSuccess) return false;
    filled += len;
  }
  return true;
}

TEST(CudaForwardLarge, TensorPast2To31Elements) {
  FA_REQUIRE_GPU();
  const fa_dtype dt = FA_BF16;
  const int B = 4, SQ = 270000, SK = 64, H = 16, D = 128;
  const int64_t nq = int64_t{B} * SQ * H * D, nk = int64_t{B} * SK * H * D;
  ASSERT_GT(nq, int64_t{1} << 31);
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  if (free_bytes < static_cast<size_t>(2 * nq * 2 + 4 * nk + (1 << 30)))
    GTEST_SKIP() << "needs " << (4 * nq >> 30) << " GiB of free device memory";

  const auto bq = random_block(1, dt), bk = random_block(2, dt), bv = random_block(3, dt);
  DeviceMemory q = device_alloc(nq * 2), out = device_alloc(nq * 2), k = device_alloc(nk * 2),
               v = device_alloc(nk * 2), lse = device_alloc(int64_t{B} * H * SQ * 4);
  ASSERT_TRUE(q && out && k && v && lse);
  ASSERT_TRUE(fill_periodic(q.get(), nq, bq));
  ASSERT_TRUE(fill_periodic(k.get(), nk, bk));
  ASSERT_TRUE(fill_periodic(v.get(), nk, bv));
  FA_CUDA_CHECK(cudaMemset(out.get(), 0xff, nq * 2));  // NaN poison

  auto desc = [&](void* data, int S) {
    fa_tensor t{};
    t.data = data;
    t.dtype = dt;
    t.device = FA_DEVICE_CUDA;
    t.ndim = 4;
    const int64_t shape[] = {B, S, H, D}, strides[] = {int64_t{S} * H * D, H * D, D, 1};
    std::memcpy(t.shape, shape, sizeof shape);
    std::memcpy(t.strides, strides, sizeof strides);
    return t;
  };
  fa_tensor tq = desc(q.get(), SQ), tk = desc(k.get(), SK), tv = desc(v.get(), SK),
            to = desc(out.get(), SQ);
  fa_tensor tl{};
  tl.data = lse.get();
  tl.dtype = FA_F32;
  tl.device = FA_DEVICE_CUDA;
  tl.ndim = 3;
  const int64_t lshape[] = {B, H, SQ}, lstrides[] = {int64_t{H} * SQ, SQ, 1};
  std::memcpy(tl.shape, lshape, sizeof lshape);
  std::memcpy(tl.strides, lstrides, sizeof lstrides);
  fa_options o = fa_default_options();
  o.backend = FA_BACKEND_CUDA;
  ASSERT_EQ(fa_forward(&tq, &tk, &tv, &to, &tl, nullptr, &o), FA_OK) << fa_last_error();
  FA_CUDA_CHECK(cudaDeviceSynchronize());

  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto at = [&](const std::vector<uint16_t>& blk, int64_t i) { return bf16_to_float(blk[i % kPeriod]); };
  // (batch, row, head) triples; all but the first lie past element 2^31.
  const int checks[][3] = {{0, 5, 3}, {3, 269999, 15}, {3, 269998, 0}, {3, 200001, 7}, {3, 123457, 9}};
  for (const auto& ck : checks) {
    const int b = ck[0], r = ck[1], h = ck[2];
    const int64_t qoff = ((int64_t{b} * SQ + r) * H + h) * D;
    std::vector<double> s(SK);
    double mx = -1e300;
    for (int j = 0; j < SK; ++j) {
      const int64_t koff = ((int64_t{b} * SK + j) * H + h) * D;
      double dot = 0;
      for (int c = 0; c < D; ++c) dot += double(at(bq, qoff + c)) * at(bk, koff + c);
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double l = 0;
    for (double& x : s) l += (x = std::exp(x - mx));
    std::vector<uint16_t> got(D);
    FA_CUDA_CHECK(cudaMemcpy(got.data(), static_cast<uint16_t*>(out.get()) + qoff, D * 2,
                             cudaMemcpyDeviceToHost));
    for (int c = 0; c < D; ++c) {
      double ref = 0;
      for (int j = 0; j < SK; ++j) ref += s[j] / l * at(bv, ((int64_t{b} * SK + j) * H + h) * D + c);
      const double g = bf16_to_float(got[c]);
      // bf16 output rounding (2^-9 relative) plus bf16 P in the P V product
      ASSERT_NEAR(g, ref, 1e-2 + 8e-3 * std::fabs(ref)) << "b" << b << " row " << r << " head " << h
                                                       << " col " << c;
    }
    float got_lse = 0;
    FA_CUDA_CHECK(cudaMemcpy(&got_lse, static_cast<float*>(lse.get()) + (int64_t{b} * H + h) * SQ + r,
                             4, cudaMemcpyDeviceToHost));
    EXPECT_NEAR(got_lse, mx + std::log(l), 1e-3) << "lse b" << b << " row " << r << " head " << h;
  }
}

}  // namespace
}  // namespace flashattn::testing
