// What the split-KV decode kernels share: the call's scratch, the shapes of a
// head-dim bucket, the CTA's share of the work, the merge weights of partial
// states and programmatic dependent launch (dtype conversions:
// cuda/common/convert.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/mask.h"
#include "attention/state.h"
#include "core/kvcache.h"
#include "core/layout.h"
#include "cuda/common/convert.h"
#include "cuda/decode/ring_layout.h"
#include "cuda/decode/tuning.h"

namespace flashattn::cuda::decode {

// Where a call's scratch lives (all on the device, carved from one workspace).
struct Work {
  void* q_rotated;      // (batch, seqlen_q, heads_q, d) in q's dtype, or null without rotary
  float* partial_o;     // [splits][batch][heads_q][seqlen_q][d], normalised
  float* partial_lse;   // [splits][batch][heads_q][seqlen_q], natural log
  int splits;
  int query_tiles;
  int page_shift;       // paged cache with a power-of-two page: log2(block_size); else -1
  bool l2_prefetch;     // short splits of a contiguous cache or whole-tile pages: the L2 prefetches a tile more (kernel.cuh)
  bool early_prefetch;  // contiguous, no cache_batch_idx: the first tiles go to the L2 before the grid wait
  // The Hopper route (api.cu): int32[batch], the append kernel writes each
  // sequence's key count there (-1 where its indices are out of range); else null.
  int32_t* key_counts;
};

// Shapes of one head-dim bucket (the real head dim may be smaller, a multiple of 8).
//
// NOTES: a CTA's 4 warps split each key tile into key slices of 16 keys (one
// mma k-step of P V); each warp keeps its own online softmax and O for its
// slices and the slices merge once at the end (attention/state.h). At head dim
// 256 two warps share a slice, each owning half of O's columns, so O stays at
// 64 registers a thread. A slice's products are key-major (kernel.cuh): keys
// and O's columns are the mma's M, the packed rows its N, in row tiles of 8.
template <int HeadDim>
struct Traits {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSliceKeys = 16;
  static constexpr int kBlockK = block_keys(HeadDim);
  static constexpr int kKeySlices = kBlockK / kSliceKeys;
  static constexpr int kColumnParts = kWarps / kKeySlices;   // warps sharing a slice
  static constexpr int kColumns = HeadDim / kColumnParts;    // O columns of one warp
  static constexpr int kOTiles = kColumns / 16;              // mma m-tiles of O^T (16 columns each)
  static constexpr int kRowTiles = kMaxRows / 8;             // mma n-tiles of packed rows (8 each)
  static constexpr int kKSteps = HeadDim / 16;               // mma k-steps of K Q^T
  // NOTES (ring layout): K/V rows unpadded, their 16-byte chunks swizzled by
  // row (ring_layout.h), the ring 128-byte aligned. Rows padded by 16 bytes
  // (the layout before) kept ldmatrix conflict-free too, but split every other
  // row's 32-byte sectors across two blocks of shared memory: per warp copy of
  // 512 bytes the L2 then served 24 sector requests instead of 16, and a
  // stream of such copies read 2.91-2.96 TB/s against 3.11-3.14
  // (bench/probes/cp_async_maps.cu, H100; docs/performance.md 3.6).
  static constexpr int kRowElems = HeadDim;
  static constexpr int kStageBytes = 2 * kBlockK * kRowElems * 2;  // K and V, 16-bit
  static constexpr int kBlockElems = kBlockK * kRowElems;          // a stage's K (then V) block
  // Element offset of 16-byte chunk `chunk` of ring row `row` (a K or V block).
  __device__ __forceinline__ static int ring_elem(int row, int chunk) {
    return row * kRowElems + ring_chunk(row, chunk) * 8;
  }
  static constexpr int kQRowElems = HeadDim + 8;  // q rows: 16 bytes of padding, conflict-free LDS
  static constexpr int kChunks = HeadDim / 8;  // 16-byte chunks per row
  static constexpr int kLineChunks = kChunks < 8 ? kChunks : 8;  // chunks per 128-byte line of a row
  static constexpr int kQBytes = kMaxRows * kQRowElems * 2;
  // The end-of-CTA merge reuses the drained ring: O of every slice, the
  // slices' (m, l), their merge weights and each row's lse.
  // NOTES: a lane stores its O^T fragments one float at a time: rows 2tq (+1)
  // of column g. With rows of d + 4 floats (d a multiple of 32) the 32 lanes of
  // a store hit 32 different banks (8 tq + g); rows of d + 8 floats put lanes
  // tq and tq + 2 on the same bank.
  static constexpr int kMergeRowFloats = HeadDim + 4;
  static constexpr int kScratchFloats = kKeySlices * kMaxRows * (kMergeRowFloats + 3) + kMaxRows;
  static_assert(kMaxRows % 8 == 0, "whole mma n-tiles of packed query rows");
  static_assert(kKeySlices * kColumnParts == kWarps && kColumns % 16 == 0, "warp mapping");
};

// How the CTA's threads share the copies of a key tile (a K/V source's choice,
// source.cuh): runs of kLaneChunks threads copy one 16-byte chunk each of a
// row segment of as many chunks; a thread copies its chunk of each of a row's
// kSegments segments, in rows key0() + n * kRowsPerPass.
template <int HeadDim, int LaneChunks>
struct CopyMap {
  using Tr = Traits<HeadDim>;
  static constexpr int kLaneChunks = LaneChunks;
  static constexpr int kSegments = Tr::kChunks / LaneChunks;
  static constexpr int kRowsPerPass = kThreads / LaneChunks;
  static constexpr int kRowsPerThread = Tr::kBlockK / kRowsPerPass;
  static_assert(Tr::kChunks % LaneChunks == 0 && kThreads % LaneChunks == 0 && Tr::kBlockK % kRowsPerPass == 0,
                "whole rows per pass");
  __device__ static int chunk0() { return threadIdx.x % LaneChunks; }
  __device__ static int key0() { return threadIdx.x / LaneChunks; }
};

// The K/V ring of a head-dim bucket within a budget of RingBytes (tuning.h:
// kRingBytes, or kSmallRingBytes on GPUs whose blocks may not take that ring),
// and the CTA's shared memory: the ring, then the packed q rows.
template <int HeadDim, int RingBytes>
struct Ring {
  using Tr = Traits<HeadDim>;
  static constexpr int kFit = RingBytes / Tr::kStageBytes;
  static constexpr int kStages = kFit < kMinStages ? kMinStages : (kFit > kMaxStages ? kMaxStages : kFit);
  static constexpr int kBytes = kStages * Tr::kStageBytes;
  // The ring, the q rows, then the merge's word of rows with a non-finite
  // value (no static shared memory: the ring starts the block's shared memory,
  // 128-byte aligned).
  static constexpr int kFlagOffset = kBytes + Tr::kQBytes;
  static constexpr int kSmemBytes = kFlagOffset + 16;
  static_assert(Tr::kScratchFloats * 4 <= kBytes, "the slice merge fits the ring");
};

// The CTA's packed rows and key tiles, and its sequence's length (read once).
struct TileWork {
  int b, hk, split, row0, rows, group;
  int keys;                  // keys the sequence attends to (cache + new tokens)
  bool length_ok;            // cache_seqlens[b] + new tokens fit the cache
  MaskPolicy mask;
  int tile_begin, tile_end;  // key tiles of this split

  // Packed row r of the tile is query position query_of(r) of query head head_of(r).
  __device__ int query_of(int r) const { return (row0 + r) / group; }
  __device__ int head_of(int r) const { return hk * group + (row0 + r) % group; }
};

// Query position i of head h of sequence b: q, or its rotated copy (packed).
template <typename T>
__device__ __forceinline__ const T* query_row(const KvCacheParams& p, const Work& w, int b, int i, int h) {
  const AttentionParams& a = p.attn;
  return w.q_rotated != nullptr
             ? static_cast<const T*>(w.q_rotated) + ((int64_t{b} * a.seqlen_q + i) * a.heads_q + h) * a.head_dim
             : static_cast<const T*>(a.q) + b * a.q_batch_stride + i * a.q_row_stride + h * a.q_head_stride;
}

// Where (b, i, h) is stored: its out row and lse entry (core/layout.h's
// row_offset and lse_offset for a fixed-length call, which a KV-cache call is:
// no runtime varlen test in the epilogue), and its row of a split's partials
// (partial_o row * head_dim, partial_lse row).
__device__ __forceinline__ int64_t out_offset(const AttentionParams& a, int b, int i, int h) {
  return row_offset(b, 0, i, h, a.o_batch_stride, a.o_row_stride, a.o_head_stride, false);
}
__device__ __forceinline__ int64_t lse_index(const AttentionParams& a, int b, int i, int h) {
  return b * a.lse_batch_stride + h * a.lse_head_stride + i * a.lse_row_stride;
}
__device__ __forceinline__ int64_t partial_row(const AttentionParams& a, int split, int b, int i, int h) {
  return ((int64_t{split} * a.batch + b) * a.heads_q + h) * a.seqlen_q + i;
}

__device__ __forceinline__ TileWork tile_work(const KvCacheParams& p, const Work& w, int block_keys) {
  TileWork t;
  t.split = blockIdx.x % w.splits;
  const int qtile = blockIdx.x / w.splits;
  t.hk = blockIdx.y;
  t.b = blockIdx.z;
  t.group = p.attn.group_size();
  t.row0 = qtile * kMaxRows;
  t.rows = min(kMaxRows, p.attn.seqlen_q * t.group - t.row0);
  t.length_ok = cache_length_valid(p, t.b);
  t.keys = t.length_ok ? p.keys(t.b) : 0;
  t.mask = MaskPolicy{p.attn.seqlen_q, t.keys, p.attn.window_left, p.attn.window_right};
  const int first = t.mask.key_begin(t.row0 / t.group);
  const int end = t.mask.key_end((t.row0 + t.rows - 1) / t.group + 1);
  const int t0 = first / block_keys, t1 = end > first ? (end + block_keys - 1) / block_keys : t0;
  const int per_split = (t1 - t0 + w.splits - 1) / w.splits;
  t.tile_begin = min(t1, t0 + t.split * per_split);
  t.tile_end = min(t1, t.tile_begin + per_split);
  return t;
}

// NOTES: folding attention/state.h's merge over partials x gives the merged
// state (m, l); written out, the merged normalised O is
//   O = sum_x e^{m_x - m} O_x / l
// with O_x unnormalised relative to m_x (a warp's slice), or normalised with
// m_x = lse_x (a split's partial: l_x = 1). So the merge's exponentials run once
// per partial and row instead of once per element. An empty merged state
// weighs every partial 0 (O = 0); NaN in any m_x or l_x reaches l and every weight.
__device__ __forceinline__ float merge_weight(RowState merged, float m_x) {
  return merged.is_empty() ? 0.0f : expf(m_x - merged.m) / merged.l;
}

// The attention sink of query head h as a partial state (score_mod.h): one
// more "key" of score z that carries no value, i.e. (m = z, l = 1, O = 0); the
// empty state (the merge's identity) without sinks or with z = -inf. Folded
// into each row's merge once, by the kernel that writes the output (the decode
// kernel with one split, else the combine), it adds e^{z - m} to l: the lse
// then includes the sink and every other partial's weight shrinks to match.
__device__ __forceinline__ RowState sink_state(const AttentionParams& a, int h) {
  return a.has_sinks() ? RowState::from_lse(a.sinks[h]) : RowState::empty();
}

// Whether this code waits for the kernel before it (griddepcontrol: compute_90
// and newer); the sm_80 build's kernels start only once that kernel is done.
__device__ __forceinline__ constexpr bool griddepcontrol_compiled() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return true;
#else
  return false;
#endif
}

// Programmatic dependent launch (sm_90 and newer; no-ops in the sm_80 build,
// whose launches never carry the attribute, see api.cu): a kernel launched
// with cudaLaunchAttributeProgrammaticStreamSerialization may start once every
// CTA of the kernel before it called allow_dependent_launch (or exited), and
// calls wait_for_prior_grid before it touches what that kernel writes.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace flashattn::cuda::decode
