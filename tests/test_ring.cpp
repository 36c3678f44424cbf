// Ring attention on P simulated ranks (CPU backend): the zigzag layout and
// schedule, and forward/backward against the float64 reference and against
// single-device attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "test_ring_shards.h"

namespace flashattn::testing {
namespace {

using ring::PairKind;
using ring::StepCall;

TEST(RingLayout, ChunksPartitionTheSequence) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seqlen : {int64_t{2} * world, int64_t{7} * 2 * world + 3, int64_t{1023}}) {
      int64_t total = 0, expected_begin = 0;
      for (int c = 0; c < 2 * world; ++c) {
        const ring::Range r = ring::chunk_range(seqlen, world, c);
        EXPECT_EQ(r.begin, expected_begin);
        EXPECT_GE(r.size(), seqlen / (2 * world));
        EXPECT_LE(r.size(), seqlen / (2 * world) + 1);
        expected_begin = r.end;
      }
      EXPECT_EQ(expected_begin, seqlen);
      for (int r = 0; r < world; ++r) total += ring::local_seqlen(seqlen, world, r);
      EXPECT_EQ(total, seqlen);
    }
  }
}

TEST(RingLayout, PairKinds) {
  EXPECT_EQ(ring::pair_kind(3, 1, true), PairKind::kFull);
  EXPECT_EQ(ring::pair_kind(3, 3, true), PairKind::kDiagonal);
  EXPECT_EQ(ring::pair_kind(1, 3, true), PairKind::kEmpty);
  EXPECT_EQ(ring::pair_kind(1, 3, false), PairKind::kFull);
}

// Is block row k visible to local query row j under the step's call?
// (Causal calls are bottom-right aligned, as fa_forward's mask.)
bool call_sees(const StepCall& c, int64_t seqlen, int world, int rank, int src, int64_t j,
               int64_t k) {
  if (c.none) return false;
  auto half_rows = [&](int r, int begin, int end) {
    const int64_t first = ring::chunk_range(seqlen, world, ring::rank_chunk(world, r, 0)).size();
    const int64_t n = ring::local_seqlen(seqlen, world, r);
    return std::pair<int64_t, int64_t>{begin == 0 ? 0 : first, end == 1 ? first : n};
  };
  const auto [q0, q1] = half_rows(rank, c.q_begin, c.q_end);
  const auto [k0, k1] = half_rows(src, c.kv_begin, c.kv_end);
  if (j < q0 || j >= q1 || k < k0 || k >= k1) return false;
  return !c.causal || (k - k0) <= (j - q0) + ((k1 - k0) - (q1 - q0));
}

// Every step's call sees exactly the (query, key) pairs the global mask
// allows, so P steps see every visible pair once.
TEST(RingSchedule, EachStepSeesExactlyTheVisiblePairs) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seqlen : {int64_t{2} * world, int64_t{7} * 2 * world + 3}) {
      for (bool causal : {false, true}) {
        for (int rank = 0; rank < world; ++rank) {
          for (int src = 0; src < world; ++src) {
            const StepCall c = ring::plan_step(world, rank, src, causal);
            for (int64_t j = 0; j < ring::local_seqlen(seqlen, world, rank); ++j) {
              for (int64_t k = 0; k < ring::local_seqlen(seqlen, world, src); ++k) {
                const int64_t pq = zigzag_position(seqlen, world, rank, j);
                const int64_t pk = zigzag_position(seqlen, world, src, k);
                ASSERT_EQ(call_sees(c, seqlen, world, rank, src, j, k), !causal || pk <= pq)
                    << "world " << world << " seqlen " << seqlen << " rank " << rank << " src "
                    << src << " q " << pq << " k " << pk;
              }
            }
          }
        }
      }
    }
  }
}

// Zigzag's point: with a causal mask every rank attends to the same number
// of (query, key) pairs when 2P divides the length.
TEST(RingSchedule, CausalWorkIsBalanced) {
  for (int world = 2; world <= 8; ++world) {
    const int64_t seqlen = int64_t{2} * world * 5;
    std::vector<int64_t> pairs(world, 0);
    for (int rank = 0; rank < world; ++rank)
      for (int64_t j = 0; j < ring::local_seqlen(seqlen, world, rank); ++j)
        pairs[rank] += zigzag_position(seqlen, world, rank, j) + 1;
    EXPECT_EQ(*std::min_element(pairs.begin(), pairs.end()),
              *std::max_element(pairs.begin(), pairs.end()))
        << "world " << world;
  }
}

// ---- Numerics ----

struct RingCase {
  int world;
  bool causal;
  fa_dtype dtype;
  int heads_kv;  // heads_q = 4
};

std::string ring_case_name(const RingCase& r) {
  return "P" + std::to_string(r.world) + (r.causal ? "_causal_" : "_full_") +
         fa_dtype_name(r.dtype) + "_hkv" + std::to_string(r.heads_kv);
}

Case full_case(const RingCase& r) {
  Case c;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 7 * 2 * r.world + 3;  // chunks of 7 and 8 tokens
  c.heads_q = 4;
  c.heads_kv = r.heads_kv;
  c.head_dim = 40;
  c.dtype = r.dtype;
  c.causal = r.causal;
  c.seed = 17 + r.world;
  return c;
}

Options ring_options(const Problem& p) {
  Options o;
  o.causal = p.options.causal;
  o.softmax_scale = p.options.softmax_scale;
  o.softcap = p.options.softcap;
  o.backend = FA_BACKEND_CPU;
  o.num_threads = 1;  // the ranks are the threads
  return o;
}

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, MatchesFloat64ReferenceAndSingleDevice) {
  const Problem p = make_problem(full_case(GetParam()));
  HostMemory memory;
  const RingResult ring = run_ring(p, GetParam().world, ring_options(p),
                                   [](int) { return std::make_unique<HostMemory>(); });
  const RingResult single = run_single(p, ring_options(p), memory);
  expect_ring_matches(p, ring, single);
}

// Softcap and a custom scale pass through to every step's call.
TEST(RingAttentionOptions, SoftcapAndScale) {
  for (bool causal : {false, true}) {
    Case c = full_case({3, causal, FA_BF16, 2});
    c.softcap = 2.5f;
    c.scale = 0.4f;
    const Problem p = make_problem(c);
    HostMemory memory;
    const RingResult ring = run_ring(p, 3, ring_options(p),
                                     [](int) { return std::make_unique<HostMemory>(); });
    expect_ring_matches(p, ring, run_single(p, ring_options(p), memory));
  }
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> cases;
  for (int world = 1; world <= 4; ++world)
    for (bool causal : {false, true})
      for (fa_dtype dtype : {FA_F32, FA_BF16})
        for (int heads_kv : {4, 1}) cases.push_back({world, causal, dtype, heads_kv});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Suite, RingAttention, ::testing::ValuesIn(ring_cases()),
                         [](const auto& info) { return ring_case_name(info.param); });

// ---- Arguments ----

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RingArguments, BadInputsAreNamed) {
  const RingCase rc{2, true, FA_F32, 2};
  const Problem p = make_problem(full_case(rc));
  const int64_t seqlen = p.c.seqlen_q;
  ring::SimulatedRing sim(2);
  ring::Transport& t = sim.endpoint(0);
  HostTensor q = shard(p.q, 1, seqlen, 2, 0), k = shard(p.k, 1, seqlen, 2, 0);
  HostTensor v = shard(p.v, 1, seqlen, 2, 0), out = shard(p.q, 1, seqlen, 2, 0);
  HostTensor lse = shard(p.poisoned_lse(), 2, seqlen, 2, 0);
  const Options o = ring_options(p);
  // Rank 1's shard on rank 0 (7*4+3 tokens: ranks hold 15 and 16).
  expect_invalid([&] { ring::forward(t, seqlen + 2, q.desc, k.desc, v.desc, out.desc, lse.desc, o); },
                 "q has shape");
  expect_invalid([&] { ring::forward(t, 3, q.desc, k.desc, v.desc, out.desc, lse.desc, o); },
                 "seqlen 3");
  Options windowed = o;
  windowed.with_window(8, 0);
  expect_invalid(
      [&] { ring::forward(t, seqlen, q.desc, k.desc, v.desc, out.desc, lse.desc, windowed); },
      "window");
  fa_tensor strided = v.desc;
  strided.strides[1] *= 2;
  strided.shape[0] = 1;
  expect_invalid([&] { ring::forward(t, seqlen, q.desc, k.desc, strided, out.desc, lse.desc, o); },
                 "v has shape");
  fa_tensor bad_lse = lse.desc;
  bad_lse.dtype = FA_BF16;
  expect_invalid([&] { ring::forward(t, seqlen, q.desc, k.desc, v.desc, out.desc, bad_lse, o); },
                 "lse has dtype");
  fa_tensor null_k = k.desc;
  null_k.data = nullptr;
  expect_invalid([&] { ring::forward(t, seqlen, q.desc, null_k, v.desc, out.desc, lse.desc, o); },
                 "k is a null pointer");
  EXPECT_THROW(ring::SimulatedRing(0), Error);
}

TEST(RingArguments, NonContiguousIsRefused) {
  const Problem p = make_problem(full_case({1, false, FA_F32, 4}));
  ring::SimulatedRing sim(1);
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  fa_tensor q = p.q.desc;
  std::swap(q.strides[2], q.strides[3]);  // same shape, transposed heads and dims
  expect_invalid([&] {
    ring::forward(sim.endpoint(0), p.c.seqlen_q, q, p.k.desc, p.v.desc, out.desc, lse.desc,
                  ring_options(p));
  }, "q must be contiguous");
}

}  // namespace
}  // namespace flashattn::testing
