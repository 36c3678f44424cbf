// Block-sparse masks (fa_block_mask) on the CUDA backend: the forward on the
// Hopper kernel where the device has one (sm90/fwd/scheduler.cuh, ListedKeys)
// and on the sm80 kernel (FLASHATTN_DISABLE_SM90); the backward on the Hopper
// kernel for fixed lengths (sm90/bwd/scheduler.cuh, ListedQueryWalk; tiles
// listed in part tested per pair), else (varlen) on sm80's:
// block_sparse_suite (densities 0, 0.1, 0.5, 1; blocks of 128 x 128 and sizes
// dividing no length; causal, window + softcap, GQA with shared lists, ALiBi +
// sinks, varlen with empty sequences, dropout, sizes 1 / 7 / 113 / 203, every
// head dim) and dropout at every head dim (blocks of 16 x 32: the Hopper
// forward and backward; tests/gpu/test_sm90_dropout.cpp calls them directly)
// against the float64 reference, forward and backward (both kernels); shapes
// of several query and key tiles on the Hopper forward (tiles listed whole,
// in part and not at all); the Hopper forward at density 1 bitwise equal to
// its dense call, and the Hopper backward (deterministic, causal); density 1 and
// create_block_mask's causal / sliding-window masks bitwise equal to the
// dense sm80 call; the deterministic backward bitwise stable (sm80 and Hopper
// kernels); NaN in key tiles
// no listed block reaches reaching nothing (they are never read); lists in
// device memory refused; CUDA-graph capture after warm-up calls (lists
// pinned), refused without them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "cuda/sm90/fwd/api.h"
#include "device.h"
#include "variants_run.h"

namespace flashattn::testing {
namespace {

// Every head dim the CUDA backend takes (multiples of 8 up to 256), sampled.
const std::vector<int> kHeadDims = {32, 40, 64, 72, 96, 128, 160, 192, 256};

// The suite, plus a block mask with dropout at every head dim and with GQA
// (on the Hopper forward, and on the sm80 kernels' BlockSparseDropoutTuning
// shapes and their backward).
// NOTES: no mask that cuts blocks (causal, windows): a row could then see a
// single key, which dropout's tolerance has no room for (dropout_suite).
std::vector<Case> cuda_block_sparse_suite() {
  std::vector<Case> cases = block_sparse_suite({FA_F16, FA_BF16}, kHeadDims);
  uint64_t seed = 7100;
  for (int d : kHeadDims) {
    Case c = make_case(d % 64 == 0 ? FA_BF16 : FA_F16, 113, 203, d, seed++);
    c.block_q = 16;
    c.block_k = 32;  // every listed block holds >= 11 keys
    c.block_density = 0.5;
    c.dropout_p = 0.17f;
    if (d == 128) {
      c.heads_q = 8;
      c.heads_kv = 2;
      c.batch = 2;
    }
    cases.push_back(c);
  }
  return cases;
}

// One CUDA forward of c against the float64 reference.
void expect_cuda_forward_matches(const Case& c) {
  const Problem p = make_problem(c);
  VariantRun r;
  ASSERT_TRUE(run_cuda(p, false, r));
  expect_forward_matches(p, r.out, r.lse);
}

// One CUDA forward and backward of c, the gradients against the float64 reference.
void expect_cuda_backward_matches(const Case& c) {
  const Problem p = make_problem(c);
  VariantRun r;
  ASSERT_TRUE(run_cuda(p, true, r));
  expect_backward_matches(p, r.dq, r.dk, r.dv, r.dsinks);
}

class CudaBlockSparse : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBlockSparse, ForwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  expect_cuda_forward_matches(GetParam());
}

TEST_P(CudaBlockSparse, BackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  expect_cuda_backward_matches(GetParam());
}

// FLASHATTN_DISABLE_SM90 (read on every call): the sm80 kernels run.
struct Sm80Only {
  Sm80Only() { setenv("FLASHATTN_DISABLE_SM90", "1", 1); }
  ~Sm80Only() { unsetenv("FLASHATTN_DISABLE_SM90"); }
};

// The sm80 forward's walk, on a device whose forward is the Hopper kernel's.
TEST_P(CudaBlockSparse, Sm80ForwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const Sm80Only sm80;
  expect_cuda_forward_matches(GetParam());
}

// The sm80 backward's walk (ListedQueries), likewise: on a Hopper device the
// fixed-length calls above take the Hopper backward.
TEST_P(CudaBlockSparse, Sm80BackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  const Sm80Only sm80;
  expect_cuda_backward_matches(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Suite, CudaBlockSparse, ::testing::ValuesIn(cuda_block_sparse_suite()),
                         [](const auto& info) { return info.param.name(); });

// Shapes of several 128-row query tiles and key tiles (the Hopper forward's
// tiles: 128 keys at d 64 / 128, 112 at d 192, 80 at d 256): blocks of one
// tile (128 x 128), of tiles cut in part (64 x 96; 32 x 16, whose key blocks
// divide every key tile; 48 x 5, below the forward's kFastBlockKeys: the three
// forms of listed_key_bits) and of several tiles (256 x 160), so listed tiles are full,
// partial or skipped, query tiles may
// list no key tile at all (density 0.1), and a CTA's next tile starts inside
// the last turn of the one before; causal, GQA with per-head lists, fp16.
// The backward runs the Hopper kernel (its tiles are 64-128 queries x 64-128
// keys: whole at 128 x 128, tested per pair in the other shapes).
std::vector<Case> hopper_walk_cases() {
  std::vector<Case> cases;
  uint64_t seed = 6600;
  for (const int d : {64, 128, 192, 256}) {
    for (const double density : {0.1, 0.5}) {
      for (const auto [bq, bk] : std::vector<std::pair<int, int>>{{128, 128}, {64, 96}, {256, 160}, {32, 16}, {48, 5}}) {
        Case c = make_case(FA_BF16, 1023, 1400, d, seed++);
        c.block_q = bq;
        c.block_k = bk;
        c.block_density = density;
        cases.push_back(c);
      }
    }
    Case c = make_case(FA_F16, 1023, 1023, d, seed++);
    c.causal = true;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.block_q = 128;
    c.block_k = 128;
    c.block_density = 0.5;
    cases.push_back(c);
  }
  return cases;
}

class CudaBlockSparseWalk : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBlockSparseWalk, ForwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  expect_cuda_forward_matches(GetParam());
}

TEST_P(CudaBlockSparseWalk, BackwardMatchesFloat64Reference) {
  FA_REQUIRE_GPU();
  expect_cuda_backward_matches(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Hopper, CudaBlockSparseWalk, ::testing::ValuesIn(hopper_walk_cases()),
                         [](const auto& info) { return info.param.name(); });

// Every block listed: the Hopper forward walks every key tile of the dense
// call, each full, on the instantiation the dense call takes (two consumers,
// the short key tile: d 128 below 8k keys, d 256, d 64 causal), so the same
// bits come out. (A fallback to the sm80 kernel would not give them.)
TEST(CudaBlockSparseBitwise, HopperForwardAtDensityOneIsDense) {
  FA_REQUIRE_SM90();
  // (Both calls on the sm80 forward take different tile shapes, BlockSparseTuning.)
  if (cuda::sm90::disabled_by_env()) GTEST_SKIP() << "FLASHATTN_DISABLE_SM90: the Hopper forward is off";
  for (const int d : {64, 128, 256}) {
    Case c = make_case(FA_BF16, 1000, 1300, d, 6700 + d);
    c.causal = d == 64;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.block_q = 128;
    c.block_k = 96;
    c.block_density = 1.0;
    SCOPED_TRACE(c.name());
    Problem p = make_problem(c);
    VariantRun sparse, dense;
    ASSERT_TRUE(run_cuda(p, false, sparse));
    p.use_block_mask = false;
    ASSERT_TRUE(run_cuda(p, false, dense));
    expect_same_bytes(sparse.out, dense.out, "out");
    expect_same_bytes(sparse.lse, dense.lse, "lse");
  }
}

// Every block listed, blocks of the Hopper backward's tiles (queries x keys,
// sm90/bwd/tuning.h and traits.h: 128 x 128 at d 64, 64 x 128 at d 128, 64 x
// 64 at d 256), so every step of the block-sparse backward kernel is full.
// Bitwise equal to the dense call where both walk in one order: deterministic
// mode without rotated turns (causal here; plan_dq_turns), where the dense
// walk takes each key tile's query tiles ascending, head by head, as the
// host's steps do (group_steps), and dQ's adds into a query tile come from
// the highest key tile down in both. Without deterministic mode the dense
// walks are rotated (key tile n starts at query tile n % n_m; sm90/bwd/
// scheduler.cuh NOTES) and the listed ones are not, so dK and dV sum their
// query tiles in another order, and dQ's adds land in any order: there the
// gradients are checked against float64 only (non-causal: the rotated walk).
TEST(CudaBlockSparseBitwise, HopperBackwardAtDensityOneIsDense) {
  FA_REQUIRE_SM90();
  if (cuda::sm90::disabled_by_env()) GTEST_SKIP() << "FLASHATTN_DISABLE_SM90: the Hopper backward is off";
  struct Tiles {
    int d, block_q, block_k;
  };
  for (const auto [d, bq, bk] : {Tiles{64, 128, 128}, Tiles{128, 64, 128}, Tiles{256, 64, 64}}) {
    for (const bool deterministic : {true, false}) {
      Case c = make_case(FA_BF16, 555, 777, d, 6900 + d + deterministic);
      c.causal = deterministic;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.block_q = bq;
      c.block_k = bk;
      c.block_density = 1.0;
      SCOPED_TRACE(c.name() + (deterministic ? " deterministic" : ""));
      Problem p = make_problem(c);
      p.options.deterministic = deterministic;
      VariantRun sparse, dense;
      ASSERT_TRUE(run_cuda(p, true, sparse));
      expect_backward_matches(p, sparse.dq, sparse.dk, sparse.dv, sparse.dsinks);
      if (!deterministic) continue;
      p.use_block_mask = false;
      ASSERT_TRUE(run_cuda(p, true, dense));
      expect_same_results(sparse, dense);
    }
  }
}

// p with its block mask and without one, both deterministic on sm80: the same bits.
void expect_block_mask_is_dense(Problem p) {
  const Sm80Only sm80;
  p.options.deterministic = 1;
  VariantRun sparse, dense;
  ASSERT_TRUE(run_cuda(p, true, sparse));
  p.use_block_mask = false;
  ASSERT_TRUE(run_cuda(p, true, dense));
  expect_same_results(sparse, dense);
}

// Head dims whose block-sparse forward runs the dense tile shape. d 64 and
// d 128 take other shapes with a block mask (sm80/fwd/tuning.h,
// BlockSparseTuning): there out came out equal on the H100 but not the lse,
// nor, through it, the gradients; the suite checks them against float64.
const std::vector<int> kDenseShapeHeadDims = {96, 256};

// Every block listed: every tile is visited and full, so the walk is the
// dense one and so are the bits.
TEST(CudaBlockSparseBitwise, DensityOneIsDense) {
  FA_REQUIRE_GPU();
  int cases = 0;
  for (Case c : block_sparse_suite({FA_BF16}, {})) {
    if (c.block_density != 1.0 || c.dropout_p != 0.0f) continue;
    for (const int d : kDenseShapeHeadDims) {  // the suite's cases are at d 64
      c.head_dim = d;
      SCOPED_TRACE(c.name());
      expect_block_mask_is_dense(make_problem(c));
      ++cases;
    }
  }
  EXPECT_GE(cases, 20);
}

// create_block_mask's causal and sliding-window masks with the same element
// mask: the tiles they skip hold no visible pair, and a tile they cut takes
// the masked body, which drops only pairs the element mask drops too.
TEST(CudaBlockSparseBitwise, FlexCausalAndSlidingWindowMasksAreDense) {
  FA_REQUIRE_GPU();
  for (auto& [label, p] : flex_causal_window_problems(FA_BF16, kDenseShapeHeadDims, 6000)) {
    SCOPED_TRACE(label);
    expect_block_mask_is_dense(p);
  }
}

// The deterministic backward with a sparse mask (each key tile waits for the
// next-higher key tile that lists the query tile): bitwise the same run to
// run, and right.
TEST(CudaBlockSparseBitwise, DeterministicBackwardIsStable) {
  FA_REQUIRE_GPU();
  Case c = make_case(FA_BF16, 203, 203, 64, 6100);
  c.causal = true;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.block_q = 16;
  c.block_k = 48;
  c.block_density = 0.5;
  Problem p = make_problem(c);
  p.options.deterministic = 1;
  VariantRun a, b;
  ASSERT_TRUE(run_cuda(p, true, a));
  ASSERT_TRUE(run_cuda(p, true, b));
  expect_same_bytes(a.dq, b.dq, "dq");
  expect_same_bytes(a.dk, b.dk, "dk");
  expect_backward_matches(p, a.dq, a.dk, a.dv, a.dsinks);
}

// The deterministic backward on the Hopper kernel (blocks of 128 x 128 are
// whole on its tiles): each key tile waits for the next-higher key tile that
// lists and sees the query tile (BlockTiles::step_turns); 20 runs give one
// set of bits, and the right ones. Causal and not, per-head lists with GQA,
// densities 0.1 and 0.5, every kernel head dim.
TEST(CudaBlockSparseBitwise, HopperDeterministicBackwardIsStable) {
  FA_REQUIRE_GPU();
  uint64_t seed = 6800;
  for (const int d : {64, 128, 256}) {
    for (const double density : {0.1, 0.5}) {
      Case c = make_case(FA_BF16, 1000, 1300, d, seed++);
      c.causal = density == 0.5;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.block_q = 128;
      c.block_k = 128;
      c.block_density = density;
      SCOPED_TRACE(c.name());
      Problem p = make_problem(c);
      p.options.deterministic = 1;
      VariantRun first;
      ASSERT_TRUE(run_cuda(p, true, first));
      expect_backward_matches(p, first.dq, first.dk, first.dv, first.dsinks);
      for (int run = 1; run < 20; ++run) {
        VariantRun r;
        ASSERT_TRUE(run_cuda(p, true, r));
        ASSERT_EQ(r.dq.bytes, first.dq.bytes) << "dq, run " << run;
        ASSERT_EQ(r.dk.bytes, first.dk.bytes) << "dk, run " << run;
        ASSERT_EQ(r.dv.bytes, first.dv.bytes) << "dv, run " << run;
      }
    }
  }
}

// Writes NaN into the K and V rows of key blocks that no query block lists.
void poison_unlisted_keys(const Problem& p, const std::vector<bool>& listed, DeviceProblem& d) {
  const int64_t row_bytes = static_cast<int64_t>(p.c.head_dim) * 2;  // 16-bit elements
  std::vector<uint16_t> nan_row(static_cast<size_t>(p.c.head_dim), 0x7fc0);  // bf16 NaN
  for (int kb = 0; kb < static_cast<int>(listed.size()); ++kb) {
    if (listed[kb]) continue;
    for (int j = kb * p.c.block_k; j < std::min(p.c.seqlen_k, (kb + 1) * p.c.block_k); ++j) {
      for (int h = 0; h < p.c.heads_kv; ++h) {
        const int64_t offset = (static_cast<int64_t>(j) * p.c.heads_kv + h) * row_bytes;
        for (DeviceTensor* t : {&d.k, &d.v}) {
          cudaMemcpy(static_cast<char*>(t->memory.get()) + offset, nan_row.data(), row_bytes,
                     cudaMemcpyHostToDevice);
        }
      }
    }
  }
}

// Blocks of 128 keys (a multiple of every sm80 tile and of the Hopper
// forward's at d 64 / 128) or 320 at d 256 (the Hopper forward's key tile is
// 80 there, the sm80 backward's 64): key blocks nobody lists lie in tiles the
// kernels never load, so NaN there changes no bit.
TEST(CudaBlockSparseSkipping, UnlistedKeyTilesAreNeverRead) {
  FA_REQUIRE_GPU();
  for (int d : {64, 128, 256}) {
    Case c = make_case(FA_BF16, 300, d == 256 ? 1340 : 700, d, 6200 + d);
    c.block_q = 128;
    c.block_k = d == 256 ? 320 : 128;
    c.block_density = 1.0;
    c.block_shared = true;
    Problem p = make_problem(c);
    BlockClasses bc(c.block_q, c.block_k, 1, 1, c.seqlen_q, c.seqlen_k);
    std::vector<bool> listed(static_cast<size_t>(bc.k_blocks), false);
    const int last = bc.k_blocks - 1;
    for (int qb = 0; qb < bc.q_blocks; ++qb) {
      for (int kb = 0; kb < bc.k_blocks; ++kb) {
        // Key blocks 1 and the last (60 keys) listed by no query block.
        const bool on = kb != 1 && kb != last && (kb % 2 == qb % 2 || kb == 3);
        bc.at(0, 0, qb, kb) = on ? 1 + kb % 2 : 0;
      }
    }
    for (int kb = 0; kb < bc.k_blocks; ++kb)
      for (int qb = 0; qb < bc.q_blocks; ++qb) listed[kb] = listed[kb] || bc.at(0, 0, qb, kb) != 0;
    set_block_mask(p, bc);
    SCOPED_TRACE(c.name());
    VariantRun clean, poisoned;
    ASSERT_TRUE(run_cuda(p, true, clean));
    ASSERT_TRUE(run_cuda(p, true, poisoned, [&](DeviceProblem& dp) { poison_unlisted_keys(p, listed, dp); }));
    expect_same_bytes(clean.out, poisoned.out, "out");
    expect_same_bytes(clean.lse, poisoned.lse, "lse");
    expect_same_bytes(clean.dk, poisoned.dk, "dk");
    expect_same_bytes(clean.dv, poisoned.dv, "dv");
    expect_forward_matches(p, clean.out, clean.lse);
  }
}

// A small problem with a block mask and its poisoned output on the device.
struct ErrorCase {
  Problem p;
  DeviceProblem d;
  HostTensor out;
  DeviceTensor dout;
  explicit ErrorCase(uint64_t seed) : p(problem(seed)), d(p), out(p.poisoned_like_q()), dout(DeviceTensor::upload(out)) {}
  static Problem problem(uint64_t seed) {
    Case c = make_case(FA_BF16, 40, 50, 64, seed);
    c.block_q = 16;
    c.block_k = 16;
    c.block_density = 0.5;
    return make_problem(c);
  }
  fa_status forward(const fa_options& o, const fa_extras& x) {
    return fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout.desc, nullptr, nullptr, &o, &x);
  }
};

// The lists are read on the host: device-memory lists are refused (named),
// before anything is written.
TEST(CudaBlockSparseErrors, DeviceListsAreRefused) {
  FA_REQUIRE_GPU();
  ErrorCase e(6300);
  DeviceTensor num = DeviceTensor::upload(e.p.kv_num_blocks);
  fa_extras x = e.p.extras();
  fa_block_mask m = *x.block_mask;
  m.kv_num_blocks = &num.desc;
  x.block_mask = &m;
  EXPECT_EQ(e.forward(e.d.options(), x), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("block_mask.kv_num_blocks must be host memory"), std::string::npos)
      << fa_last_error();
  EXPECT_EQ(e.dout.download(e.out).bytes, e.out.bytes) << "out written";
}

// One forward and backward of p on `stream` into fixed device buffers (what a
// CUDA graph captures), with an explicit backward workspace.
struct StreamCalls {
  const Problem& p;
  DeviceProblem d;
  DeviceExtras x;
  DeviceTensor out, lse, dq, dk, dv;
  DeviceMemory workspace;
  size_t workspace_bytes = 0;
  fa_options o;
  StreamCalls(const Problem& problem, cudaStream_t stream)
      : p(problem), d(p), x(p), out(DeviceTensor::upload(p.poisoned_like_q())),
        lse(DeviceTensor::upload(p.poisoned_lse())), dq(DeviceTensor::upload(p.poisoned_like_q())),
        dk(DeviceTensor::upload(p.poisoned_like_k())), dv(DeviceTensor::upload(p.poisoned_like_k())),
        o(d.options()) {
    o.stream = stream;
    EXPECT_EQ(fa_backward_workspace_size(&d.q.desc, &d.k.desc, &d.v.desc, nullptr, &o, &workspace_bytes), FA_OK);
    workspace = device_alloc(workspace_bytes);
  }
  fa_status forward() {
    const fa_extras fx = x.forward(p);
    return fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &lse.desc, nullptr, &o, &fx);
  }
  fa_status backward() {
    const fa_extras bx = x.backward(p);
    return fa_backward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &d.dout.desc, &lse.desc, &dq.desc, &dk.desc,
                          &dv.desc, nullptr, &o, &bx, workspace.get(), workspace_bytes);
  }
  void poison() {
    for (auto [t, h] : {std::pair<DeviceTensor*, HostTensor>{&out, p.poisoned_like_q()}, {&lse, p.poisoned_lse()},
                        {&dq, p.poisoned_like_q()}, {&dk, p.poisoned_like_k()}, {&dv, p.poisoned_like_k()}}) {
      ASSERT_EQ(cudaMemcpy(t->desc.data, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  VariantRun results() {
    VariantRun r;
    r.out = out.download(p.poisoned_like_q());
    r.lse = lse.download(p.poisoned_lse());
    r.dq = dq.download(p.poisoned_like_q());
    r.dk = dk.download(p.poisoned_like_k());
    r.dv = dv.download(p.poisoned_like_k());
    return r;
  }
};

// A case whose lists no earlier call built (its seed makes its mask).
Problem capture_problem(uint64_t seed, int head_dim) {
  Case c = make_case(FA_BF16, 300, 410, head_dim, seed);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = head_dim == 64;
  c.block_q = 128;
  c.block_k = 128;
  c.block_density = 0.5;
  return make_problem(c);
}

// Under capture a mask's device lists must exist already (they cannot be
// copied from host memory inside a graph): a mask never called before is
// refused, naming what to do, and nothing is enqueued.
TEST(CudaBlockSparseGraph, CaptureWithoutWarmUpIsRefused) {
  FA_REQUIRE_GPU();
  const Problem p = capture_problem(6410, 64);
  cudaStream_t stream = nullptr;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  StreamCalls calls(p, stream);
  FA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const fa_status s = calls.forward();
  const std::string error = fa_last_error();
  cudaGraph_t graph = nullptr;
  FA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t nodes = 0;
  if (graph != nullptr) {
    cudaGraphGetNodes(graph, nullptr, &nodes);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
  EXPECT_EQ(s, FA_ERROR_UNSUPPORTED);
  EXPECT_NE(error.find("once before capturing"), std::string::npos) << error;
  EXPECT_EQ(nodes, 0u) << "nothing enqueued";
  EXPECT_EQ(calls.out.download(p.poisoned_like_q()).bytes, p.poisoned_like_q().bytes) << "out written";
}

// Warm-up calls build the lists; the forward and backward captured after them
// replay with those lists, also after more masks than the device cache keeps
// were called in between (a captured mask's lists are pinned), and give the
// eager calls' bits (out, lse, dk, dv; dq through atomics: against float64).
TEST(CudaBlockSparseGraph, CapturedCallsReplayTheirLists) {
  FA_REQUIRE_GPU();
  for (const int d : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const Problem p = capture_problem(6420 + d, d);
    cudaStream_t stream = nullptr;
    FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    StreamCalls calls(p, stream);
    ASSERT_EQ(calls.forward(), FA_OK) << fa_last_error();
    ASSERT_EQ(calls.backward(), FA_OK) << fa_last_error();
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const VariantRun eager = calls.results();
    expect_forward_matches(p, eager.out, eager.lse);
    expect_backward_matches(p, eager.dq, eager.dk, eager.dv, eager.dsinks);

    cudaGraph_t graph = nullptr;
    FA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const fa_status fwd = calls.forward();
    const std::string fwd_error = fa_last_error();
    const fa_status bwd = fwd == FA_OK ? calls.backward() : fwd;
    const std::string bwd_error = fa_last_error();
    FA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(fwd, FA_OK) << fwd_error;
    ASSERT_EQ(bwd, FA_OK) << bwd_error;
    cudaGraphExec_t exec = nullptr;
    FA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    // More masks than the device cache keeps, each called once eagerly.
    for (int other = 0; other < 16; ++other) {
      VariantRun r;
      ASSERT_TRUE(run_cuda(capture_problem(6500 + 16 * d + other, d), true, r));
    }
    for (int replay = 0; replay < 2; ++replay) {
      calls.poison();
      FA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      FA_CUDA_CHECK(cudaStreamSynchronize(stream));
      const VariantRun replayed = calls.results();
      expect_same_bytes(replayed.out, eager.out, "out");
      expect_same_bytes(replayed.lse, eager.lse, "lse");
      expect_same_bytes(replayed.dk, eager.dk, "dk");
      expect_same_bytes(replayed.dv, eager.dv, "dv");
      expect_backward_matches(p, replayed.dq, replayed.dk, replayed.dv, replayed.dsinks);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace flashattn::testing
