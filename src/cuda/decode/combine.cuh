// Merges the splits' partials (normalised O, lse) of each row into out and lse.
//
// NOTES: one CTA per row (b, h, i). Each warp folds attention/state.h's merge over
// the splits' lse and the head's sink (a lane per split, the sink in lane 0,
// then a butterfly over the lanes), so the exponentials run once per split;
// the weights e^{lse_s - m} / l (merge_weight, written by warp 0) then scale
// each split's O (the sink has none), which the CTA reads as float4
// columns with the splits dealt over thread groups, every load independent of
// the others and the first ones issued before the weights are known. A split whose lse is NaN (indices out of range) makes the row NaN.
// Launched right behind the decode kernel (programmatic dependent launch), it
// waits for that grid before reading the partials, and lets whatever follows
// launch as early in turn.
#pragma once

#include <cstdint>

#include "attention/state.h"
#include "cuda/decode/common.cuh"

namespace flashattn::cuda::decode {

// The merged state of the row's splits and `sink` (sink_state); weight_s[s]
// receives split s's weight from warp 0. Every warp runs it (each gets the same state).
// NOTES: with warp 0 alone running it (the others skipping it at a branch),
// the sm_80 build put 8 bytes of the d128 instance on the stack (local memory;
// -Xptxas -v, CUDA 13); with every warp running it no decode kernel has a
// stack frame on sm_80 or sm_90a.
__device__ __forceinline__ RowState merge_split_states(const Work& w, int64_t row, int64_t split_rows,
                                                       RowState sink, float* weight_s) {
  constexpr int kPerLane = kMaxSplits / 32;
  const int lane = threadIdx.x % 32;
  float lse[kPerLane];
  RowState st = lane == 0 ? sink : RowState::empty();
  bool nan = false;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int s = lane + 32 * k;
    lse[k] = s < w.splits ? w.partial_lse[s * split_rows + row] : -INFINITY;
    nan |= lse[k] != lse[k];
    st = merge_factors(st, RowState::from_lse(lse[k]), OutputForm::kNormalized).merged;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const RowState other{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.l, offset)};
    st = merge_factors(st, other, OutputForm::kNormalized).merged;
  }
  if (__any_sync(0xffffffffu, nan)) st = RowState{NAN, NAN};  // the merge may drop a NaN m
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int s = lane + 32 * k;
    if (threadIdx.x < 32 && s < w.splits) weight_s[s] = merge_weight(st, lse[k]);
  }
  return st;
}

template <typename T, int HeadDim>
__global__ void __launch_bounds__(kThreads) combine_kernel(const KvCacheParams p, const Work w) {
  constexpr int kLanes = HeadDim / 4;         // float4 columns of a row
  constexpr int kGroups = kThreads / kLanes;  // the splits are dealt over these
  static_assert(kMaxSplits % 32 == 0 && kThreads % kLanes == 0, "combine mapping");
  __shared__ float weight_s[kMaxSplits];
  __shared__ float lse_s;
  __shared__ float4 sum_s[kGroups][kLanes];
  // The next call's decode kernel may launch before this one waits: its CTAs
  // take the slots the decode grid frees and prefetch their first tiles
  // (kernel.cuh, prefetch_before_wait) while this merge waits and runs; they
  // wait for this grid, which ends after the decode grid it waits for.
  allow_dependent_launch();
  wait_for_prior_grid();
  const AttentionParams& a = p.attn;
  const int64_t row = blockIdx.x;  // (b, h, i)
  const int i = static_cast<int>(row % a.seqlen_q);
  const int h = static_cast<int>(row / a.seqlen_q % a.heads_q);
  const int b = static_cast<int>(row / a.seqlen_q / a.heads_q);
  const int64_t split_rows = int64_t{a.batch} * a.heads_q * a.seqlen_q;
  // The first kCombinePrefetch splits of each thread are loaded before the
  // weights exist, so their latency overlaps warp 0's round trip for the lse.
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes, c = lane * 4;
  const bool column_ok = c < a.head_dim;
  const float* o = w.partial_o + row * a.head_dim + c;
  auto split_o = [&](int s) { return *reinterpret_cast<const float4*>(o + s * split_rows * a.head_dim); };
  float4 early[kCombinePrefetch];
#pragma unroll
  for (int k = 0; k < kCombinePrefetch; ++k) {
    const int s = group + k * kGroups;
    early[k] = column_ok && s < w.splits ? split_o(s) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  {
    const RowState st = merge_split_states(w, row, split_rows, sink_state(a, h), weight_s);
    if (threadIdx.x == 0) lse_s = st.lse();
  }
  __syncthreads();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto accumulate = [&](float wt, float4 x) {
    acc.x += wt * x.x;
    acc.y += wt * x.y;
    acc.z += wt * x.z;
    acc.w += wt * x.w;
  };
#pragma unroll
  for (int k = 0; k < kCombinePrefetch; ++k) {
    const int s = group + k * kGroups;
    if (s < w.splits) accumulate(weight_s[s], early[k]);
  }
  if (column_ok) {
#pragma unroll 4
    for (int s = group + kCombinePrefetch * kGroups; s < w.splits; s += kGroups) accumulate(weight_s[s], split_o(s));
  }
  sum_s[group][lane] = acc;
  __syncthreads();
  if (group == 0 && column_ok) {
    for (int gr = 1; gr < kGroups; ++gr) accumulate(1.0f, sum_s[gr][lane]);
    T* out = static_cast<T*>(a.out) + b * a.o_batch_stride + i * a.o_row_stride + h * a.o_head_stride + c;
    out[0] = from_float<T>(acc.x);
    out[1] = from_float<T>(acc.y);
    out[2] = from_float<T>(acc.z);
    out[3] = from_float<T>(acc.w);
  }
  if (threadIdx.x == 0 && a.lse != nullptr) {
    a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + i * a.lse_row_stride] = lse_s;
  }
}

}  // namespace flashattn::cuda::decode
