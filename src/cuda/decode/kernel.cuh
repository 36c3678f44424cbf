// Split-KV decode (flash decoding) for attention against a KV cache.
//
// One CTA owns (packed query tile, KV head, sequence, split). The packed tile
// holds up to kMaxRows rows r = i * group + g: query position i of query head
// hk * group + g, so the query heads sharing a KV head read each K/V tile once.
// The split walks its share of the sequence's visible key tiles through a
// cp.async ring (rows gathered one by one through the block table when the
// cache is paged), keeps an online softmax per row, and writes either the
// final output (one split) or a normalised partial (O, lse) in f32 that the
// combine kernel merges with attention/state.h's merge.
//
// NOTES: decoding reads every K/V byte once, so the kernel is bound by memory
// as long as the math stays out of the way: scores and P V run on the tensor
// cores (mma.sync, Q and P in registers) so each K/V byte is read from shared
// memory once, and what matters is keeping enough K/V bytes in flight (the
// ring, two CTAs per SM, splits when batch x heads_kv is small). A first
// version on the FP32 pipes re-read Q and P from shared memory for every key
// and ran at ~750 GB/s on the H100 (docs/inference.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/rotary.h"
#include "attention/state.h"
#include "core/kvcache.h"
#include "core/numeric.h"
#include "cuda/common/mma.h"
#include "cuda/decode/tuning.h"

namespace flashattn::cuda::decode {

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// Where a call's scratch lives (all on the device, carved from one workspace).
struct Work {
  void* q_rotated;      // (batch, seqlen_q, heads_q, d) in q's dtype, or null without rotary
  float* partial_o;     // [splits][batch][heads_q][seqlen_q][d], normalised
  float* partial_lse;   // [splits][batch][heads_q][seqlen_q], natural log
  int splits;
  int query_tiles;
};

// Shapes of one head-dim bucket (the real head dim may be smaller, a multiple of 8).
//
// NOTES: a CTA's 4 warps split each key tile into key slices of 16 keys (one
// mma k-step of P V); each warp keeps its own online softmax and O for its
// slices and the slices merge once at the end (attention/state.h). At head dim
// 256 two warps share a slice, each owning half of O's columns, so O stays at
// 64 registers a thread.
template <int HeadDim>
struct Traits {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSliceKeys = 16;
  static constexpr int kBlockK = block_keys(HeadDim);
  static constexpr int kKeySlices = kBlockK / kSliceKeys;
  static constexpr int kColumnParts = kWarps / kKeySlices;   // warps sharing a slice
  static constexpr int kColumns = HeadDim / kColumnParts;    // O columns of one warp
  static constexpr int kOTiles = kColumns / 8;               // mma n-tiles of O
  static constexpr int kKSteps = HeadDim / 16;               // mma k-steps of Q K^T
  static constexpr int kRowElems = HeadDim + 8;  // 16 bytes of padding: conflict-free ldmatrix / LDS
  static constexpr int kStageBytes = 2 * kBlockK * kRowElems * 2;  // K and V, 16-bit
  static constexpr int kStages =
      kRingBytes / kStageBytes < kMinStages
          ? kMinStages
          : (kRingBytes / kStageBytes > kMaxStages ? kMaxStages : kRingBytes / kStageBytes);
  static constexpr int kChunks = HeadDim / 8;  // 16-byte chunks per row
  static constexpr int kRingBytesUsed = kStages * kStageBytes;
  static constexpr int kQBytes = kMaxRows * kRowElems * 2;
  static constexpr int kSmemBytes = kRingBytesUsed + kQBytes;
  // The end-of-CTA merge reuses the drained ring: O, m and l of every slice.
  static constexpr int kScratchFloats = kKeySlices * kMaxRows * (HeadDim + 2);
  static_assert(kMaxRows == 16, "one mma row tile of packed query rows");
  static_assert(kKeySlices * kColumnParts == kWarps && kOTiles % 2 == 0, "warp mapping");
  static_assert(kScratchFloats * 4 <= kRingBytesUsed, "the slice merge fits the ring");
};

// The CTA's packed rows and key tiles.
struct TileWork {
  int b, hk, split, row0, rows, group;
  int tile_begin, tile_end;  // key tiles of this split
};

__device__ __forceinline__ TileWork tile_work(const KvCacheParams& p, const Work& w, int block_keys) {
  TileWork t;
  t.split = blockIdx.x % w.splits;
  const int qtile = blockIdx.x / w.splits;
  t.hk = blockIdx.y;
  t.b = blockIdx.z;
  t.group = p.attn.group_size();
  t.row0 = qtile * kMaxRows;
  t.rows = min(kMaxRows, p.attn.seqlen_q * t.group - t.row0);
  const MaskPolicy mask = p.mask(t.b);
  const int first = mask.key_begin(t.row0 / t.group);
  const int end = mask.key_end((t.row0 + t.rows - 1) / t.group + 1);
  const int t0 = first / block_keys, t1 = end > first ? (end + block_keys - 1) / block_keys : t0;
  const int per_split = (t1 - t0 + w.splits - 1) / w.splits;
  t.tile_begin = min(t1, t0 + t.split * per_split);
  t.tile_end = min(t1, t.tile_begin + per_split);
  return t;
}

// The rows of a key tile one thread copies: it keeps one 16-byte column chunk
// and walks rows threadIdx.x / kChunks + n * kRowsPerPass.
template <int HeadDim>
struct TileRows {
  static constexpr int kRowsPerPass = kThreads / Traits<HeadDim>::kChunks;
  static constexpr int kRows = Traits<HeadDim>::kBlockK / kRowsPerPass;
  static_assert(kThreads % Traits<HeadDim>::kChunks == 0, "whole rows per pass");
  CacheSlot slot[kRows];
};

// Where this thread's rows of key tile `tile` live. NOTES: with a paged cache
// this reads the block table; it runs one tile ahead of the copies so the
// table's latency hides behind a tile of math instead of stalling the issue.
template <int HeadDim>
__device__ __forceinline__ void resolve_rows(const KvCacheParams& p, const TileWork& t, int tile,
                                             TileRows<HeadDim>& rows) {
  const int keys = p.keys(t.b);
#pragma unroll
  for (int n = 0; n < TileRows<HeadDim>::kRows; ++n) {
    const int j = tile * Traits<HeadDim>::kBlockK + threadIdx.x / Traits<HeadDim>::kChunks +
                  n * TileRows<HeadDim>::kRowsPerPass;
    rows.slot[n] = j < keys ? cache_slot(p, t.b, j) : CacheSlot{0, 0};
  }
}

// Issues the cp.async copies of key tile `tile` (K and V rows) into a ring stage;
// rows past the sequence and columns past the head dim are zero-filled.
template <typename T, int HeadDim>
__device__ __forceinline__ void load_tile(const KvCacheParams& p, const TileWork& t, int tile,
                                          const TileRows<HeadDim>& rows, T* stage) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  const int keys = p.keys(t.b), chunk = threadIdx.x % Tr::kChunks;
  const bool column_ok = chunk * 8 < a.head_dim;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
#pragma unroll
  for (int n = 0; n < TileRows<HeadDim>::kRows; ++n) {
    const int key = threadIdx.x / Tr::kChunks + n * TileRows<HeadDim>::kRowsPerPass;
    const bool valid = column_ok && tile * Tr::kBlockK + key < keys;
    int64_t k_off = 0, v_off = 0;
    if (valid) {
      k_off = slot_offset(rows.slot[n], t.hk, a.k_batch_stride, a.k_row_stride, a.k_head_stride) + chunk * 8;
      v_off = slot_offset(rows.slot[n], t.hk, a.v_batch_stride, a.v_row_stride, a.v_head_stride) + chunk * 8;
    }
    T* dst = stage + key * Tr::kRowElems + chunk * 8;
    cp_async_16(smem_addr(dst), k + k_off, valid);
    cp_async_16(smem_addr(dst + Tr::kBlockK * Tr::kRowElems), v + v_off, valid);
  }
}

// The tile's packed q rows into shared memory (zeros past the rows and the head dim).
template <typename T, int HeadDim>
__device__ __forceinline__ void load_queries(const KvCacheParams& p, const Work& w, const TileWork& t,
                                             T* q_s) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  for (int idx = threadIdx.x; idx < kMaxRows * HeadDim; idx += kThreads) {
    const int r = idx / HeadDim, c = idx % HeadDim;
    T x = from_float<T>(0.0f);
    if (r < t.rows && c < a.head_dim) {
      const int pr = t.row0 + r, i = pr / t.group, h = t.hk * t.group + pr % t.group;
      const T* q = w.q_rotated != nullptr
                       ? static_cast<const T*>(w.q_rotated) + ((int64_t{t.b} * a.seqlen_q + i) * a.heads_q + h) * a.head_dim
                       : static_cast<const T*>(a.q) + t.b * a.q_batch_stride + i * a.q_row_stride + h * a.q_head_stride;
      x = q[c];
    }
    q_s[r * Tr::kRowElems + c] = x;
  }
}

__device__ __forceinline__ uint32_t lds32(const void* p) { return *static_cast<const uint32_t*>(p); }

// One warp's state: Q as mma A fragments, its O fragments and the online
// softmax of its two rows (g and g + 8 of the tile; m in the log2 domain).
template <int HeadDim>
struct WarpState {
  using Tr = Traits<HeadDim>;
  uint32_t q[Tr::kKSteps][4];
  float o[Tr::kOTiles][4];
  float m[2];
  float l[2];
};

// S = Q K^T of the warp's 16 keys, scaled, softcapped, masked (log2 domain).
template <typename T, int HeadDim>
__device__ __forceinline__ void slice_scores(const KvCacheParams& p, const TileWork& t, int key0,
                                             const T* k_s, const WarpState<HeadDim>& ws,
                                             float (&s)[2][4]) {
  using Tr = Traits<HeadDim>;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int slice_key = key0 % Tr::kBlockK;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    const T* row = k_s + (slice_key + nt * 8 + g) * Tr::kRowElems + 2 * tq;
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      mma_m16n8k16<T>(s[nt], ws.q[ks], lds32(row + ks * 16), lds32(row + ks * 16 + 8));
    }
  }
  const AttentionParams& a = p.attn;
  const MaskPolicy mask = p.mask(t.b);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + (e >= 2 ? 8 : 0), j = key0 + nt * 8 + 2 * tq + (e & 1);
      float x = s[nt][e] * a.scale;
      if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
      const bool visible = r < t.rows && mask.visible((t.row0 + r) / t.group, j);
      s[nt][e] = visible ? x * kLog2e : -INFINITY;
    }
  }
}

// Online softmax of the slice's scores into P (in place), rescaling O.
template <int HeadDim>
__device__ __forceinline__ void slice_softmax(float (&s)[2][4], WarpState<HeadDim>& ws) {
  using Tr = Traits<HeadDim>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row g (h = 0) and g + 8 (h = 1): elements 2h, 2h + 1
    const float local = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
    const float m_new = fmaxf(ws.m[h], quad_max(local));
    const float c = m_new == -INFINITY ? 1.0f : exp2f(ws.m[h] - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        s[nt][e] = m_new == -INFINITY ? 0.0f : exp2f(s[nt][e] - m_new);
        sum += s[nt][e];
      }
    }
    ws.l[h] = ws.l[h] * c + quad_sum(sum);
    ws.m[h] = m_new;
#pragma unroll
    for (int ot = 0; ot < Tr::kOTiles; ++ot) {
      ws.o[ot][2 * h] *= c;
      ws.o[ot][2 * h + 1] *= c;
    }
  }
}

// O += P V over the slice's 16 keys and the warp's columns; P is the A fragment
// made of the two score n-tiles (keys 0-7 and 8-15 of the slice).
template <typename T, int HeadDim>
__device__ __forceinline__ void slice_pv(const float (&s)[2][4], int slice_key, int column0,
                                         const T* v_s, WarpState<HeadDim>& ws) {
  using Tr = Traits<HeadDim>;
  const uint32_t pa[4] = {MmaType<T>::pack(s[0][0], s[0][1]), MmaType<T>::pack(s[0][2], s[0][3]),
                          MmaType<T>::pack(s[1][0], s[1][1]), MmaType<T>::pack(s[1][2], s[1][3])};
  const int lane = threadIdx.x % 32;
  // ldmatrix.x4.trans: lanes 0-7 / 8-15 address keys 0-7 / 8-15 of columns c..c+7,
  // lanes 16-31 the same keys of columns c+8..c+15: b0, b1 of two n-tiles.
  const T* base = v_s + (slice_key + lane % 8 + ((lane / 8) % 2) * 8) * Tr::kRowElems + column0 + (lane / 16) * 8;
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ot += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, smem_addr(base + ot * 8));
    mma_m16n8k16<T>(ws.o[ot], pa, b[0], b[1]);
    mma_m16n8k16<T>(ws.o[ot + 1], pa, b[2], b[3]);
  }
}

// The warps' slices merged (attention/state.h, unnormalised O) through the
// drained ring, then the rows written: out and lse with one split, else the
// normalised partial.
template <typename T, int HeadDim>
__device__ __forceinline__ void write_rows(const KvCacheParams& p, const Work& w, const TileWork& t,
                                           const WarpState<HeadDim>& ws, float* scratch,
                                           bool poisoned) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int slice = warp % Tr::kKeySlices, part = warp / Tr::kKeySlices;
  float* o_s = scratch;                                            // [slice][row][column]
  float* ml_s = scratch + Tr::kKeySlices * kMaxRows * HeadDim;     // [slice][row][m, l]
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ++ot) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + (e >= 2 ? 8 : 0), c = part * Tr::kColumns + ot * 8 + 2 * tq + (e & 1);
      o_s[(slice * kMaxRows + r) * HeadDim + c] = ws.o[ot][e];
    }
  }
  if (part == 0 && tq == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* ml = ml_s + (slice * kMaxRows + g + 8 * h) * 2;
      ml[0] = ws.m[h] * kLn2;  // the merge works in the natural-log domain
      ml[1] = ws.l[h];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < t.rows * a.head_dim; idx += kThreads) {
    const int r = idx / a.head_dim, c = idx % a.head_dim;
    float o = 0.0f;
    RowState st = RowState::empty();
    for (int sl = 0; sl < Tr::kKeySlices; ++sl) {
      const float* ml = ml_s + (sl * kMaxRows + r) * 2;
      merge(&o, st, &o_s[(sl * kMaxRows + r) * HeadDim + c], RowState{ml[0], ml[1]}, 1,
            OutputForm::kUnnormalized);
    }
    o = st.l > 0.0f ? o / st.l : 0.0f;
    float lse = st.lse();
    if (poisoned) o = lse = NAN;
    const int pr = t.row0 + r, i = pr / t.group, h = t.hk * t.group + pr % t.group;
    if (w.splits == 1) {
      static_cast<T*>(a.out)[t.b * a.o_batch_stride + i * a.o_row_stride + h * a.o_head_stride + c] = from_float<T>(o);
      if (a.lse != nullptr && c == 0) a.lse[t.b * a.lse_batch_stride + h * a.lse_head_stride + i * a.lse_row_stride] = lse;
    } else {
      const int64_t row = ((int64_t{t.split} * a.batch + t.b) * a.heads_q + h) * a.seqlen_q + i;
      w.partial_o[row * a.head_dim + c] = o;
      if (c == 0) w.partial_lse[row] = lse;
    }
  }
}

template <typename T, int HeadDim>
__global__ void __launch_bounds__(kThreads, 2) decode_kernel(const KvCacheParams p, const Work w) {
  using Tr = Traits<HeadDim>;
  extern __shared__ __align__(16) uint8_t smem[];
  T* ring = reinterpret_cast<T*>(smem);
  T* q_s = reinterpret_cast<T*>(smem + Tr::kRingBytesUsed);

  const TileWork t = tile_work(p, w, Tr::kBlockK);
  // Indices may have changed since the host checked them (graph replays): a
  // split whose length or pages are out of range reads nothing and gives NaN.
  const bool in_range = cache_length_valid(p, t.b) &&
                        keys_addressable(p, t.b, t.tile_begin * Tr::kBlockK,
                                         min(p.keys(t.b), t.tile_end * Tr::kBlockK), threadIdx.x, kThreads);
  const bool poisoned = !__syncthreads_and(in_range);
  const int tiles = poisoned ? 0 : t.tile_end - t.tile_begin;
  constexpr int kStageElems = Tr::kStageBytes / 2;
  TileRows<HeadDim> rows;
  for (int s = 0; s < Tr::kStages - 1; ++s) {
    if (s < tiles) {
      resolve_rows(p, t, t.tile_begin + s, rows);
      load_tile<T, HeadDim>(p, t, t.tile_begin + s, rows, ring + s * kStageElems);
    }
    cp_async_commit();
  }
  if (Tr::kStages - 1 < tiles) resolve_rows(p, t, t.tile_begin + Tr::kStages - 1, rows);
  load_queries<T, HeadDim>(p, w, t, q_s);
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int slice = warp % Tr::kKeySlices, column0 = (warp / Tr::kKeySlices) * Tr::kColumns;
  WarpState<HeadDim> ws;
#pragma unroll
  for (int ks = 0; ks < Tr::kKSteps; ++ks) {
    const T* q = q_s + ks * 16 + 2 * tq;
    ws.q[ks][0] = lds32(q + g * Tr::kRowElems);
    ws.q[ks][1] = lds32(q + (g + 8) * Tr::kRowElems);
    ws.q[ks][2] = lds32(q + g * Tr::kRowElems + 8);
    ws.q[ks][3] = lds32(q + (g + 8) * Tr::kRowElems + 8);
  }
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ++ot) {
#pragma unroll
    for (int e = 0; e < 4; ++e) ws.o[ot][e] = 0.0f;
  }
  ws.m[0] = ws.m[1] = -INFINITY;
  ws.l[0] = ws.l[1] = 0.0f;

  for (int it = 0; it < tiles; ++it) {
    cp_async_wait<Tr::kStages - 2>();
    __syncthreads();  // tile `it` landed for every thread; the stage read last turn is free
    const int ahead = it + Tr::kStages - 1;
    if (ahead < tiles) load_tile<T, HeadDim>(p, t, t.tile_begin + ahead, rows, ring + (ahead % Tr::kStages) * kStageElems);
    cp_async_commit();
    if (ahead + 1 < tiles) resolve_rows(p, t, t.tile_begin + ahead + 1, rows);
    const T* k_s = ring + (it % Tr::kStages) * kStageElems;
    const int key0 = (t.tile_begin + it) * Tr::kBlockK + slice * Tr::kSliceKeys;
    float s[2][4];
    slice_scores<T, HeadDim>(p, t, key0, k_s, ws, s);
    slice_softmax<HeadDim>(s, ws);
    slice_pv<T, HeadDim>(s, slice * Tr::kSliceKeys, column0, k_s + Tr::kBlockK * Tr::kRowElems, ws);
  }
  cp_async_wait<0>();
  __syncthreads();
  write_rows<T, HeadDim>(p, w, t, ws, reinterpret_cast<float*>(smem), poisoned);
}

// Merges the splits' partials of one row (block) into out and lse.
template <typename T>
__global__ void __launch_bounds__(kThreads) combine_kernel(const KvCacheParams p, const Work w) {
  const AttentionParams& a = p.attn;
  const int64_t row = blockIdx.x;  // (b, h, i)
  const int i = static_cast<int>(row % a.seqlen_q);
  const int h = static_cast<int>(row / a.seqlen_q % a.heads_q);
  const int b = static_cast<int>(row / a.seqlen_q / a.heads_q);
  const int64_t split_rows = int64_t{a.batch} * a.heads_q * a.seqlen_q;
  for (int c = threadIdx.x; c < a.head_dim; c += kThreads) {
    float o = 0.0f;
    RowState st = RowState::empty();
    for (int s = 0; s < w.splits; ++s) {
      const int64_t at = s * split_rows + row;
      const float os = w.partial_o[at * a.head_dim + c];
      merge(&o, st, &os, RowState::from_lse(w.partial_lse[at]), 1, OutputForm::kNormalized);
    }
    static_cast<T*>(a.out)[b * a.o_batch_stride + i * a.o_row_stride + h * a.o_head_stride + c] = from_float<T>(o);
    if (a.lse != nullptr && c == 0) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + i * a.lse_row_stride] = st.lse();
  }
}

// Appends k_new (rotated) / v_new into the cache and writes the rotated q: one
// block per (token row, sequence). Sequences with indices out of range write nothing.
template <typename T>
__global__ void __launch_bounds__(kThreads) append_kernel(const KvCacheParams p, const Work w) {
  const AttentionParams& a = p.attn;
  const int i = blockIdx.x, b = blockIdx.y, d = a.head_dim;
  // Only the pages this block writes or reads (new tokens; rotated q reads none).
  const int first_new = p.cached_tokens(b);
  if (!__syncthreads_and(cache_length_valid(p, b) &&
                         keys_addressable(p, b, first_new, first_new + p.seqlen_new, threadIdx.x, kThreads))) {
    return;
  }
  const T* cos_t = static_cast<const T*>(p.rotary_cos);
  const T* sin_t = static_cast<const T*>(p.rotary_sin);
  auto rotated = [&](const T* x, int c, int position) {
    if (c >= p.rotary_dim) return to_float(x[c]);
    const T* co = cos_t + position * p.cos_row_stride;
    const T* si = sin_t + position * p.sin_row_stride;
    return rotated_element<float>(c, p.rotary_dim, p.rotary_interleaved,
                                  [&](int k) { return to_float(x[k]); },
                                  [&](int k) { return to_float(co[k]); },
                                  [&](int k) { return to_float(si[k]); });
  };
  if (i < p.seqlen_new) {
    const int pos = p.cached_tokens(b) + i;
    for (int idx = threadIdx.x; idx < a.heads_kv * d; idx += kThreads) {
      const int hk = idx / d, c = idx % d;
      const T* kn = static_cast<const T*>(p.k_new) + b * p.kn_batch_stride + i * p.kn_row_stride + hk * p.kn_head_stride;
      const T* vn = static_cast<const T*>(p.v_new) + b * p.vn_batch_stride + i * p.vn_row_stride + hk * p.vn_head_stride;
      const float k = p.has_rotary() ? rotated(kn, c, pos) : to_float(kn[c]);
      static_cast<T*>(const_cast<void*>(a.k))[k_cache_offset(p, b, pos, hk) + c] = from_float<T>(k);
      static_cast<T*>(const_cast<void*>(a.v))[v_cache_offset(p, b, pos, hk) + c] = vn[c];
    }
  }
  if (w.q_rotated != nullptr && i < a.seqlen_q) {
    const int pos = p.query_position(b, i);
    for (int idx = threadIdx.x; idx < a.heads_q * d; idx += kThreads) {
      const int h = idx / d, c = idx % d;
      const T* q = static_cast<const T*>(a.q) + b * a.q_batch_stride + i * a.q_row_stride + h * a.q_head_stride;
      static_cast<T*>(w.q_rotated)[((int64_t{b} * a.seqlen_q + i) * a.heads_q + h) * d + c] = from_float<T>(rotated(q, c, pos));
    }
  }
}

}  // namespace flashattn::cuda::decode
