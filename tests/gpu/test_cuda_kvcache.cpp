// fa_forward_kvcache on the CUDA backend (split-KV decode kernels) against the
// float64 reference: outputs poisoned before each call, cache contents checked,
// forced split counts, every page-size path of the paged source, ALiBi and
// attention sinks, pages outside the pool met inside the kernel, CUDA-graph
// capture and replay with new cache_seqlens, the NaN/Inf rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/kvcache_harness.h"
#include "common/nan_semantics.h"
#include "core/backends.h"
#include "core/dtype.h"
#include "core/validate.h"
#include "cuda/decode/tuning.h"
#include "cuda/sm90/fwd/api.h"
#include "device.h"

namespace flashattn::testing {
namespace {

DeviceMemory upload_ints(const std::vector<int32_t>& v) {
  DeviceMemory m = device_alloc(v.size() * sizeof(int32_t));
  if (!v.empty()) cudaMemcpy(m.get(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  return m;
}

// A KvProblem's tensors and index arrays on the device, with poisoned outputs.
struct DeviceKv {
  const KvProblem* host;
  DeviceTensor q, k_cache, v_cache, k_new, v_new, cos, sin, slopes, sinks, out, lse;
  DeviceMemory table, lens, rows;
  HostTensor out_like, lse_like;

  explicit DeviceKv(const KvProblem& p)
      : host(&p), q(DeviceTensor::upload(p.q)), k_cache(DeviceTensor::upload(p.k_cache)),
        v_cache(DeviceTensor::upload(p.v_cache)), k_new(DeviceTensor::upload(p.k_new)),
        v_new(DeviceTensor::upload(p.v_new)), cos(DeviceTensor::upload(p.cos)),
        sin(DeviceTensor::upload(p.sin)), slopes(DeviceTensor::upload(p.slopes)),
        sinks(DeviceTensor::upload(p.sinks)), table(upload_ints(p.block_table)),
        lens(upload_ints(p.cache_seqlens)), rows(upload_ints(p.cache_batch_idx)),
        out_like(p.poisoned_out()), lse_like(p.poisoned_lse()) {
    poison();
  }
  void poison() {
    out = DeviceTensor::upload(out_like);
    lse = DeviceTensor::upload(lse_like);
  }
  // Outputs prefilled with finite values instead (bytes 0x11: finite in f16,
  // bf16 and f32), for calls that must write NaN: a NaN after the call was
  // written by it.
  void prefill_finite() {
    std::fill(out_like.bytes.begin(), out_like.bytes.end(), kFiniteByte);
    std::fill(lse_like.bytes.begin(), lse_like.bytes.end(), kFiniteByte);
    poison();
  }
  static constexpr uint8_t kFiniteByte = 0x11;
  fa_kvcache describe() {
    return host->describe(&k_cache.desc, &v_cache.desc, &k_new.desc, &v_new.desc, &cos.desc,
                          &sin.desc, static_cast<const int32_t*>(table.get()),
                          static_cast<const int32_t*>(lens.get()),
                          static_cast<const int32_t*>(rows.get()));
  }
  // The case's ALiBi slopes and sinks on the device (none when it has none).
  fa_extras extras() const { return host->extras(&slopes.desc, &sinks.desc); }
  fa_options options(cudaStream_t stream = nullptr) const {
    fa_options o = host->options;
    o.backend = FA_BACKEND_CUDA;
    o.stream = stream;
    return o;
  }
  ::testing::AssertionResult matches(const KvExpected& e) const {
    return kvcache_call_matches(*host, e, out.download(out_like), lse.download(lse_like),
                                k_cache.download(host->k_cache), v_cache.download(host->v_cache));
  }
};

class CudaKvCache : public ::testing::TestWithParam<KvCase> {};

void run_and_check(const KvCase& c) {
  const KvProblem p = make_kv_problem(c);
  const KvExpected e = expected_kvcache(p);
  DeviceKv d(p);
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options();
  const fa_extras x = d.extras();
  ASSERT_TRUE(call_completed(fa_forward_kvcache_ex(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, &x, nullptr, 0)));
  EXPECT_TRUE(d.matches(e));
}

TEST_P(CudaKvCache, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  run_and_check(GetParam());
}

TEST_P(CudaKvCache, ForcedSplitsMatchToo) {
  FA_REQUIRE_GPU();
  // 40 splits: more than one per lane of the combine's state merge.
  for (int splits : {1, 3, 40}) {
    KvCase c = GetParam();
    c.num_splits = splits;
    SCOPED_TRACE(splits);
    run_and_check(c);
  }
}

std::vector<KvCase> gpu_suite() {
  std::vector<KvCase> cases = kvcache_suite(FA_BF16);
  for (KvCase c : kvcache_suite(FA_F16)) {
    if (c.cached.size() > 1) cases.push_back(c);  // f16 on the ragged cases
  }
  // Head dims the buckets round up (40 -> 64, 96 -> 128, 200 -> 256).
  for (int d : {40, 96, 200}) {
    cases.push_back({.seqlen_q = 2, .heads_q = 8, .heads_kv = 2, .head_dim = d, .cached = {129, 7},
                     .seqlen_new = 2, .page_size = 16, .causal = true, .seed = 100u + d});
  }
  // The paged source's paths (src/cuda/decode/source.cuh): pages that are not a
  // power of two, translated per row (24, 96 at d128) and per tile (96 at d256,
  // whose key tiles are 32 keys), power-of-two pages per row (32) and per tile (128).
  for (int page : {24, 32, 96, 128}) {
    cases.push_back({.heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {700, 0, 95}, .seqlen_new = 1,
                     .page_size = page, .seed = 400u + page});
  }
  cases.push_back({.heads_q = 4, .heads_kv = 2, .head_dim = 256, .cached = {500, 96}, .seqlen_new = 1,
                   .page_size = 96, .seed = 500});
  // Contiguous caches of every head-dim bucket whose splits fall on both sides of
  // kPrefetchMaxSplitTiles under ForcedSplitsMatchToo's 1, 3 and 40 splits: the
  // decode kernel with and without the L2 prefetch of the tile after its ring.
  for (int d : {64, 128, 256}) {
    cases.push_back({.heads_q = 8, .heads_kv = 2, .head_dim = d, .cached = {2500, 31}, .seqlen_new = 1,
                     .seed = 600u + d});
  }
  // Scores of a wide range (8x the default scale: a row's max grows past the
  // softmax's reference by more than kRescaleSlack between slices, the decode
  // kernel's rescale after its first slice; tuning.h), every head-dim bucket.
  for (int d : {64, 128, 256}) {
    cases.push_back({.heads_q = 8, .heads_kv = 2, .head_dim = d, .cached = {2000, 300}, .seqlen_new = 1,
                     .softmax_scale = 8.0f / std::sqrt(static_cast<float>(d)), .seed = 650u + d});
  }
  // Packed rows beyond one tile (seqlen_q 5 x group 8 = 40 rows), long split cache.
  cases.push_back({.seqlen_q = 5, .heads_q = 32, .heads_kv = 4, .head_dim = 128, .cached = {4097, 1023},
                   .seqlen_new = 5, .page_size = 256, .causal = true, .seed = 300});
  return cases;
}

// ALiBi (one slope per head or per sequence and head) and sinks through the
// decode kernel's scores and its epilogue (one split) or the combine (several):
// the shared extras suite, then causal decoding and speculative rows at every
// head-dim bucket, GQA 4 and 8, MQA, pages of 16 and 64 and contiguous caches,
// ragged lengths with empty sequences (lse = sink, out 0) and one-key ones
// (the sink often above every score), windows and softcap.
std::vector<KvCase> gpu_extras_suite() {
  std::vector<KvCase> cases = kvcache_extras_suite(FA_BF16);
  for (KvCase c : kvcache_extras_suite(FA_F16)) {
    if (c.alibi && c.sinks) cases.push_back(c);
  }
  uint64_t seed = 700;
  for (int d : {64, 128, 256}) {
    for (int sq : {1, 5}) {
      cases.push_back({.seqlen_q = sq, .heads_q = 8, .heads_kv = 2, .head_dim = d, .cached = {1023, 0, 1},
                       .seqlen_new = sq, .page_size = 16, .causal = true, .alibi = true,
                       .slopes_per_head = true, .sinks = true, .seed = seed++});
    }
  }
  cases.push_back({.seqlen_q = 5, .heads_q = 8, .heads_kv = 1, .head_dim = 128, .cached = {300, 17, 0},
                   .seqlen_new = 5, .causal = true, .alibi = true, .sinks = true, .seed = seed++});
  cases.push_back({.heads_q = 16, .heads_kv = 2, .head_dim = 128, .cached = {2000, 1, 0}, .page_size = 64,
                   .num_splits = 8, .sinks = true, .seed = seed++});
  cases.push_back({.seqlen_q = 5, .heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {4097, 129},
                   .seqlen_new = 5, .page_size = 64, .causal = true, .alibi = true, .seed = seed++});
  cases.push_back({.seqlen_q = 5, .heads_q = 8, .heads_kv = 2, .head_dim = 64, .cached = {500, 33},
                   .seqlen_new = 1, .page_size = 16, .window_left = 100, .window_right = 0, .softcap = 20.0f,
                   .alibi = true, .sinks = true, .seed = seed++});
  cases.push_back({.heads_q = 32, .heads_kv = 8, .head_dim = 256, .cached = {700, 7}, .seqlen_new = 1,
                   .alibi = true, .seed = seed++});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaKvCache, ::testing::ValuesIn(gpu_suite()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Extras, CudaKvCache, ::testing::ValuesIn(gpu_extras_suite()),
                         [](const auto& info) { return info.param.name(); });

// The decode kernel's K/V ring stages for a call (cuda::kvcache_ring_stages on the params it builds).
int ring_stages_of(DeviceKv& d) {
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options();
  KvCacheParams kp;
  EXPECT_EQ(make_kvcache_params({&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o}, &kp), FA_OK) << fa_last_error();
  return cuda::kvcache_ring_stages(kp);
}

// The smaller ring (kSmallRingBytes, src/cuda/decode/tuning.h) that GPUs whose
// blocks may not take the default one (sm_86 / sm_89) and the A100 run, forced
// on this GPU: every case of both suites, with the heuristic's and 3 splits,
// against the float64 reference; on sm_90, whose default is the big ring, each
// decode call's stage count is checked to drop.
TEST(CudaKvCacheSmallRing, MatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  constexpr const char* kSwitch = "FLASHATTN_DECODE_SMALL_RING";
  std::vector<KvCase> cases = gpu_suite();
  for (const KvCase& c : gpu_extras_suite()) cases.push_back(c);
  for (KvCase c : cases) {
    SCOPED_TRACE(c.name());
    const KvProblem p = make_kv_problem(c);
    DeviceKv d(p);
    const int stages = ring_stages_of(d);
    ASSERT_EQ(setenv(kSwitch, "1", 1), 0);
    const int small = ring_stages_of(d);
    if (stages > 0) {
      EXPECT_GE(small, 2);
      if (device_is_sm90()) {
        EXPECT_LT(small, stages);
      } else {
        EXPECT_LE(small, stages);
      }
    }
    for (int splits : {0, 3}) {
      c.num_splits = splits;
      run_and_check(c);
    }
    unsetenv(kSwitch);
  }
}

KvCase small_decode_step(int page) {
  return {.seqlen_q = 1, .heads_q = 4, .heads_kv = 2, .head_dim = 64, .cached = {20, 5}, .seqlen_new = 1,
          .page_size = page};
}

// An eager call (the host reads the indices) that must be refused: FA_ERROR_INVALID_ARGUMENT,
// a message holding each of `words`, and nothing written (caches and outputs as they were).
void expect_rejected(const KvProblem& p, std::initializer_list<const char*> words) {
  DeviceKv d(p);
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options();
  EXPECT_EQ(fa_forward_kvcache(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, nullptr, 0),
            FA_ERROR_INVALID_ARGUMENT);
  const std::string error = fa_last_error();
  for (const char* w : words) EXPECT_NE(error.find(w), std::string::npos) << error;
  EXPECT_EQ(d.k_cache.download(p.k_cache).bytes, p.k_cache.bytes) << "k_cache written";
  EXPECT_EQ(d.v_cache.download(p.v_cache).bytes, p.v_cache.bytes) << "v_cache written";
  EXPECT_EQ(d.out.download(d.out_like).bytes, d.out_like.bytes) << "out written";
  EXPECT_EQ(d.lse.download(d.lse_like).bytes, d.lse_like.bytes) << "lse written";
}

TEST(CudaKvCacheErrors, BadIndicesAreClearErrorsOutsideCapture) {
  FA_REQUIRE_GPU();
  KvProblem p = make_kv_problem(small_decode_step(16));
  p.block_table[1] = -1;
  expect_rejected(p, {"outside the pool"});
}

// A negative cached length and one whose new tokens pass the cache's end
// (pages of 16 and a contiguous cache), as tests/test_cpu_kvcache.cpp checks them on the CPU.
TEST(CudaKvCacheErrors, NegativeLengthIsAClearError) {
  FA_REQUIRE_GPU();
  for (const int page : {16, 0}) {
    SCOPED_TRACE(page);
    KvProblem p = make_kv_problem(small_decode_step(page));
    p.cache_seqlens[1] = -3;
    expect_rejected(p, {"cache_seqlens[1] = -3", "negative"});
  }
}

TEST(CudaKvCacheErrors, LengthBeyondTheCacheIsAClearError) {
  FA_REQUIRE_GPU();
  for (const int page : {16, 0}) {
    SCOPED_TRACE(page);
    KvProblem p = make_kv_problem(small_decode_step(page));
    const int capacity = page > 0 ? p.max_blocks * page : static_cast<int>(p.k_cache.desc.shape[1]);
    p.cache_seqlens[1] = capacity - p.c.seqlen_new + 1;  // its new token one slot past the end
    expect_rejected(p, {"sequence 1", "cache_seqlens", "exceeds the cache's capacity"});
  }
}

// Index arrays are read one int32 at a time: views into a larger array (a
// slice of a torch tensor, say) need only int32 alignment.
TEST(CudaKvCacheErrors, IndexArraysNeedOnlyIntAlignment) {
  FA_REQUIRE_GPU();
  KvCase c{.seqlen_q = 1, .heads_q = 4, .heads_kv = 2, .head_dim = 64, .cached = {20, 5},
           .seqlen_new = 1, .page_size = 16};
  const KvProblem p = make_kv_problem(c);
  const KvExpected e = expected_kvcache(p);
  DeviceKv d(p);
  fa_kvcache desc = d.describe();
  const size_t lens_bytes = p.cache_seqlens.size() * sizeof(int32_t);
  const size_t table_bytes = p.block_table.size() * sizeof(int32_t);
  DeviceMemory lens = device_alloc(lens_bytes + sizeof(int32_t));
  DeviceMemory table = device_alloc(table_bytes + sizeof(int32_t));
  int32_t* lens_view = static_cast<int32_t*>(lens.get()) + 1;
  int32_t* table_view = static_cast<int32_t*>(table.get()) + 1;
  ASSERT_EQ(cudaMemcpy(lens_view, desc.cache_seqlens, lens_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(table_view, desc.block_table, table_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  desc.cache_seqlens = lens_view;
  desc.block_table = table_view;
  const fa_options o = d.options();
  ASSERT_TRUE(call_completed(fa_forward_kvcache(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, nullptr, 0)));
  EXPECT_TRUE(d.matches(e));
}

// With trust_indices the host does not read the block table: a page outside the
// pool in the middle of sequence 1 is met by one split inside the kernel, which
// reads nothing of it; the merge makes all of sequence 1 NaN, and the other
// sequences are as with a good table (per-row and per-tile page translation).
class CudaKvCacheBadPage : public ::testing::TestWithParam<int> {};

TEST_P(CudaKvCacheBadPage, PoisonsOnlyItsSequence) {
  FA_REQUIRE_GPU();
  const int page = GetParam();
  KvCase c{.heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {600, 600, 600}, .page_size = page,
           .num_splits = 8, .seed = 77};
  KvProblem p = make_kv_problem(c);
  const KvExpected e = expected_kvcache(p);
  DeviceKv good(p);
  fa_kvcache desc = good.describe();
  desc.trust_indices = 1;
  const fa_options o = good.options();
  ASSERT_TRUE(call_completed(fa_forward_kvcache(&good.q.desc, &desc, &good.out.desc, &good.lse.desc, &o, nullptr, 0)));
  ASSERT_TRUE(good.matches(e));

  const int64_t pool = static_cast<int64_t>(p.k_cache.bytes.size()) / (int64_t{page} * c.heads_kv * c.head_dim * 2);
  p.block_table[p.max_blocks + 320 / page] = static_cast<int32_t>(pool + 3);  // key 320 of sequence 1
  DeviceKv bad(p);
  bad.prefill_finite();
  desc = bad.describe();
  desc.trust_indices = 1;
  ASSERT_TRUE(call_completed(fa_forward_kvcache(&bad.q.desc, &desc, &bad.out.desc, &bad.lse.desc, &o, nullptr, 0)));
  HostTensor out = bad.out.download(bad.out_like);
  HostTensor lse = bad.lse.download(bad.lse_like);
  const HostTensor good_out = good.out.download(good.out_like);
  const HostTensor good_lse = good.lse.download(good.lse_like);
  const int64_t per_seq = int64_t{c.heads_q} * c.head_dim, lse_per_seq = c.heads_q;
  for (int64_t i = 0; i < 3 * per_seq; ++i) {
    const bool nan = std::isnan(load_as_float(out.bytes.data(), i, c.dtype));
    EXPECT_EQ(nan, i / per_seq == 1) << i;
  }
  for (int64_t i = lse_per_seq; i < 2 * lse_per_seq; ++i) {
    EXPECT_TRUE(std::isnan(load_as_float(lse.bytes.data(), i, FA_F32))) << i;
  }
  // Sequence 1 as the good call gave it: then everything matches the reference.
  const size_t out_bytes = static_cast<size_t>(per_seq) * 2, lse_bytes = static_cast<size_t>(lse_per_seq) * 4;
  std::memcpy(&out.bytes[out_bytes], &good_out.bytes[out_bytes], out_bytes);
  std::memcpy(&lse.bytes[lse_bytes], &good_lse.bytes[lse_bytes], lse_bytes);
  EXPECT_TRUE(kvcache_call_matches(p, e, out, lse, bad.k_cache.download(p.k_cache), bad.v_cache.download(p.v_cache)));
}

INSTANTIATE_TEST_SUITE_P(PageSizes, CudaKvCacheBadPage, ::testing::Values(16, 64));

// A decode step (append + attention) captured once and replayed with new
// cache_seqlens and new tokens: every replay matches the reference, and a
// replay whose lengths overflow the cache poisons that sequence only and
// leaves its cache untouched. Pages of 16 and a contiguous cache (whose decode
// kernel prefetches its first tiles from the lengths it reads before waiting
// for the append kernel: kernel.cuh, prefetch_before_wait). With the caller's
// workspace and without one: the library then takes its workspace (the
// rotated q, the splits' partials) from the stream-ordered pool
// (cudaMallocAsync, src/cuda/decode/api.cu), which the capture records as an
// allocation node of the graph, freed in it.
void capture_and_replay(int page, bool caller_workspace) {
  KvCase c{.seqlen_q = 1, .heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {100, 7, 600},
           .seqlen_new = 1, .page_size = page, .rotary_dim = 64, .causal = true};
  KvProblem p = make_kv_problem(c);
  DeviceKv d(p);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options(stream);
  size_t bytes = 0;
  ASSERT_EQ(fa_forward_kvcache_workspace_size(&d.q.desc, &desc, &o, &bytes), FA_OK) << fa_last_error();
  ASSERT_GT(bytes, 0u) << "the call needs a workspace (rotary)";
  DeviceMemory ws = device_alloc(bytes);
  // Bytes that no call wrote: nothing may read the workspace before writing it.
  ASSERT_EQ(cudaMemset(ws.get(), 0xA5, bytes), cudaSuccess);
  void* const workspace = caller_workspace ? ws.get() : nullptr;
  const size_t workspace_bytes = caller_workspace ? bytes : 0;
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const fa_status s = fa_forward_kvcache(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, workspace, workspace_bytes);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(s, FA_OK) << fa_last_error();
  if (!caller_workspace) {
    size_t count = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
    std::vector<cudaGraphNode_t> nodes(count);
    ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
    const auto allocations = std::count_if(nodes.begin(), nodes.end(), [](cudaGraphNode_t n) {
      cudaGraphNodeType type;
      return cudaGraphNodeGetType(n, &type) == cudaSuccess && type == cudaGraphNodeTypeMemAlloc;
    });
    EXPECT_GE(allocations, 1) << "no pool allocation captured";
  }
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const bool paged = c.page_size > 0;
  const int capacity = paged ? p.max_blocks * c.page_size : static_cast<int>(p.k_cache.desc.shape[1]);
  for (int step = 0; step < 4; ++step) {
    // The cache as the device holds it now is the next step's starting point.
    p.k_cache = d.k_cache.download(p.k_cache);
    p.v_cache = d.v_cache.download(p.v_cache);
    const bool overflow = step == 3;
    for (size_t b = 0; b < p.cache_seqlens.size(); ++b) p.cache_seqlens[b] += step == 0 ? 0 : 1;
    if (overflow) p.cache_seqlens[1] = capacity;  // + 1 new token: beyond the cache
    cudaMemcpy(d.lens.get(), p.cache_seqlens.data(), p.cache_seqlens.size() * 4, cudaMemcpyHostToDevice);
    // The overflowing replay must write its NaN: its output starts finite.
    if (overflow) cudaMemset(d.out.memory.get(), DeviceKv::kFiniteByte, d.out.bytes);
    else cudaMemcpy(d.out.memory.get(), d.out_like.bytes.data(), d.out.bytes, cudaMemcpyHostToDevice);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (!overflow) {
      p.c.cached.assign(p.cache_seqlens.begin(), p.cache_seqlens.end());
      EXPECT_TRUE(d.matches(expected_kvcache(p))) << "replay " << step;
      continue;
    }
    const HostTensor out = d.out.download(d.out_like);
    const int64_t per_seq = int64_t{c.heads_q} * c.head_dim;
    for (int64_t i = 0; i < 3 * per_seq; ++i) {
      const bool nan = std::isnan(load_as_float(out.bytes.data(), i, c.dtype));
      EXPECT_EQ(nan, i / per_seq == 1) << i;
    }
    // Sequence 1's pages (or cache row) are as they were.
    const HostTensor v_after = d.v_cache.download(p.v_cache);
    const size_t slot_bytes = static_cast<size_t>(c.heads_kv) * c.head_dim * 2;
    const size_t piece_bytes = slot_bytes * (paged ? c.page_size : capacity);
    for (int blk = 0; blk < (paged ? p.max_blocks : 1); ++blk) {
      const size_t piece = paged ? static_cast<size_t>(p.block_table[p.max_blocks + blk]) : 1;
      EXPECT_EQ(std::memcmp(&v_after.bytes[piece * piece_bytes], &p.v_cache.bytes[piece * piece_bytes], piece_bytes),
                0)
          << "page or row " << piece;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

class CudaKvCacheGraph : public ::testing::TestWithParam<int> {};

TEST_P(CudaKvCacheGraph, CaptureAndReplayWithNewLengths) {
  FA_REQUIRE_GPU();
  capture_and_replay(GetParam(), true);
}

TEST_P(CudaKvCacheGraph, CaptureWithoutWorkspaceUsesThePool) {
  FA_REQUIRE_GPU();
  capture_and_replay(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, CudaKvCacheGraph, ::testing::Values(16, 0));

// ---- Chunked prefill: the Hopper forward over the cache (issue 28) ----

// The route the library takes for a call (cuda::kvcache_route on the params it builds).
cuda::KvCacheRoute route_of(DeviceKv& d) {
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options();
  KvCacheParams kp;
  EXPECT_EQ(make_kvcache_params({&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o}, &kp), FA_OK) << fa_last_error();
  return cuda::kvcache_route(kp);
}

// The route a case should take (cuda/decode/api.cu): the Hopper forward from
// kForwardMinQueryRows query rows on a 9.0 device, contiguous caches without
// cache_batch_idx and pages that fit its key tile; the decode kernel otherwise.
cuda::KvCacheRoute expected_route(const KvCase& c) {
  const bool cache_fits = c.page_size == 0 ? !c.batch_idx : cuda::sm90::pages_fit(c.head_dim, c.page_size);
  const bool forward = device_is_sm90() && !cuda::sm90::disabled_by_env() &&
                       c.seqlen_q >= cuda::decode::kForwardMinQueryRows && cache_fits;
  return forward ? cuda::KvCacheRoute::kHopperForward : cuda::KvCacheRoute::kDecode;
}

// Every cache element that is none of the sequences' cached keys becomes NaN
// (bits 0x7fff: NaN in f16 and bf16): the slots the call appends to, the slots
// past each sequence's keys, spare pages. No kernel may let them reach out/lse
// (the forward's last key tile of a sequence runs past its keys).
void poison_unused_cache(KvProblem& p) {
  const KvCacheParams kp = p.host_params();
  const int64_t slots = p.k_cache.desc.shape[1], row_elems = int64_t{p.c.heads_kv} * p.c.head_dim;
  std::vector<bool> used(static_cast<size_t>(p.k_cache.desc.shape[0] * slots), false);
  for (int b = 0; b < p.c.batch(); ++b) {
    for (int j = 0; j < kp.cached_tokens(b); ++j) {
      const CacheSlot s = cache_slot(kp, b, j);
      used[static_cast<size_t>(s.row * slots + s.slot)] = true;
    }
  }
  const uint16_t nan_bits = 0x7fff;
  for (HostTensor* t : {&p.k_cache, &p.v_cache}) {
    uint16_t* e = reinterpret_cast<uint16_t*>(t->bytes.data());
    for (size_t slot = 0; slot < used.size(); ++slot) {
      if (!used[slot]) std::fill(e + slot * row_elems, e + (slot + 1) * row_elems, nan_bits);
    }
  }
}

class CudaKvCacheChunked : public ::testing::TestWithParam<KvCase> {};

TEST_P(CudaKvCacheChunked, MatchesFloat64ReferenceOnItsRoute) {
  FA_REQUIRE_GPU();
  const KvCase& c = GetParam();
  KvProblem p = make_kv_problem(c);
  poison_unused_cache(p);
  const KvExpected e = expected_kvcache(p);
  DeviceKv d(p);
  EXPECT_EQ(route_of(d), expected_route(c));
  const fa_kvcache desc = d.describe();
  const fa_options o = d.options();
  const fa_extras x = d.extras();
  ASSERT_TRUE(call_completed(fa_forward_kvcache_ex(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, &x, nullptr, 0)));
  EXPECT_TRUE(d.matches(e));
}

// seqlen_q 300 and 700 (several query tiles, the last partial) against
// contiguous caches and pages of 16, 64 and 256; ragged lengths with
// empty and one-key sequences; appends crossing pages; rotary in both layouts;
// causal, window, softcap, ALiBi (per sequence and per head), sinks; GQA 4,
// MQA, head dims 64, 128, 256 and 96 (zero-filled columns); f16 and bf16.
std::vector<KvCase> chunked_suite() {
  std::vector<KvCase> cases;
  uint64_t seed = 900;
  auto add = [&](KvCase c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  for (int sq : {300, 700}) {
    for (int page : {0, 16, 64, 256}) {
      add({.seqlen_q = sq, .heads_q = 4, .heads_kv = 1, .head_dim = 128, .cached = {0, 517, 1},
           .seqlen_new = sq, .page_size = page, .causal = true});
    }
  }
  add({.seqlen_q = 300, .heads_q = 4, .heads_kv = 4, .head_dim = 64, .cached = {203, 0, 1000}, .seqlen_new = 300,
       .window_left = 100, .window_right = 0, .softcap = 20.0f, .alibi = true});
  add({.seqlen_q = 700, .heads_q = 4, .heads_kv = 1, .head_dim = 256, .cached = {129, 0}, .seqlen_new = 700,
       .causal = true, .alibi = true, .slopes_per_head = true, .sinks = true});
  add({.seqlen_q = 300, .heads_q = 4, .heads_kv = 1, .head_dim = 128, .cached = {77, 900}, .seqlen_new = 300,
       .rotary_dim = 128, .interleaved = false, .causal = true});
  add({.seqlen_q = 300, .heads_q = 8, .heads_kv = 1, .head_dim = 64, .cached = {31, 400}, .seqlen_new = 300,
       .rotary_dim = 32, .interleaved = true, .sinks = true});
  add({.seqlen_q = 700, .heads_q = 2, .heads_kv = 2, .head_dim = 96, .cached = {700, 1}, .dtype = FA_F16,
       .window_left = 50, .window_right = 30, .softcap = 10.0f, .sinks = true});
  add({.seqlen_q = 300, .heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {1, 1300}, .seqlen_new = 300,
       .page_size = 64, .rotary_dim = 64, .causal = true, .alibi = true, .sinks = true});
  add({.seqlen_q = 300, .heads_q = 4, .heads_kv = 1, .head_dim = 128, .cached = {100, 3}, .seqlen_new = 300,
       .batch_idx = true, .causal = true});
  // Pages at d256 (80-key tiles: 16 fits, 64 stays on the decode kernel) and d64.
  for (int page : {16, 64}) {
    add({.seqlen_q = 300, .heads_q = 4, .heads_kv = 2, .head_dim = 256, .cached = {250, 0, 81}, .seqlen_new = 300,
         .page_size = page, .window_left = 200, .window_right = 0, .sinks = true});
  }
  add({.seqlen_q = 700, .heads_q = 4, .heads_kv = 1, .head_dim = 64, .cached = {1, 300}, .seqlen_new = 700,
       .page_size = 256, .rotary_dim = 64, .interleaved = true, .causal = true, .softcap = 15.0f, .alibi = true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Chunked, CudaKvCacheChunked, ::testing::ValuesIn(chunked_suite()),
                         [](const auto& info) { return info.param.name(); });

// trust_indices and a length that overflows the cache (as under graph capture,
// where the host checks nothing): on the forward route the append kernel's
// key count marks the sequence, its rows come out NaN, its cache row is
// untouched, and the other sequences' rows are bit for bit those of a good call.
TEST(CudaKvCacheChunked, OverflowingLengthPoisonsOnlyItsSequence) {
  FA_REQUIRE_GPU();
  KvCase c{.seqlen_q = 130, .heads_q = 4, .heads_kv = 2, .head_dim = 128, .cached = {100, 7, 600},
           .seqlen_new = 130, .causal = true, .seed = 990};
  KvProblem p = make_kv_problem(c);
  const KvExpected e = expected_kvcache(p);
  DeviceKv good(p);
  EXPECT_EQ(route_of(good), expected_route(c));
  fa_kvcache desc = good.describe();
  desc.trust_indices = 1;
  const fa_options o = good.options();
  ASSERT_TRUE(call_completed(fa_forward_kvcache(&good.q.desc, &desc, &good.out.desc, &good.lse.desc, &o, nullptr, 0)));
  ASSERT_TRUE(good.matches(e));

  p.cache_seqlens[1] = static_cast<int32_t>(p.k_cache.desc.shape[1]);  // + 130 new: past the capacity
  DeviceKv bad(p);
  bad.prefill_finite();
  desc = bad.describe();
  desc.trust_indices = 1;
  ASSERT_TRUE(call_completed(fa_forward_kvcache(&bad.q.desc, &desc, &bad.out.desc, &bad.lse.desc, &o, nullptr, 0)));
  const HostTensor out = bad.out.download(bad.out_like), lse = bad.lse.download(bad.lse_like);
  const HostTensor good_out = good.out.download(good.out_like), good_lse = good.lse.download(good.lse_like);
  const int64_t per_seq = int64_t{c.seqlen_q} * c.heads_q * c.head_dim, lse_per_seq = int64_t{c.heads_q} * c.seqlen_q;
  for (int64_t i = 0; i < 3 * per_seq; ++i) {
    const float got = load_as_float(out.bytes.data(), i, c.dtype);
    if (i / per_seq == 1) {
      ASSERT_TRUE(std::isnan(got)) << i;
    } else {
      ASSERT_EQ(std::memcmp(&out.bytes[2 * i], &good_out.bytes[2 * i], 2), 0) << i;
    }
  }
  for (int64_t i = 0; i < 3 * lse_per_seq; ++i) {
    const float got = load_as_float(lse.bytes.data(), i, FA_F32);
    if (i / lse_per_seq == 1) {
      ASSERT_TRUE(std::isnan(got)) << i;
    } else {
      ASSERT_EQ(std::memcmp(&lse.bytes[4 * i], &good_lse.bytes[4 * i], 4), 0) << i;
    }
  }
  const HostTensor v_after = bad.v_cache.download(p.v_cache);
  const size_t row_bytes = v_after.bytes.size() / 3;
  EXPECT_EQ(std::memcmp(&v_after.bytes[row_bytes], &p.v_cache.bytes[row_bytes], row_bytes), 0);
}

// ---- The NaN/Inf rules against the cache (tests/common/nan_semantics.h) ----

class CudaKvCacheNan : public ::testing::TestWithParam<KvNanCase> {};

// NaN/Inf planted in q and the caches reach exactly the rows the reference
// says, on the call's route: the decode kernel with the heuristic's, one and
// three splits (each split's partial fixed before the combine), or the
// Hopper forward over the cache.
TEST_P(CudaKvCacheNan, PlantedValuesReachExactlyTheirRows) {
  FA_REQUIRE_GPU();
  for (int splits : {0, 1, 3}) {
    KvNanCase nc = GetParam();
    nc.c.num_splits = splits;
    SCOPED_TRACE(splits);
    const KvProblem p = make_kv_nan_problem(nc);
    DeviceKv d(p);
    EXPECT_EQ(route_of(d), expected_route(nc.c));
    const fa_kvcache desc = d.describe();
    const fa_options o = d.options();
    const fa_extras x = d.extras();
    ASSERT_TRUE(call_completed(fa_forward_kvcache_ex(&d.q.desc, &desc, &d.out.desc, &d.lse.desc, &o, &x, nullptr, 0)));
    EXPECT_TRUE(kvcache_semantics_match(p, d.out.download(d.out_like), d.lse.download(d.lse_like),
                                        d.k_cache.download(p.k_cache), d.v_cache.download(p.v_cache)));
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16, CudaKvCacheNan, ::testing::ValuesIn(kvcache_nan_cases(FA_BF16)),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(F16, CudaKvCacheNan, ::testing::ValuesIn(kvcache_nan_cases(FA_F16)),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashattn::testing
