// CPU FlashAttention-2 forward: Q tiles outer (one work item each, spread over
// threads), K/V tiles inner, online softmax in f32, logsumexp written out.
// Extra memory: a few tiles per thread, never seqlen^2.
#include "core/backends.h"
#include "core/parallel.h"
#include "cpu/forward_tile.h"

namespace flashattn::cpu {
namespace {

// Rows of (sequence b, query head h) in q/k/v/out as the params lay them out.
struct StridedRows {
  const AttentionParams& p;
  int b, h, hk;
  SequenceInfo seq;
  MaskPolicy mask;
  const void* q_base;
  const void* k_base;
  const void* v_base;

  StridedRows(const AttentionParams& params, int b_, int h_)
      : p(params), b(b_), h(h_), hk(h_ / params.group_size()), seq(sequence_info(params, b_)),
        mask(mask_for(params, seq)), q_base(params.q), k_base(params.k), v_base(params.v) {}
  int64_t at(int64_t first_row, int r, int head, int64_t bs, int64_t rs, int64_t hs) const {
    return row_offset(b, first_row, r, head, bs, rs, hs, p.is_varlen());
  }
  int64_t q(int i) const { return at(seq.row_q, i, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride); }
  int64_t k(int j) const { return at(seq.row_k, j, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride); }
  int64_t v(int j) const { return at(seq.row_k, j, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride); }
  int64_t o(int i) const { return at(seq.row_q, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride); }
  int64_t lse(int i) const { return lse_offset(p, b, seq.row_q, i, h); }
};

}  // namespace

size_t forward_workspace_size(const AttentionParams& p) {
  const int threads = resolve_thread_count(p.num_threads);
  return static_cast<size_t>(threads) * ForwardScratch::bytes(p.head_dim);
}

fa_status forward(const AttentionParams& p) {
  const int q_tiles = ceil_div(p.seqlen_q, kBlockQ);
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads_q * q_tiles;
  const BlockLists blocks(p, false);
  for_each_tile(p, items, [&](int64_t item, ForwardScratch& w) {
    const int64_t bh = item / q_tiles;
    const StridedRows rows(p, static_cast<int>(bh / p.heads_q), static_cast<int>(bh % p.heads_q));
    forward_tile(p, rows, static_cast<int>(item % q_tiles), w, blocks);
  });
  return FA_OK;
}

}  // namespace flashattn::cpu
