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
// NOTES: decoding reads every K/V byte once and does ~2 FMAs per byte per
// packed row, so the kernel is bound by memory, not math: scores and P V run on
// the FP32 pipes from shared memory, and what matters is keeping enough K/V
// bytes in flight (the ring, several CTAs per SM, splits when batch x heads_kv
// is small).
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
template <int HeadDim>
struct Traits {
  static constexpr int kBlockK = block_keys(HeadDim);
  static constexpr int kRowElems = HeadDim + 8;  // 16 bytes of padding spread rows over banks
  static constexpr int kStageBytes = 2 * kBlockK * kRowElems * 2;  // K and V, 16-bit
  static constexpr int kStages =
      kRingBytes / kStageBytes < kMinStages
          ? kMinStages
          : (kRingBytes / kStageBytes > kMaxStages ? kMaxStages : kRingBytes / kStageBytes);
  static constexpr int kChunks = HeadDim / 8;             // 16-byte chunks per row
  static constexpr int kThreadsPerKey = kThreads / kBlockK;
  static constexpr int kColumnPairs = HeadDim / 2;         // P V: a thread owns 2 columns
  static constexpr int kKeyGroups = kThreads / kColumnPairs;  // ... of every kKeyGroups-th key
  static constexpr int kRingBytesUsed = kStages * kStageBytes;
  static constexpr int kSmemBytes =
      kRingBytesUsed + 4 * (kMaxRows * HeadDim + kMaxRows * kBlockK + 3 * kMaxRows);
  static_assert(kThreads % kBlockK == 0 && kThreads % kColumnPairs == 0, "thread mapping");
  static_assert(kKeyGroups * kMaxRows * HeadDim * 4 <= kRingBytesUsed, "reduction fits the ring");
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

// Issues the cp.async copies of key tile `tile` (K and V rows) into a ring stage.
template <typename T, int HeadDim>
__device__ __forceinline__ void load_tile(const KvCacheParams& p, const TileWork& t, int tile,
                                          T* stage) {
  using Tr = Traits<HeadDim>;
  const int keys = p.keys(t.b), d = p.attn.head_dim;
  constexpr int kPerTensor = Tr::kBlockK * Tr::kChunks;
  for (int idx = threadIdx.x; idx < 2 * kPerTensor; idx += kThreads) {
    const bool is_v = idx >= kPerTensor;
    const int rem = is_v ? idx - kPerTensor : idx;
    const int key = rem / Tr::kChunks, chunk = rem % Tr::kChunks;
    const int j = tile * Tr::kBlockK + key;
    const bool valid = j < keys && chunk * 8 < d;
    const T* base = static_cast<const T*>(is_v ? p.attn.v : p.attn.k);
    const T* src = valid ? base + (is_v ? v_cache_offset(p, t.b, j, t.hk) : k_cache_offset(p, t.b, j, t.hk)) + chunk * 8
                         : base;
    T* dst = stage + (is_v ? Tr::kBlockK * Tr::kRowElems : 0) + key * Tr::kRowElems + chunk * 8;
    cp_async_16(smem_addr(dst), src, valid);
  }
}

// q rows of the tile into shared memory as f32, times the softmax scale.
template <typename T, int HeadDim>
__device__ __forceinline__ void load_queries(const KvCacheParams& p, const Work& w, const TileWork& t,
                                             float* q_s) {
  const AttentionParams& a = p.attn;
  for (int idx = threadIdx.x; idx < kMaxRows * HeadDim; idx += kThreads) {
    const int r = idx / HeadDim, c = idx % HeadDim;
    float x = 0.0f;
    if (r < t.rows && c < a.head_dim) {
      const int pr = t.row0 + r, i = pr / t.group, h = t.hk * t.group + pr % t.group;
      const T* q = w.q_rotated != nullptr
                       ? static_cast<const T*>(w.q_rotated) + ((int64_t{t.b} * a.seqlen_q + i) * a.heads_q + h) * a.head_dim
                       : static_cast<const T*>(a.q) + t.b * a.q_batch_stride + i * a.q_row_stride + h * a.q_head_stride;
      x = to_float(q[c]) * a.scale;
    }
    q_s[idx] = x;
  }
}

// Scores of the tile into s_s (log2 domain, softcapped, -inf where masked).
template <typename T, int HeadDim>
__device__ __forceinline__ void tile_scores(const KvCacheParams& p, const TileWork& t, int tile,
                                            const T* k_s, const float* q_s, float* s_s) {
  using Tr = Traits<HeadDim>;
  const int key = threadIdx.x / Tr::kThreadsPerKey, part = threadIdx.x % Tr::kThreadsPerKey;
  float acc[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
  // Part `part` takes chunks part, part + kThreadsPerKey, ... of the row.
#pragma unroll 4
  for (int chunk = part; chunk < Tr::kChunks; chunk += Tr::kThreadsPerKey) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k_s + key * Tr::kRowElems + chunk * 8);
    const T* kv = reinterpret_cast<const T*>(&raw);
    float k8[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) k8[e] = to_float(kv[e]);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const float4 qa = *reinterpret_cast<const float4*>(q_s + r * HeadDim + chunk * 8);
      const float4 qb = *reinterpret_cast<const float4*>(q_s + r * HeadDim + chunk * 8 + 4);
      acc[r] += qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] + qb.x * k8[4] +
                qb.y * k8[5] + qb.z * k8[6] + qb.w * k8[7];
    }
  }
  const MaskPolicy mask = p.mask(t.b);
  const int j = tile * Tr::kBlockK + key;
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
#pragma unroll
    for (int offset = 1; offset < Tr::kThreadsPerKey; offset *= 2) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    }
    if (r % Tr::kThreadsPerKey != part) continue;
    float s = acc[r];
    if (p.attn.softcap > 0.0f) s = p.attn.softcap * tanhf(s / p.attn.softcap);
    const int i = (t.row0 + r) / t.group;
    const bool visible = r < t.rows && mask.visible(i, j);
    s_s[r * Tr::kBlockK + key] = visible ? s * kLog2e : -INFINITY;
  }
}

// Online softmax over the tile's scores: P = 2^(s - m_new) in place, the row
// max, sum and the rescale factor of the accumulators in m_s, l_s, c_s.
template <int HeadDim>
__device__ __forceinline__ void tile_softmax(float* s_s, float* m_s, float* l_s, float* c_s) {
  using Tr = Traits<HeadDim>;
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = warp; r < kMaxRows; r += kWarps) {
    float* s = s_s + r * Tr::kBlockK;
    float m_tile = -INFINITY;
    for (int j = lane; j < Tr::kBlockK; j += 32) m_tile = fmaxf(m_tile, s[j]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, o));
    const float m_old = m_s[r];
    const float m_new = fmaxf(m_old, m_tile);
    float sum = 0.0f;
    for (int j = lane; j < Tr::kBlockK; j += 32) {
      const float e = m_new == -INFINITY ? 0.0f : exp2f(s[j] - m_new);
      s[j] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const float c = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
      c_s[r] = c;
      l_s[r] = l_s[r] * c + sum;
      m_s[r] = m_new;
    }
  }
}

// acc (2 columns x kMaxRows rows of this thread) = acc * c + P V over its keys.
template <typename T, int HeadDim>
__device__ __forceinline__ void tile_pv(const T* v_s, const float* p_s, const float* c_s,
                                        float (&acc)[kMaxRows][2]) {
  using Tr = Traits<HeadDim>;
  const int pair = threadIdx.x % Tr::kColumnPairs, group = threadIdx.x / Tr::kColumnPairs;
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    acc[r][0] *= c_s[r];
    acc[r][1] *= c_s[r];
  }
#pragma unroll 4
  for (int j = group; j < Tr::kBlockK; j += Tr::kKeyGroups) {
    const T* v = v_s + j * Tr::kRowElems + 2 * pair;
    const float v0 = to_float(v[0]), v1 = to_float(v[1]);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const float pj = p_s[r * Tr::kBlockK + j];
      acc[r][0] += pj * v0;
      acc[r][1] += pj * v1;
    }
  }
}

// Sums the key groups' accumulators (through the drained ring) and writes the
// rows: the output and lse when the call has one split, else the partial.
template <typename T, int HeadDim>
__device__ __forceinline__ void write_rows(const KvCacheParams& p, const Work& w, const TileWork& t,
                                           float (&acc)[kMaxRows][2], float* scratch,
                                           const float* m_s, const float* l_s, bool poisoned) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  const int pair = threadIdx.x % Tr::kColumnPairs, group = threadIdx.x / Tr::kColumnPairs;
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    scratch[(group * kMaxRows + r) * HeadDim + 2 * pair] = acc[r][0];
    scratch[(group * kMaxRows + r) * HeadDim + 2 * pair + 1] = acc[r][1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < t.rows * a.head_dim; idx += kThreads) {
    const int r = idx / a.head_dim, c = idx % a.head_dim;
    float o = 0.0f;
    for (int g = 0; g < Tr::kKeyGroups; ++g) o += scratch[(g * kMaxRows + r) * HeadDim + c];
    const RowState st{m_s[r] * kLn2, l_s[r]};  // m back to the natural-log domain
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
__global__ void __launch_bounds__(kThreads) decode_kernel(const KvCacheParams p, const Work w) {
  using Tr = Traits<HeadDim>;
  extern __shared__ __align__(16) uint8_t smem[];
  T* ring = reinterpret_cast<T*>(smem);
  float* q_s = reinterpret_cast<float*>(smem + Tr::kRingBytesUsed);
  float* s_s = q_s + kMaxRows * HeadDim;
  float* m_s = s_s + kMaxRows * Tr::kBlockK;
  float* l_s = m_s + kMaxRows;
  float* c_s = l_s + kMaxRows;

  const TileWork t = tile_work(p, w, Tr::kBlockK);
  // Indices may have changed since the host checked them (graph replays): a
  // split whose length or pages are out of range reads nothing and gives NaN.
  const bool in_range = cache_length_valid(p, t.b) &&
                        keys_addressable(p, t.b, t.tile_begin * Tr::kBlockK,
                                         min(p.keys(t.b), t.tile_end * Tr::kBlockK), threadIdx.x, kThreads);
  const bool poisoned = !__syncthreads_and(in_range);
  const int tiles = poisoned ? 0 : t.tile_end - t.tile_begin;
  constexpr int kStageElems = Tr::kStageBytes / 2;
  for (int s = 0; s < Tr::kStages - 1; ++s) {
    if (s < tiles) load_tile<T, HeadDim>(p, t, t.tile_begin + s, ring + s * kStageElems);
    cp_async_commit();
  }
  load_queries<T, HeadDim>(p, w, t, q_s);
  if (threadIdx.x < kMaxRows) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  float acc[kMaxRows][2] = {};
  for (int it = 0; it < tiles; ++it) {
    const int ahead = it + Tr::kStages - 1;
    if (ahead < tiles) load_tile<T, HeadDim>(p, t, t.tile_begin + ahead, ring + (ahead % Tr::kStages) * kStageElems);
    cp_async_commit();
    cp_async_wait<Tr::kStages - 1>();
    __syncthreads();
    const T* k_s = ring + (it % Tr::kStages) * kStageElems;
    tile_scores<T, HeadDim>(p, t, t.tile_begin + it, k_s, q_s, s_s);
    __syncthreads();
    tile_softmax<HeadDim>(s_s, m_s, l_s, c_s);
    __syncthreads();
    tile_pv<T, HeadDim>(k_s + Tr::kBlockK * Tr::kRowElems, s_s, c_s, acc);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  write_rows<T, HeadDim>(p, w, t, acc, reinterpret_cast<float*>(smem), m_s, l_s, poisoned);
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
