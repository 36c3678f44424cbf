// Zigzag shards of the harness's full-sequence tensors, and a driver running
// P simulated ranks on threads; shared by the CPU and GPU ring tests.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/harness.h"
#include "core/dtype.h"
#include "flashattn/ring.hpp"

namespace flashattn::testing {

// Sequence position of local row j of `rank`.
inline int64_t zigzag_position(int64_t seqlen, int world, int rank, int64_t j) {
  const ring::Range first = ring::chunk_range(seqlen, world, ring::rank_chunk(world, rank, 0));
  const ring::Range second = ring::chunk_range(seqlen, world, ring::rank_chunk(world, rank, 1));
  return j < first.size() ? first.begin + j : second.begin + (j - first.size());
}

// A contiguous tensor with `rows` along axis `axis` (1 of (b, s, h, d), 2 of
// an lse (b, h, s)): outer blocks before the axis, inner bytes after it.
struct RowAxis {
  int64_t outer = 0;
  size_t inner_bytes = 0;
};

inline RowAxis row_axis(const fa_tensor& t, int axis) {
  RowAxis a{1, dtype_size(t.dtype)};
  for (int d = 0; d < axis; ++d) a.outer *= t.shape[d];
  for (int d = axis + 1; d < t.ndim; ++d) a.inner_bytes *= static_cast<size_t>(t.shape[d]);
  return a;
}

// The local shard of `full` (rows along `axis`) that `rank` holds.
inline HostTensor shard(const HostTensor& full, int axis, int64_t seqlen, int world, int rank) {
  const RowAxis a = row_axis(full.desc, axis);
  const int64_t n = ring::local_seqlen(seqlen, world, rank);
  HostTensor t;
  t.desc = full.desc;
  t.desc.shape[axis] = n;
  int64_t stride = 1;
  for (int d = t.desc.ndim - 1; d >= 0; --d) t.desc.strides[d] = stride, stride *= t.desc.shape[d];
  t.bytes.resize(static_cast<size_t>(a.outer * n) * a.inner_bytes);
  t.rebind();
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(&t.bytes[(o * n + j) * a.inner_bytes],
                  &full.bytes[(o * seqlen + zigzag_position(seqlen, world, rank, j)) * a.inner_bytes],
                  a.inner_bytes);
  return t;
}

// Writes a rank's shard back into its rows of `full`.
inline void gather(const HostTensor& local, int axis, HostTensor& full, int64_t seqlen, int world,
                   int rank) {
  const RowAxis a = row_axis(full.desc, axis);
  const int64_t n = ring::local_seqlen(seqlen, world, rank);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(&full.bytes[(o * seqlen + zigzag_position(seqlen, world, rank, j)) * a.inner_bytes],
                  &local.bytes[(o * n + j) * a.inner_bytes], a.inner_bytes);
}

// One rank's work, given its transport.
using RankBody = std::function<void(int, ring::Transport&)>;
// Runs a RankBody on every rank of a ring of `world` ranks.
using Launcher = std::function<void(int world, const RankBody&)>;

// Runs rank_main(r) on `world` threads; a rank that throws calls abort()
// (to wake the others) and fails the test with its message.
inline void run_threads(int world, const std::function<void(int)>& rank_main,
                        const std::function<void()>& abort) {
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        rank_main(r);
      } catch (const std::exception& e) {
        abort();
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

// The ranks as threads over one SimulatedRing moving blocks with `copy`.
inline Launcher simulated_ring(ring::SimulatedRing::CopyFn copy = nullptr) {
  return [copy](int world, const RankBody& body) {
    ring::SimulatedRing ring(world, copy);
    run_threads(world, [&](int r) { body(r, ring.endpoint(r)); }, [&] { ring.abort(); });
  };
}

// Where a rank's tensors live: put() gives the descriptor a call uses for a
// host tensor (the host tensor itself, or a device copy); get() brings a
// result back into the host tensor it was put from.
class RankMemory {
 public:
  virtual ~RankMemory() = default;
  virtual fa_tensor put(HostTensor& h) = 0;
  virtual void get(HostTensor& h) = 0;
};

class HostMemory final : public RankMemory {
 public:
  fa_tensor put(HostTensor& h) override { return h.desc; }
  void get(HostTensor&) override {}
};

struct RingResult {
  HostTensor out, lse, dq, dk, dv;
};

inline RingResult poisoned_result(const Problem& p) {
  return {p.poisoned_like_q(), p.poisoned_lse(), p.poisoned_like_q(), p.poisoned_like_k(),
          p.poisoned_like_k()};
}

// Ring forward + backward of the problem's whole sequences over `world`
// ranks (`launch`); the ranks' results gathered into full-sequence tensors.
inline RingResult run_ring(const Problem& p, int world, const Options& options,
                           const std::function<std::unique_ptr<RankMemory>(int)>& memory_of_rank,
                           const Launcher& launch = simulated_ring()) {
  RingResult g = poisoned_result(p);
  const int64_t seqlen = p.c.seqlen_q;
  std::mutex mutex;
  launch(world, [&](int r, ring::Transport& t) {
    auto local = [&](const HostTensor& full, int axis) { return shard(full, axis, seqlen, world, r); };
    HostTensor q = local(p.q, 1), k = local(p.k, 1), v = local(p.v, 1), dout = local(p.dout, 1);
    HostTensor out = local(g.out, 1), lse = local(g.lse, 2), dq = local(g.dq, 1);
    HostTensor dk = local(g.dk, 1), dv = local(g.dv, 1);
    const std::unique_ptr<RankMemory> m = memory_of_rank(r);
    fa_tensor dq_t = m->put(dq), dk_t = m->put(dk), dv_t = m->put(dv);
    fa_tensor out_t = m->put(out), lse_t = m->put(lse);
    const fa_tensor q_t = m->put(q), k_t = m->put(k), v_t = m->put(v), dout_t = m->put(dout);
    ring::forward(t, seqlen, q_t, k_t, v_t, out_t, lse_t, options);
    ring::backward(t, seqlen, q_t, k_t, v_t, out_t, dout_t, lse_t, dq_t, dk_t, dv_t, options);
    for (HostTensor* h : {&out, &lse, &dq, &dk, &dv}) m->get(*h);
    std::lock_guard<std::mutex> lock(mutex);
    for (auto [part, full] : {std::pair{&out, &g.out}, std::pair{&dq, &g.dq},
                              std::pair{&dk, &g.dk}, std::pair{&dv, &g.dv}})
      gather(*part, 1, *full, seqlen, world, r);
    gather(lse, 2, g.lse, seqlen, world, r);
  });
  return g;
}

// Single-device attention on the whole sequences.
inline RingResult run_single(const Problem& p, const Options& options, RankMemory& m) {
  RingResult s = poisoned_result(p);
  HostTensor q = p.q, k = p.k, v = p.v, dout = p.dout;
  for (HostTensor* h : {&q, &k, &v, &dout}) h->rebind();
  fa_tensor out = m.put(s.out), lse = m.put(s.lse), dq = m.put(s.dq), dk = m.put(s.dk);
  fa_tensor dv = m.put(s.dv);
  const fa_tensor q_t = m.put(q), k_t = m.put(k), v_t = m.put(v), dout_t = m.put(dout);
  flashattn::forward(q_t, k_t, v_t, out, &lse, options);
  flashattn::backward(q_t, k_t, v_t, out, dout_t, lse, dq, dk, dv, options);
  for (HostTensor* h : {&s.out, &s.lse, &s.dq, &s.dk, &s.dv}) m.get(*h);
  return s;
}

// A q- or k-like tensor's values in the reference's canonical order.
inline std::vector<double> values_of(const HostTensor& t, const Problem& p) {
  std::vector<double> values;
  for (int64_t r = 0; r < int64_t{p.c.batch} * p.c.seqlen_q; ++r)
    for (int h = 0; h < t.desc.shape[2]; ++h)
      for (int col = 0; col < t.desc.shape[3]; ++col) values.push_back(read_row_element(t, r, h, col));
  return values;
}

// The ring's out, lse, dq, dk, dv against fp64 by the project's rule, and
// against single-device attention by the same rule with the single-device
// result as the baseline (the ring's error vs fp64 at most twice the
// single-device call's, + atol).
inline void expect_ring_matches(const Problem& p, const RingResult& ring, const RingResult& single) {
  const Expected e = expected_all(p);
  const double atol = default_atol(p.c.dtype);
  const std::vector<std::tuple<const char*, HostTensor RingResult::*, const std::vector<double>*,
                               const std::vector<double>*>>
      rows = {{"out", &RingResult::out, &e.exact.out, &e.naive.out},
              {"dq", &RingResult::dq, &e.exact_grad.dq, &e.naive_grad.dq},
              {"dk", &RingResult::dk, &e.exact_grad.dk, &e.naive_grad.dk},
              {"dv", &RingResult::dv, &e.exact_grad.dv, &e.naive_grad.dv}};
  for (const auto& [name, member, exact, naive] : rows) {
    const Comparison c = compare_rows(ring.*member, *exact, *naive, atol);
    EXPECT_TRUE(c.ok) << c.describe(name);
    const Comparison vs = compare_rows(ring.*member, *exact, values_of(single.*member, p), atol);
    EXPECT_TRUE(vs.ok) << vs.describe((std::string(name) + " vs single device").c_str());
  }
  const Comparison l = compare_lse(ring.lse, e.exact.lse, e.naive.lse, atol);
  EXPECT_TRUE(l.ok) << l.describe("lse");
}

}  // namespace flashattn::testing
