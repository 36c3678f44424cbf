// flashattn ring attention (context parallelism): a sequence split over P
// ranks, each holding a slice of Q, K, V; K/V blocks circulate around the ring
// and each rank merges the attention of its queries against every block (fp32
// online-softmax merge with the lse, src/attention/state.h). docs/ring.md.
//
// Layout ("zigzag"): each sequence of `seqlen` tokens is cut into 2P chunks
// whose sizes differ by at most one (chunk c covers [seqlen*c/2P,
// seqlen*(c+1)/2P)); rank r holds chunks r and 2P-1-r, concatenated, for Q, K
// and V alike. With a causal mask every rank then does the same work.
// Tensors are contiguous, fixed-length, flash-attn layout:
//   q, out, dout, dq  (batch, local_seqlen(seqlen, P, r), heads_q, head_dim)
//   k, v, dk, dv      (batch, local_seqlen(seqlen, P, r), heads_kv, head_dim)
//   lse               (batch, heads_q, local_seqlen) f32
// on the CPU or on one CUDA device per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "flashattn/flashattn.hpp"

namespace flashattn::ring {

// ---- The zigzag layout (plain functions; every rank computes the same) ----

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Chunk c of the 2*world chunks of a sequence of seqlen tokens.
inline Range chunk_range(int64_t seqlen, int world, int chunk) {
  const int64_t n = 2 * static_cast<int64_t>(world);
  return {seqlen * chunk / n, seqlen * (chunk + 1) / n};
}

// The chunk a rank holds in its first (half 0) or second (half 1) place.
inline int rank_chunk(int world, int rank, int half) { return half == 0 ? rank : 2 * world - 1 - rank; }

// Tokens of one sequence that rank `rank` holds.
inline int64_t local_seqlen(int64_t seqlen, int world, int rank) {
  return chunk_range(seqlen, world, rank_chunk(world, rank, 0)).size() +
         chunk_range(seqlen, world, rank_chunk(world, rank, 1)).size();
}

// How query chunk a sees key chunk b: chunks are ordered by position, so
// under a causal mask an earlier key chunk is seen whole, the same chunk is
// causal on its diagonal (equal lengths), a later one not at all.
enum class PairKind { kEmpty, kDiagonal, kFull };
inline PairKind pair_kind(int q_chunk, int kv_chunk, bool causal) {
  if (!causal || kv_chunk < q_chunk) return PairKind::kFull;
  return kv_chunk == q_chunk ? PairKind::kDiagonal : PairKind::kEmpty;
}

// The one attention call of a ring step: local query halves [q_begin, q_end)
// against the block's halves [kv_begin, kv_end), causal or not (half 0 is
// the first chunk a rank holds, half 1 the second). none: nothing visible.
struct StepCall {
  bool none = true;
  int q_begin = 0, q_end = 2;
  int kv_begin = 0, kv_end = 2;
  bool causal = false;
};

// Rank `rank` holding the K/V block of rank `src`. Every zigzag step is one
// rectangle of halves: all full, or the rank's own block (causal over the
// concatenation, which is exact because query and key positions coincide).
FA_API StepCall plan_step(int world, int rank, int src, bool causal);

// ---- Transport: moves byte blocks one hop around the ring ----

class FA_API Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sends send_bytes at `send` to rank + 1 and receives recv_bytes from
  // rank - 1 into `recv`, ordered after the work queued so far on `stream`
  // (cudaStream_t; null on the CPU) and not blocking it. `send` must stay
  // unchanged and `recv` untouched until finish().
  virtual void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                     void* stream) = 0;
  // Orders `stream` after every exchange started so far (CPU: returns when
  // they are complete).
  virtual void finish(void* stream) = 0;
};

// P virtual ranks in one process (one thread per rank drives its endpoint).
// `copy` moves bytes between ranks' buffers (memcpy by default; a device
// copy for ranks sharing one GPU).
class FA_API SimulatedRing {
 public:
  using CopyFn = std::function<void(void* dst, const void* src, size_t bytes)>;
  explicit SimulatedRing(int world, CopyFn copy = nullptr);
  ~SimulatedRing();
  SimulatedRing(const SimulatedRing&) = delete;
  SimulatedRing& operator=(const SimulatedRing&) = delete;
  Transport& endpoint(int rank);
  // Wakes every waiting endpoint with an error (a rank failed).
  void abort();

  struct Hub;  // opaque: the endpoints' shared mailboxes

 private:
  std::unique_ptr<Hub> hub_;
};

// ---- Ring attention (this rank's share; every rank calls it in step) ----

// out and lse of the local queries against the whole sequence (all ranks'
// keys). options: scale, causal, softcap, backend, stream, num_threads
// (windows are refused: a window crosses chunk boundaries).
FA_API void forward(Transport& transport, int64_t seqlen, const fa_tensor& q, const fa_tensor& k,
                    const fa_tensor& v, fa_tensor& out, fa_tensor& lse, const Options& options = {});

// Gradients of the local q, k, v, from the global out and lse of forward().
FA_API void backward(Transport& transport, int64_t seqlen, const fa_tensor& q, const fa_tensor& k,
                     const fa_tensor& v, const fa_tensor& out, const fa_tensor& dout,
                     const fa_tensor& lse, fa_tensor& dq, fa_tensor& dk, fa_tensor& dv,
                     const Options& options = {});

}  // namespace flashattn::ring
