// Zigzag shards of the harness's full-sequence tensors, and a driver running
// P simulated ranks on threads; shared by the CPU and GPU ring tests.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
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

// Runs body(rank, transport) on `world` threads over one SimulatedRing; a
// rank that throws aborts the ring and fails the test with its message.
inline void run_ranks(int world, const std::function<void(int, ring::Transport&)>& body,
                      ring::SimulatedRing::CopyFn copy = nullptr) {
  ring::SimulatedRing ring(world, std::move(copy));
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, ring.endpoint(r));
      } catch (const std::exception& e) {
        ring.abort();
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace flashattn::testing
