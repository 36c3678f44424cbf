// The backward's shared parts, whichever main kernel runs (sm80 or sm90): the
// workspace (D rows, the f32 dQ accumulator, deterministic-mode semaphores)
// and the pre/post passes around the main kernel (passes.cu):
//   pre:  D = rowsum(dO * O), dQ accumulator zeroed
//   post: dQ accumulator -> dq in the input dtype
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {
struct ListedPairs;
}  // namespace flashattn::cuda

namespace flashattn::cuda::bwd {

// Device scratch of one backward call, carved from the workspace by dispatch.cu.
struct Workspace {
  float* row_d = nullptr;     // D = rowsum(dO * O): [heads_q][total_q]
  float* dq_accum = nullptr;  // dQ in f32: [heads_q][total_q][kernel head dim]
  int* dq_sem = nullptr;      // deterministic mode: [batch][heads_q][q_tiles], zeroed
  int q_tiles = 0;            // query tiles per sequence (of the longest)
  int accum_dim = 0;          // kernel head dim (row length of dq_accum)
  // Per-call constants the kernel reads from its parameter space instead of
  // computing (and holding in registers): scale * log2(e), scale / softcap,
  // softcap * log2(e) and its inverse (0 without softcap).
  float scale_log2 = 0.0f;
  float inv_softcap = 0.0f;
  float softcap_log2 = 0.0f;
  float inv_softcap_log2 = 0.0f;
  // Deterministic mode, set by the Hopper launcher: 1 when every key tile of
  // a head runs at once, so the dQ turns may follow the rotated walks
  // (attention/work_plan.h, rotated_dq_turn); 0: highest key tile first.
  int rotated_turns = 0;

  // Deterministic mode: the counter of query tile m of (sequence b, query head h).
  FA_HOST_DEVICE int* dq_semaphore(const AttentionParams& p, int b, int h, int m) const {
    return dq_sem + (static_cast<int64_t>(b) * p.heads_q + h) * q_tiles + m;
  }
};

// Byte sizes of the workspace regions of one call (each 256-byte aligned):
// D rows, the f32 dQ accumulator and, in deterministic mode, the semaphores.
struct WorkspacePlan {
  size_t row_d = 0, dq_accum = 0, sem = 0;
  int accum_dim = 0, q_tiles = 0;
  size_t total() const { return row_d + dq_accum + sem; }
};
// kernel_dim: the dQ accumulator row (the kernel head dim); sem_block_m: query
// rows per dQ semaphore (deterministic mode).
WorkspacePlan plan_workspace(const AttentionParams& p, int kernel_dim, int sem_block_m);
// The regions of `base` (plan.total() bytes) and the per-call constants; the
// caller zeroes the semaphores (plan.sem bytes at ws.dq_sem) before each call.
Workspace carve_workspace(const AttentionParams& p, const WorkspacePlan& plan, void* base);

// D = rowsum(dO * O) and zeroed dQ accumulator; dQ accumulator -> dq.
template <typename T>
fa_status run_prepass(const AttentionParams& p, const Workspace& ws);
// pairs: the block mask's (common/block_sparse.cuh; empty without one), for
// the post-pass's exact recompute of non-finite dq rows (common/nonfinite.cuh).
template <typename T>
fa_status run_postpass(const AttentionParams& p, const Workspace& ws, const ListedPairs& pairs);
// The same for a call without a block mask.
template <typename T>
fa_status run_postpass(const AttentionParams& p, const Workspace& ws);
// With sinks: dL/dsinks from the pre-pass's D and the lse (sinks.cu); no-op otherwise.
fa_status run_sink_grad(const AttentionParams& p, const Workspace& ws);

}  // namespace flashattn::cuda::bwd
