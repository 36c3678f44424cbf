// A minimal parallel-for over [0, n) on std::threads (the CPU backend and the
// reference). Work items are claimed from an atomic counter, so uneven items
// (causal tiles) balance.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
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

// Starts worker threads; a test substitutes one that fails.
struct StdThreadStarter {
  template <typename Fn>
  std::thread operator()(Fn&& fn, int index) const {
    return std::thread(std::forward<Fn>(fn), index);
  }
};

// fn(item, thread_index) for every item; thread_index < the returned thread count.
// NOTES: a thread that cannot be started (std::system_error: out of threads
// or memory) is not an error: items are claimed from a shared counter, so the
// threads already running, the caller's included, finish them all. Joining
// every started thread before returning is what keeps a failed start from
// destroying a joinable std::thread (std::terminate).
template <typename Fn, typename Starter = StdThreadStarter>
int parallel_for(int64_t n, int num_threads, Fn&& fn, const Starter& start = Starter{}) {
  int threads = resolve_thread_count(num_threads);
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::atomic<int64_t> next{0};
  auto worker = [&](int t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, t);
  };
  std::vector<std::thread> pool;
  try {
    pool.reserve(threads - 1);
    for (int t = 1; t < threads; ++t) pool.push_back(start(worker, t));
  } catch (const std::exception&) {
    // Fewer threads: the started ones and this one share the items.
  }
  worker(0);
  for (auto& th : pool) th.join();
  return static_cast<int>(pool.size()) + 1;
}

}  // namespace flashattn
