// A minimal parallel-for over [0, n) on std::threads (the CPU backend and the
// reference). Work items are claimed from an atomic counter, so uneven items
// (causal tiles) balance.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace flashattn {

inline int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// Threads to use for a requested count (0 = all hardware threads). Requests
// beyond a few per core only cost memory and start-up, so they are capped.
constexpr int kMaxThreadsPerCore = 4;
inline int resolve_thread_count(int requested) {
  const int hardware = default_thread_count();
  return requested > 0 ? std::min(requested, kMaxThreadsPerCore * hardware) : hardware;
}

// fn(item, thread_index) for every item; thread_index < the returned thread count.
template <typename Fn>
int parallel_for(int64_t n, int num_threads, Fn&& fn) {
  int threads = resolve_thread_count(num_threads);
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::atomic<int64_t> next{0};
  auto worker = [&](int t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, t);
  };
  if (threads == 1) {
    worker(0);
    return 1;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  return threads;
}

}  // namespace flashattn
