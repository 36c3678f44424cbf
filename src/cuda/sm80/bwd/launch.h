// What the sm80 backward's pieces provide to its dispatcher (api.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::bwd {

// Device scratch of one backward call, carved from the workspace by api.cu.
struct Workspace {
  float* row_d = nullptr;     // D = rowsum(dO * O): [heads_q][total_q]
  float* dq_accum = nullptr;  // dQ in f32: [heads_q][total_q][kernel head dim]
  int* dq_sem = nullptr;      // deterministic mode: [batch][heads_q][q_tiles], zeroed
  int q_tiles = 0;            // query tiles per sequence (of the longest)
  int accum_dim = 0;          // kernel head dim (row length of dq_accum)
  // Per-call constants the kernel reads from its parameter space instead of
  // computing (and holding in registers): scale * log2(e), scale / softcap.
  float scale_log2 = 0.0f;
  float inv_softcap = 0.0f;

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
WorkspacePlan plan_workspace(const AttentionParams& p);
// The regions of `base` (plan.total() bytes) and the per-call constants; the
// caller zeroes the semaphores (plan.sem bytes at ws.dq_sem) before each call.
Workspace carve_workspace(const AttentionParams& p, const WorkspacePlan& plan, void* base);

// Main kernel for one kernel head dim and dtype (T = __half or __nv_bfloat16).
template <int D, typename T>
fa_status run_main(const AttentionParams& p, const Workspace& ws);

// D = rowsum(dO * O) and zeroed dQ accumulator; dQ accumulator -> dq.
template <typename T>
fa_status run_prepass(const AttentionParams& p, const Workspace& ws);
template <typename T>
fa_status run_postpass(const AttentionParams& p, const Workspace& ws);

}  // namespace flashattn::cuda::bwd
