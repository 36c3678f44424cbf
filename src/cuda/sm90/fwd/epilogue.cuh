// The Hopper forward's epilogue: O / l and the logsumexp of a finished tile,
// stored through shared memory and TMA (kOTma) or straight from registers; in
// the split-tail kernel, the parts of a tile cut along the keys merged first.
// Rows stored Inf or NaN are recomputed exactly (common/nonfinite.cuh), once
// the consumer's walk is over (fix_after_walk).
#pragma once

#include <cmath>

#include "attention/state.h"
#include "attention/score_mod.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/common/named_barrier.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/tma_store.h"
#include "cuda/sm90/fwd/traits.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// 4x4 transpose of 32-bit values across the 4 lanes of a quad (t = lane % 4):
// on entry v[c] is element (t, c), on exit element (c, t). Two butterfly
// stages: across lane bit 0 the lanes swap the slots whose bit 0 differs from
// theirs, then the same across bit 1. Every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int lane) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = (lane & bit) != 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (c & bit) continue;  // the pair (c, c | bit)
      const uint32_t recv = __shfl_xor_sync(0xffffffff, upper ? v[c] : v[c | bit], bit);
      if (upper) {
        v[c] = recv;
      } else {
        v[c | bit] = recv;
      }
    }
  }
}

// Split tail (attention/work_plan.h): this warp's part of a tail tile (its 16 rows'
// unnormalized O, row max and row sum) goes to the part's slot; the warp that
// completes the tile's last part merges every part into o, m, l and returns
// true. The others return false: their rows are not theirs to store.
// Slots: [tail tile][part][consumer warp][float4 i][lane], O then (m0, m1, l0, l1).
// This lane's float4s of part `part`'s slot (O, then (m, l) at kVecs * 32).
template <int D>
__device__ __forceinline__ float4* split_slot(const FwdArgs& a, const SplitSegment& seg, int part, int warp_slot,
                                              int num_warps, int lane) {
  constexpr int kVecs = D / 8;  // float4s of O per thread; the (m, l) one follows
  const size_t s = (static_cast<size_t>(seg.tile) * a.tail.max_parts + part) * num_warps + warp_slot;
  return reinterpret_cast<float4*>(a.part_o) + s * (kVecs + 1) * 32 + lane;
}

template <int D>
__device__ __forceinline__ bool merge_split_part(const FwdArgs& a, const SplitSegment& seg, int warp_slot,
                                                 int num_warps, int lane, float (&o)[D / 2],
                                                 float (&m)[2], float (&l)[2]) {
  constexpr int kVecs = D / 8;
  auto slot = [&](int part) { return split_slot<D>(a, seg, part, warp_slot, num_warps, lane); };
  float4* mine = slot(seg.part);
#pragma unroll
  for (int i = 0; i < kVecs; ++i)
    __stcg(mine + i * 32, make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]));
  __stcg(mine + kVecs * 32, make_float4(m[0], m[1], l[0], l[1]));
  __threadfence();  // this part's slot is visible before the count says so
  __syncwarp();
  int finished = 0;
  if (lane == 0) {
    // The counters were zeroed by the main kernel: wait until it has completed
    // (a no-op without a programmatic launch, or once it has).
    grid_dependency_wait();
    finished = atomicAdd(&a.part_count[seg.tile * num_warps + warp_slot], 1);
  }
  finished = __shfl_sync(0xffffffff, finished, 0);
  if (finished != seg.parts - 1) return false;
  __threadfence();
  // The parts merged in part order with the one online-softmax merge
  // (attention/state.h; a part's m is its raw row max, so m * logit_scale
  // is the max logit), so the result does not depend on which part finished
  // last. A part whose rows saw no key (m -inf) is the merge's identity.
  RowState st[2] = {RowState::empty(), RowState::empty()};
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  for (int j = 0; j < seg.parts; ++j) {
    const float4* src = slot(j);
    const float4 ml = __ldcg(src + kVecs * 32);
    const MergeFactors f0 = merge_factors(st[0], {ml.x * a.logit_scale, ml.z}, OutputForm::kUnnormalized);
    const MergeFactors f1 = merge_factors(st[1], {ml.y * a.logit_scale, ml.w}, OutputForm::kUnnormalized);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const float4 v = __ldcg(src + i * 32);
      o[4 * i] = o[4 * i] * f0.a + v.x * f0.b;
      o[4 * i + 1] = o[4 * i + 1] * f0.a + v.y * f0.b;
      o[4 * i + 2] = o[4 * i + 2] * f1.a + v.z * f1.b;
      o[4 * i + 3] = o[4 * i + 3] * f1.a + v.w * f1.b;
    }
    st[0] = f0.merged;
    st[1] = f1.merged;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m[r] = st[r].is_empty() ? -INFINITY : st[r].m / a.logit_scale;
    l[r] = st[r].l;
  }
  return true;
}

// The rare path of the NaN/Inf rules (common/nonfinite.cuh), one warp: the
// walk's tiles again (work_at is a function of the step), and of each the
// warp's 16 rows (row_off on from the tile's first) that came out non-finite,
// recomputed. A tile split along the keys is stored by the warp that merged
// it (of any CTA): a warp visits one only where its own part's slot says it
// merged it and found an Inf or NaN (a NaN m there, written by finish()).
// Walk: the kernel's (scheduler.cuh); a block mask's rows see only the pairs
// its lists `blocks` hold.
template <class K, typename T, bool kSplit, class Walk>
__device__ __forceinline__ void fix_walk_rows_of(const AttentionParams& p, const FwdArgs& a,
                                                 const typename Walk::Tiles& blocks, int row_off, int warp_slot) {
  for (int step = 0; step < a.num_steps; ++step) {
    TileWork w;
    SplitSegment seg;
    if (!work_at<K::kBlockM, K::kBlockN, kSplit, K::kCache, Walk>(p, a, blocks, step, w, seg) || !w.valid) continue;
    if (kSplit && seg.parts > 1) {
      const float4 ml = __ldcg(split_slot<K::kHeadDim>(a, seg, seg.part, warp_slot, 4 * K::kConsumers, 0) +
                               K::kHeadDim / 8 * 32);
      if (!isnan(ml.x)) continue;  // not merged here, or merged finite
    }
    const int row0 = w.m0 + row_off, rows = min(16, w.seq.seqlen_q - row0);
    const auto pairs = nonfinite::pairs_of<K::kBlockM, K::kBlockN>(blocks);
    if constexpr (K::kCache) {
      // A sequence whose indices the device found out of range stays NaN (finish()).
      if (w.seq.seqlen_k < 0) continue;
      if (a.pages.block_table != nullptr) {
        nonfinite::fix_out_rows<T>(p, pairs, w.b, w.h, row0, rows,
                                   nonfinite::PagedKeys(a.pages.block_table, a.pages.table_stride, a.pages.page_shift));
      } else {
        nonfinite::fix_out_rows<T>(p, pairs, w.b, w.h, row0, rows, nonfinite::CacheKeys{});
      }
    } else {
      nonfinite::fix_out_rows<T>(p, pairs, w.b, w.h, row0, rows);
    }
  }
}

// Out of line, one per walk: the plain kernels' call takes no lists.
template <class K, typename T, bool kSplit>
__device__ __noinline__ void fix_walk_rows(const AttentionParams& p, const FwdArgs& a, int row_off, int warp_slot) {
  fix_walk_rows_of<K, T, kSplit, DenseKeys>(p, a, DenseKeys::Tiles{}, row_off, warp_slot);
}
template <class K, typename T>
__device__ __noinline__ void fix_listed_walk_rows(const AttentionParams& p, const FwdArgs& a, const BlockTiles& blocks,
                                                  int row_off, int warp_slot) {
  fix_walk_rows_of<K, T, false, ListedKeys>(p, a, blocks, row_off, warp_slot);
}

// NOTES: with kOTma (not varlen: a TMA box would spill into the next
// sequence's rows), O goes to shared memory in the 128B-swizzled layout of the
// O tensor map and one thread stores it with TMA, which clips rows past
// seqlen_q and columns past head_dim; otherwise straight from registers (16
// bytes per lane after a quad transpose). Where it fits, TMA measured +1-3% at
// d128 / d64: the register stores stalled the consumer warps and half-filled
// 32-byte sectors.
template <class K, typename T, bool kSplit>
struct Epilogue {
  static constexpr int D = K::kHeadDim;
  const CUtensorMap* tma_o;
  const AttentionParams& p;
  const FwdArgs& a;
  uint8_t* so;  // this consumer warpgroup's O staging (kOTma)
  int cw, tid, warp, lane;

  // O of one tile through this warpgroup's shared-memory staging and a TMA
  // store: po holds O / l as the stmatrix operands (bf16/fp16 pairs). Row rr
  // of the 64 at byte rr * 128 of each 64-column block; its 16-byte chunk c
  // sits at chunk c ^ (rr % 8) (the 128B swizzle). One stmatrix.x4 per 16
  // columns of the warp's 16 rows (8 at d128, instead of 32 4-byte stores):
  // matrix q = lane / 8 is rows 8 (q % 2) .. +7 at chunk i + q / 2; i is even,
  // so that chunk's swizzle is (i % 8) ^ x with x = (q / 2) ^ (rr % 8) fixed
  // per lane.
  __device__ __forceinline__ void store_o_tma(const uint32_t (&po)[D / 4], int wg_row0, int h, int b) const {
    const uint32_t o_bar = K::kOBarrier0 + cw;
    // The previous tile's store must have read the buffer.
    if (tid == 0) tma_store_wait_read();
    named_sync(o_bar, 128);
    const int q = lane / 8;
    const int rr = warp * 16 + (q % 2) * 8 + lane % 8;
    const uint32_t row_base = smem_addr(so) + rr * 128;
    const int x = (q / 2) ^ (lane % 8);
#pragma unroll
    for (int i = 0; i < D / 8; i += 2) {
      stmatrix_x4(row_base + (i / 8) * 64 * 128 + (((i % 8) ^ x) << 4), po[2 * i], po[2 * i + 1], po[2 * i + 2],
                  po[2 * i + 3]);
    }
    fence_proxy_async_smem();
    named_sync(o_bar, 128);
    if (tid == 0 && wg_row0 >= 0) {
#pragma unroll
      for (int c = 0; c < K::kColBlocks; ++c)
        if (c * 64 < p.head_dim) tma_store_4d(tma_o, so + c * 64 * 128, c * 64, wg_row0, h, b);
      tma_store_commit();
    }
  }

  // After the consumer's walk (the mainloop's last TMA store waited for by
  // its thread 0; nothing in flight): where a warp of the warpgroup stored an
  // Inf or NaN (`nonfinite`, from finish()), every warp checks the rows it
  // stored and recomputes the non-finite ones (nonfinite::fix_walk_rows).
  // NOTES: at the end, not per tile: a call next to the tile's epilogue sat
  // inside the next tile's wgmma window with its S live (ptxas spilled up to
  // 634 bytes in the d64 kernels); here one barrier per warpgroup per CTA.
  template <class Walk>
  __device__ __forceinline__ void fix_after_walk(bool nonfinite, const typename Walk::Tiles& blocks) const {
    if (named_sync_or(K::kOBarrier0 + cw, 128, nonfinite)) {  // rare
      if constexpr (Walk::kListed) fix_listed_walk_rows<K, T>(p, a, blocks, cw * 64 + warp * 16, cw * 4 + warp);
      else fix_walk_rows<K, T, kSplit>(p, a, cw * 64 + warp * 16, cw * 4 + warp);
    }
  }

  // Row r of this thread's two from registers.
  // NOTES: the 4 lanes of a quad hold 8 consecutive columns of a row (2 each);
  // a quad transpose gives each lane all 8 of one group, so a warp writes 8
  // rows x 64 bytes per 16-byte store (whole 32-byte sectors) instead of 8 x 16
  // per 4-byte store.
  // bits: OR of nonfinite::nonfinite_bits of the values stored.
  __device__ __forceinline__ void store_row(const RowTile& t, int r, bool row_ok, const float (&o)[D / 2],
                                            const float (&inv)[2], uint32_t& bits) const {
    const TileWork& w = t.w;
    const int row = t.row0 + 8 * r;
    T* orow = static_cast<T*>(p.out) + (row_ok ? row_offset(w.b, w.seq.row_q, row, w.h, p.o_batch_stride,
                                                            p.o_row_stride, p.o_head_stride, p.is_varlen())
                                                : 0);
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      uint32_t v[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = 4 * b + c;
        v[c] = pack2<T>(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        bits |= nonfinite::nonfinite_bits<T>(v[c]);
      }
      quad_transpose(v, lane);
      // Columns 8g..8g+7 of group g = 4b + lane % 4 exist when 8g < head_dim (a multiple of 8).
      const int group = 4 * b + lane % 4;
      if (row_ok && 8 * group < p.head_dim)
        *reinterpret_cast<uint4*>(orow + 8 * group) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }

  // O / l (0 for rows that saw no key: l == 0); lse = max logit + log l (-inf then),
  // both with the sink's share when there is one.
  // l holds per-thread partial sums: the quad reduction happens here, once.
  // Returns whether the warp stored an Inf or NaN, for fix_after_walk().
  __device__ __forceinline__ bool finish(const RowTile& t, float (&o)[D / 2], float (&m)[2], float (&l)[2]) const {
    const TileWork& w = t.w;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      l[r] = sum;
      // Empty: l == 0 exactly (l >= 1 once a key is seen); a NaN score made
      // l NaN (fmaxf kept it out of m), and NaN reaches O and the lse.
      inv[r] = sum == 0.0f ? 0.0f : 1.0f / sum;
      // A sequence whose indices the device found out of range (seqused_k -1,
      // the KV-cache route): NaN rows, O and lse.
      if constexpr (K::kCache) {
        if (w.seq.seqlen_k < 0) l[r] = inv[r] = NAN;
      }
    }
    // A part of a split tail tile: only the warp that merges the tile's last
    // part stores the rows (from registers: the other warps of its warpgroup
    // may have stored theirs or not yet).
    bool merged = false;
    if constexpr (kSplit) {
      if (t.seg.parts > 1) {
        if (!merge_split_part<D>(a, t.seg, cw * 4 + warp, 4 * K::kConsumers, lane, o, m, l)) return false;
        merged = true;
#pragma unroll
        for (int r = 0; r < 2; ++r) inv[r] = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
      }
    }
    // lse = max logit + log l; with a sink, its share of the denominator
    // rescales O and joins the lse (score_mod.h, AttentionSink).
    float lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse[r] = l[r] == 0.0f ? -INFINITY : m[r] * a.logit_scale + logf(l[r]);
      if (p.has_sinks()) {
        const AttentionSink sink{p.sinks[w.h]};
        const float lse_keys = lse[r];
        lse[r] = sink.lse(lse_keys);
        inv[r] *= sink.output_factor(lse_keys, lse[r]);
      }
    }
    uint32_t bits = 0;  // nonfinite::nonfinite_bits of the values stored
    bool o_stored = false;
    if constexpr (K::kOTma) {
      if (!p.is_varlen() && !merged) {
        o_stored = true;
        uint32_t po[D / 4];
#pragma unroll
        for (int i = 0; i < D / 8; i += 2) {
          po[2 * i] = pack2<T>(o[4 * i] * inv[0], o[4 * i + 1] * inv[0]);
          po[2 * i + 1] = pack2<T>(o[4 * i + 2] * inv[1], o[4 * i + 3] * inv[1]);
          po[2 * i + 2] = pack2<T>(o[4 * i + 4] * inv[0], o[4 * i + 5] * inv[0]);
          po[2 * i + 3] = pack2<T>(o[4 * i + 6] * inv[1], o[4 * i + 7] * inv[1]);
        }
#pragma unroll
        for (int k = 0; k < D / 4; ++k) bits |= nonfinite::nonfinite_bits<T>(po[k]);
        const int wg_row0 = w.m0 + cw * 64;
        store_o_tma(po, wg_row0 < w.seq.seqlen_q ? wg_row0 : -1, w.h, w.b);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = t.row0 + 8 * r;
      const bool row_ok = row < w.seq.seqlen_q;
      if (!o_stored) store_row(t, r, row_ok, o, inv, bits);
      if (row_ok && p.lse != nullptr && lane % 4 == 0) {
        p.lse[lse_offset(p, w.b, w.seq.row_q, row, w.h)] = lse[r];
      }
    }
    const bool found = __any_sync(0xffffffffu, bits != 0);
    // A merged tile's rows with an Inf or NaN: noted in this warp's own part
    // slot (read by no one after the merge; m is never NaN) for fix_walk_rows.
    if (kSplit && merged && found && lane == 0)
      __stcg(split_slot<D>(a, t.seg, t.seg.part, cw * 4 + warp, 4 * K::kConsumers, 0) + D / 8 * 32,
             make_float4(NAN, NAN, NAN, NAN));
    return found;
  }
};

}  // namespace flashattn::cuda::sm90
