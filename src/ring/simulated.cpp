// SimulatedRing: P endpoints in one process. An exchange is posted by the
// sender (start) and carried out by the receiver (finish), which copies from
// the previous rank's posted buffer and then waits until the next rank has
// copied its own: after finish() both buffers are free again, as after a
// completed NCCL send/recv pair.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "flashattn/ring.hpp"

namespace flashattn::ring {

namespace {
struct Posted {
  const void* data;
  size_t bytes;
};
struct Pending {
  void* data;
  size_t bytes;
};
}  // namespace

struct SimulatedRing::Hub {
  struct Rank {
    std::deque<Posted> outbox;  // sends not yet copied by the next rank
    std::deque<Pending> inbox;  // receives not yet carried out
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Rank> ranks;
  CopyFn copy;
  bool aborted = false;
  std::vector<std::unique_ptr<Transport>> endpoints;

  void wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
    changed.wait(lock, [&] { return aborted || ready(); });
    if (aborted) throw Error(FA_ERROR_INTERNAL, "simulated ring aborted (another rank failed)");
  }
};

namespace {

class Endpoint final : public Transport {
 public:
  Endpoint(SimulatedRing::Hub* hub, int rank, int world) : hub_(hub), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
             void*) override;
  void finish(void*) override;

 private:
  SimulatedRing::Hub* hub_;
  int rank_, world_;
};

}  // namespace

void Endpoint::start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void*) {
  std::lock_guard<std::mutex> lock(hub_->mutex);
  hub_->ranks[rank_].outbox.push_back({send, send_bytes});
  hub_->ranks[rank_].inbox.push_back({recv, recv_bytes});
  hub_->changed.notify_all();
}

void Endpoint::finish(void*) {
  auto& me = hub_->ranks[rank_];
  auto& prev = hub_->ranks[(rank_ - 1 + world_) % world_];
  std::unique_lock<std::mutex> lock(hub_->mutex);
  while (!me.inbox.empty()) {
    hub_->wait(lock, [&] { return !prev.outbox.empty(); });
    const Posted from = prev.outbox.front();
    const Pending to = me.inbox.front();
    if (from.bytes != to.bytes) {
      hub_->aborted = true;
      hub_->changed.notify_all();
      throw Error(FA_ERROR_INTERNAL, "simulated ring: rank " + std::to_string(rank_) +
                                         " expects " + std::to_string(to.bytes) +
                                         " bytes, its predecessor sends " +
                                         std::to_string(from.bytes));
    }
    hub_->copy(to.data, from.data, to.bytes);
    prev.outbox.pop_front();
    me.inbox.pop_front();
    hub_->changed.notify_all();
  }
  hub_->wait(lock, [&] { return me.outbox.empty(); });
}

SimulatedRing::SimulatedRing(int world, CopyFn copy) : hub_(std::make_unique<Hub>()) {
  if (world < 1) {
    throw Error(FA_ERROR_INVALID_ARGUMENT,
                "SimulatedRing: world " + std::to_string(world) + " must be >= 1");
  }
  hub_->ranks.resize(static_cast<size_t>(world));
  hub_->copy = copy ? std::move(copy) : [](void* dst, const void* src, size_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  };
  for (int r = 0; r < world; ++r) hub_->endpoints.push_back(std::make_unique<Endpoint>(hub_.get(), r, world));
}

SimulatedRing::~SimulatedRing() = default;

Transport& SimulatedRing::endpoint(int rank) {
  if (rank < 0 || rank >= static_cast<int>(hub_->endpoints.size())) {
    throw Error(FA_ERROR_INVALID_ARGUMENT, "SimulatedRing: rank " + std::to_string(rank) +
                                               " out of [0, " +
                                               std::to_string(hub_->endpoints.size()) + ")");
  }
  return *hub_->endpoints[static_cast<size_t>(rank)];
}

void SimulatedRing::abort() {
  std::lock_guard<std::mutex> lock(hub_->mutex);
  hub_->aborted = true;
  hub_->changed.notify_all();
}

}  // namespace flashattn::ring
