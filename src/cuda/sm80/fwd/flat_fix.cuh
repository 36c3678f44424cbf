// The sm80 forward's NaN/Inf fix as one flat loop inlined into the kernel,
// for the tile shapes whose K/V loop has no register to spare (tuning.h,
// NonfiniteFix::kFlatInline). The same rows as the out-of-line fix
// (fix_nonfinite_tile) are recomputed with the same steps (common/nonfinite.cuh:
// sum_row's, then store_out_row): a row's max score over its keys, then
// l = sum P and O = sum P v, then O / l and the lse.
//
// NOTES: ptxas weighs code by its loop depth when it hands out registers,
// uniform ones included, across the kernel's whole call graph, called or
// inlined alike. The out-of-line fix walks rows and in each row its keys
// (depth 2: hotter than the K/V loop), and the d128 kernel (255 registers)
// spilled 156 bytes with it, its uniform registers live at the top of the
// K/V loop down from 40 to 15 (sm_90a, -Xptxas -v, nvdisasm
// --print-life-ranges). Stand-ins after the K/V loop: one store in a loop
// nest of depth 2 spilled 28 bytes, eight 88 bytes (the uniform registers
// gone), 64 stores in one loop none. So nothing here nests: the rows to
// recompute come from write_out (a vote per row over the staged values, not
// a loop reading them back), and one loop steps through (row, pass, key).
// The operand rows come from the tile's own pointers (FwdCta::q, k, v;
// HeadView's rows from the parameters left 28 bytes), and kernel.cuh takes
// V's lane offset anew each tile (12 bytes without). docs/hardening.md item 3
// has the other attempts.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"

namespace flashattn::cuda::sm80 {

// CTA (every thread, after write_out returned true): out rows
// m0 + warp_row + k for the bits k of todo (this warp's rows stored Inf or
// NaN, write_out's warp_rows) recomputed. The keys are the mask's alone: the
// kernels with a block mask or dropout take the out-of-line fix (kernel.cuh
// checks).
template <class K, typename T>
__device__ __forceinline__ void fix_nonfinite_flat(const AttentionParams& p, const FwdCta<T>& cta, int warp_row,
                                                   uint32_t todo) {
  using nonfinite::detail::HeadView;
  __syncthreads();  // every thread's stores of the tile come first
  const HeadView hv(p, ListedPairs{}, cta.b, cta.h);
  const int lane = threadIdx.x % 32, d = p.head_dim;
  const auto row_of = [&](int k) { return cta.m0 + warp_row + k; };

  // One step per trip: a row's start, one key of its max pass (m) or of its
  // sum pass (l, o), the switch between the passes, or the row's end.
  // (The steps of nonfinite::detail::sum_row, one loop for its two.)
  nonfinite::detail::LaneRow q, kv;
  nonfinite::detail::RowSums r;
  int i = 0, j = 0, j_begin = 0, j_end = 0;
  bool started = false, sum_pass = false;
#pragma unroll 1
  while (todo != 0) {
    if (!started) {
      i = row_of(__ffs(todo) - 1);
      q.load(cta.q + static_cast<int64_t>(i - cta.m0) * p.q_row_stride, d, lane);
      j_begin = hv.mask.key_begin(i);
      j_end = hv.mask.key_end(i + 1);
      j = j_begin;
      r.m = -INFINITY;
      started = true;
      sum_pass = false;
    } else if (j < j_end) {  // the mask's keys of a row are contiguous: all visible
      kv.load(cta.k + j * p.k_row_stride, d, lane);
      float capped;
      const float s = hv.score(q.dot(kv), i, j, &capped);
      if (sum_pass) {
        const float pr = HeadView::prob(s, r.m);
        r.l += pr;
        kv.load(cta.v + j * p.v_row_stride, d, lane);
        r.o.add(pr, kv);  // every key, even at weight 0 (0 x NaN = NaN)
      } else {
        r.m = fmaxf(r.m, s);  // fmaxf drops NaN: its P in the sum pass is NaN
      }
      ++j;
    } else if (!sum_pass) {
      sum_pass = true;
      j = j_begin;
      r.l = 0.0f;
      r.o.zero();
    } else {
      nonfinite::detail::store_out_row<T>(hv, i, d, lane, r);
      todo &= todo - 1;
      started = false;
    }
  }
}

}  // namespace flashattn::cuda::sm80
