// The backward workspace: sizes and carving of one call's scratch regions.
#include "cuda/bwd/workspace.h"

#include "core/numeric.h"

namespace flashattn::cuda::bwd {
namespace {

constexpr size_t kAlign = 256;  // every workspace region starts 256-byte aligned
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

WorkspacePlan plan_workspace(const AttentionParams& p, int kernel_dim, int sem_block_m) {
  WorkspacePlan w;
  w.accum_dim = kernel_dim;
  const size_t rows = static_cast<size_t>(p.heads_q) * static_cast<size_t>(p.total_q);
  w.row_d = align_up(rows * sizeof(float));
  w.dq_accum = align_up(rows * w.accum_dim * sizeof(float));
  if (p.deterministic) {
    w.q_tiles = (p.seqlen_q + sem_block_m - 1) / sem_block_m;
    w.sem = align_up(static_cast<size_t>(p.batch) * p.heads_q * w.q_tiles * sizeof(int));
  }
  return w;
}

Workspace carve_workspace(const AttentionParams& p, const WorkspacePlan& w, void* base) {
  unsigned char* bytes = static_cast<unsigned char*>(base);
  Workspace ws;
  ws.row_d = reinterpret_cast<float*>(bytes);
  ws.dq_accum = reinterpret_cast<float*>(bytes + w.row_d);
  ws.dq_sem = p.deterministic ? reinterpret_cast<int*>(bytes + w.row_d + w.dq_accum) : nullptr;
  ws.q_tiles = w.q_tiles;
  ws.accum_dim = w.accum_dim;
  ws.scale_log2 = p.scale * kLog2e;
  ws.inv_softcap = p.softcap > 0.0f ? p.scale / p.softcap : 0.0f;
  ws.softcap_log2 = p.softcap > 0.0f ? p.softcap * kLog2e : 0.0f;
  ws.inv_softcap_log2 = p.softcap > 0.0f ? 1.0f / ws.softcap_log2 : 0.0f;
  return ws;
}

}  // namespace flashattn::cuda::bwd
