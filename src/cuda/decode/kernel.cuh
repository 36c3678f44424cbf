// Split-KV decode (flash decoding) for attention against a KV cache.
//
// One CTA owns (packed query tile, KV head, sequence, split). The packed tile
// holds up to kMaxRows rows r = i * group + g: query position i of query head
// hk * group + g, so the query heads sharing a KV head read each K/V tile once.
// The split walks its share of the sequence's visible key tiles through a
// cp.async ring (rows addressed by a K/V source: source.cuh), keeps an online
// softmax per row, and writes either the final output (one split) or a
// normalised partial (O, lse) in f32 that combine.cuh merges.
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
#include "attention/score_mod.h"
#include "attention/state.h"
#include "core/kvcache.h"
#include "core/numeric.h"
#include "cuda/common/mma.h"
#include "cuda/decode/common.cuh"
#include "cuda/decode/nonfinite.cuh"
#include "cuda/decode/source.cuh"
#include "cuda/decode/tuning.h"

namespace flashattn::cuda::decode {

// An L2 cache policy that evicts the lines it tags first: K/V are read once,
// so they should not push out what is read again (q, the block table, the
// partials the combine reads back).
// NOTES: measured on the H100 (docs/performance.md 3.6): batch 1 x 16k +2.5%,
// the other decode shapes within 1%.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes of a K/V row, global -> shared, L1 bypassed, tagged with `policy`;
// the L2 fetches the 128-byte span around it on a miss (the row's other chunks
// come with it).
// NOTES: measured on the H100 (docs/performance.md 3.6) with the padded ring
// before the swizzled one: +2-2.5% on the contiguous cache at batch 16-128 and
// batch 1 x 64k-256k, paged caches level; a 256-byte span measured the same.
// With the swizzled ring's aligned sectors the copy probe
// (bench/probes/cp_async_maps.cu) reads the same with or without it.
__device__ __forceinline__ void cp_async_row_16(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy));
}

// Calls f(key, chunk, valid, k_off, v_off) for the 16-byte column chunks of
// key tile `tile` this thread copies (the source's CopyMap): valid is false for
// rows past the sequence, rows the source refuses and columns past the head dim.
template <int HeadDim, class Source, class F>
__device__ __forceinline__ void for_tile_rows(const KvCacheParams& p, const TileWork& t, const Source& src,
                                              const typename Source::Rows& rows, int tile, F&& f) {
  using Tr = Traits<HeadDim>;
  using Map = typename Source::Map;
  const int chunk0 = Map::chunk0(), key0 = Map::key0();
#pragma unroll
  for (int n = 0; n < Map::kRowsPerThread; ++n) {
    const int key = key0 + n * Map::kRowsPerPass, j = tile * Tr::kBlockK + key;
    int64_t k_off = 0, v_off = 0;
    const bool row_ok = j < t.keys && src.offsets(rows, j, n, k_off, v_off);
#pragma unroll
    for (int seg = 0; seg < Map::kSegments; ++seg) {
      const int chunk = chunk0 + seg * Map::kLaneChunks;
      f(key, chunk, row_ok && chunk * 8 < p.attn.head_dim, k_off + chunk * 8, v_off + chunk * 8);
    }
  }
}

// Whether key tile `tile` is whole: every row inside the sequence and no
// column past the head dim, so none of its copies needs a check.
template <int HeadDim>
__device__ __forceinline__ bool whole_tile(const KvCacheParams& p, const TileWork& t, int tile) {
  return p.attn.head_dim == HeadDim && (tile + 1) * Traits<HeadDim>::kBlockK <= t.keys;
}

// for_tile_rows of a whole tile whose rows lie at the cache's row stride from
// the thread's first one (Source::tile_rows gave its offsets k_first, v_first):
// f(ring element, k_off, v_off, chunk) per chunk (the ring elements depend on
// the thread and n only: fixed per thread).
// NOTES: the per-row path checks, translates and swizzles every row (~260
// instructions a warp per d128 tile, ncu); here a row is two additions and
// its copies (~45 a tile). Measured on the H100 (docs/performance.md 3.6):
// head dim 64, whose tiles carry half the bytes, +2-14%; d128 level to +6%
// (a d128 batch-1 split waits on its tiles' bytes, not on issuing copies).
template <int HeadDim, class Source, class F>
__device__ __forceinline__ void for_whole_tile_rows(const KvCacheParams& p, int64_t k_first, int64_t v_first,
                                                    F&& f) {
  using Tr = Traits<HeadDim>;
  using Map = typename Source::Map;
  const int chunk0 = Map::chunk0(), key0 = Map::key0();
  const int64_t k_pass = int64_t{Map::kRowsPerPass} * p.attn.k_row_stride;
  const int64_t v_pass = int64_t{Map::kRowsPerPass} * p.attn.v_row_stride;
#pragma unroll
  for (int n = 0; n < Map::kRowsPerThread; ++n) {
#pragma unroll
    for (int seg = 0; seg < Map::kSegments; ++seg) {
      const int chunk = chunk0 + seg * Map::kLaneChunks;
      f(Tr::ring_elem(key0 + n * Map::kRowsPerPass, chunk), k_first + n * k_pass + chunk * 8,
        v_first + n * v_pass + chunk * 8, chunk);
    }
  }
}

// Issues the cp.async copies of key tile `tile` (K and V rows) into a ring
// stage; rows and columns that are not valid are zero-filled.
template <typename T, int HeadDim, class Source>
__device__ __forceinline__ void load_tile(const KvCacheParams& p, const TileWork& t, const Source& src,
                                          const typename Source::Rows& rows, int tile, T* stage,
                                          uint64_t policy) {
  using Tr = Traits<HeadDim>;
  const T* k = static_cast<const T*>(p.attn.k);
  const T* v = static_cast<const T*>(p.attn.v);
  int64_t k_first, v_first;
  if (whole_tile<HeadDim>(p, t, tile) && src.tile_rows(rows, tile, k_first, v_first)) {
    for_whole_tile_rows<HeadDim, Source>(p, k_first, v_first, [&](int elem, int64_t k_off, int64_t v_off, int) {
      cp_async_row_16(smem_addr(stage + elem), k + k_off, true, policy);
      cp_async_row_16(smem_addr(stage + Tr::kBlockElems + elem), v + v_off, true, policy);
    });
    return;
  }
  for_tile_rows<HeadDim>(p, t, src, rows, tile, [&](int key, int chunk, bool valid, int64_t k_off, int64_t v_off) {
    T* dst = stage + Tr::ring_elem(key, chunk);
    cp_async_row_16(smem_addr(dst), k + (valid ? k_off : 0), valid, policy);
    cp_async_row_16(smem_addr(dst + Tr::kBlockElems), v + (valid ? v_off : 0), valid, policy);
  });
}

// Asks the L2 for key tile `tile` (K and V rows) without copying it: one
// prefetch per 128-byte line, from the thread holding the line's first chunk.
// Only for sources whose rows are known by then (Source::kPrefetchesAhead).
template <typename T, int HeadDim, class Source>
__device__ __forceinline__ void prefetch_tile(const KvCacheParams& p, const TileWork& t, const Source& src,
                                              const typename Source::Rows& rows, int tile) {
  using Tr = Traits<HeadDim>;
  const T* k = static_cast<const T*>(p.attn.k);
  const T* v = static_cast<const T*>(p.attn.v);
  const auto line = [&](int64_t k_off, int64_t v_off) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k + k_off));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(v + v_off));
  };
  int64_t k_first, v_first;
  if (whole_tile<HeadDim>(p, t, tile) && src.tile_rows(rows, tile, k_first, v_first)) {
    for_whole_tile_rows<HeadDim, Source>(p, k_first, v_first, [&](int, int64_t k_off, int64_t v_off, int chunk) {
      if (chunk % Tr::kLineChunks == 0) line(k_off, v_off);
    });
    return;
  }
  for_tile_rows<HeadDim>(p, t, src, rows, tile, [&](int, int chunk, bool valid, int64_t k_off, int64_t v_off) {
    if (valid && chunk % Tr::kLineChunks == 0) line(k_off, v_off);
  });
}

// NOTES: issued before the grid dependency wait, while the kernel before this
// one (a previous call's combine, the append, the caller's kernel) still runs:
// the L2 fetches the tiles the ring's prologue copies right after the wait, so
// their DRAM latency overlaps that kernel instead of following it. The tiles
// come from the sequence's length as read now (L2 only, no L1 line that a later
// read could find stale), which that kernel may still change: a guess, used for
// nothing but these prefetches, and clamped to the cache (cache_length_valid),
// so a wrong one costs bandwidth, never a wrong read. The real length is read
// after the wait (tile_work). Measured on the H100 (docs/performance.md 3.6),
// with the combine letting the next decode kernel launch before its own wait:
// batch 16 x 4k +6.8%, batch 1 x 64k +3.4%, the other shapes -1..+2%.
template <typename T, int HeadDim, class Source>
__device__ __forceinline__ void prefetch_before_wait(const KvCacheParams& p, const Work& w, int stages) {
  using Tr = Traits<HeadDim>;
  KvCacheParams guess = p;
  guess.cache_seqlen = p.cache_seqlens != nullptr ? __ldcg(p.cache_seqlens + blockIdx.z) : p.cache_seqlen;
  guess.cache_seqlens = nullptr;
  const TileWork t = tile_work(guess, w, Tr::kBlockK);
  if (!t.length_ok) return;
  const Source src(guess, w, t);
  const typename Source::Rows rows{};
  const int last = min(t.tile_end, t.tile_begin + stages - 1);
  for (int tile = t.tile_begin; tile < last; ++tile) prefetch_tile<T, HeadDim>(guess, t, src, rows, tile);
}

// The tile's packed q rows into shared memory, 16 bytes at a time (q's rows
// start 16-byte aligned: backend.cu checks q's strides and pointer; the rotated
// copy is packed), zeros past the rows and the head dim.
template <typename T, int HeadDim>
__device__ __forceinline__ void load_queries(const KvCacheParams& p, const Work& w, const TileWork& t,
                                             T* q_s) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  for (int idx = threadIdx.x; idx < kMaxRows * Tr::kChunks; idx += kThreads) {
    const int r = idx / Tr::kChunks, c = (idx % Tr::kChunks) * 8;
    const bool valid = r < t.rows && c < a.head_dim;
    const int pr = valid ? r : 0;
    const T* q = query_row<T>(p, w, t.b, t.query_of(pr), t.head_of(pr));
    cp_async_16(smem_addr(q_s + r * Tr::kQRowElems + c), q + (valid ? c : 0), valid);
  }
}

__device__ __forceinline__ uint32_t lds32(const void* p) { return *static_cast<const uint32_t*>(p); }

// NOTES (key-major slices): a slice computes S^T = K Q^T and O^T += V^T P^T,
// keys and O's columns as the mma's M (16) and the packed rows as its N, in
// row tiles of 8. Decoding packs few rows (GQA 4 with one query token: 4), and
// the row-major form (rows as M, 16 of them) spent 12 of every 16 rows of its
// mma's on padding; a tile of at most 8 rows runs one row tile here, half the
// mma's. The C fragment of S^T holds keys g, g + 8 of rows 2tq, 2tq + 1; P^T's
// B fragment needs the transpose (keys 2tq.. of row g): movmatrix.

// One warp's state: Q^T as mma B fragments, O^T's fragments, the online
// softmax of its rows 8 nt + 2 tq + j (m in the log2 domain, the same in the
// 8 lanes sharing a row; l this lane's share over its keys, summed over the
// lanes in write_rows) and their ALiBi slopes (the rows of a packed tile
// belong to different query heads).
template <int HeadDim>
struct WarpState {
  using Tr = Traits<HeadDim>;
  uint32_t q[Tr::kKSteps][Tr::kRowTiles][2];
  float o[Tr::kOTiles][Tr::kRowTiles][4];
  float m[Tr::kRowTiles][2];
  float l[Tr::kRowTiles][2];
  float slope[Tr::kRowTiles][2];  // 0 without ALiBi
};

// Row tiles that hold packed rows (uniform over the CTA): the rest are skipped.
__device__ __forceinline__ bool row_tile_used(const TileWork& t, int nt) {
  return nt == 0 || nt * 8 < t.rows;
}

// S^T = K Q^T of the warp's 16 keys, scaled, softcapped, ALiBi-biased, masked
// (log2 domain), in the order of attention/score_mod.h. s[nt][e]: key
// g + 8 (e / 2) of the slice, packed row 8 nt + 2 tq + e % 2.
template <typename T, int HeadDim>
__device__ __forceinline__ void slice_scores(const KvCacheParams& p, const TileWork& t, int key0,
                                             const T* k_s, const WarpState<HeadDim>& ws,
                                             float (&s)[Traits<HeadDim>::kRowTiles][4]) {
  using Tr = Traits<HeadDim>;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int slice_key = key0 % Tr::kBlockK;
  // Even and odd k-steps accumulate apart (summed below): two mma chains of
  // half the length, since one row tile leaves a single chain otherwise.
  float acc[2][Tr::kRowTiles][4];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[c][nt][e] = 0.0f;
    }
  }
  // K rows are A (keys x columns, row-major): ldmatrix.x4, lanes 8m..8m+7
  // addressing keys (m % 2) * 8 + 0..7 at columns (m / 2) * 8 of the k-step,
  // gives a0..a3 of the k-step in one shared load.
  const int row = slice_key + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll
  for (int ks = 0; ks < Tr::kKSteps; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(k_s + Tr::ring_elem(row, 2 * ks + lane / 16)));
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
      if (row_tile_used(t, nt)) mma_m16n8k16<T>(acc[ks % 2][nt], a, ws.q[ks][nt][0], ws.q[ks][nt][1]);
    }
  }
  const AttentionParams& a = p.attn;
  // NOTES: a slice that every packed row sees whole (all but the sequence's
  // last keys and a window's edges) skips the per-element mask, a warp-uniform
  // branch; the padding rows past t.rows then score their zero q, which no
  // store reads.
  const bool whole = t.mask.tile_fully_visible(t.query_of(0), t.query_of(t.rows - 1) + 1, key0,
                                               key0 + Tr::kSliceKeys);
  const auto modified = [&](float x, float slope, int i, int j) {
    x *= a.scale;
    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
    // The distance counts from the diagonal of the sequence's keys (cache + new tokens).
    if (a.has_alibi()) x = AlibiScore{slope, t.mask.diagonal_offset()}(x, i, j);
    return x * kLog2e;
  };
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
    if (!row_tile_used(t, nt)) continue;  // s[nt] is not read (slice_softmax, slice_pv)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = nt * 8 + 2 * tq + e % 2, j = key0 + g + (e >= 2 ? 8 : 0), i = t.query_of(r);
      const float x = acc[0][nt][e] + acc[1][nt][e], slope = ws.slope[nt][e % 2];
      if (whole) {
        s[nt][e] = modified(x, slope, i, j);
      } else {
        s[nt][e] = r < t.rows && t.mask.visible(i, j) ? modified(x, slope, i, j) : -INFINITY;
      }
    }
  }
}

// Max over the 8 lanes that hold the other keys of a row (same tq).
__device__ __forceinline__ float key_lanes_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float key_lanes_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

// Online softmax of the slice's scores into P (in place), rescaling O when the
// reference max moves.
// NOTES: m is a reference, not necessarily the running max: while no score of
// the warp has grown past its row's m by more than kRescaleSlack (log2 units),
// O, l and m stay and P = 2^(S - m) may reach 2^kRescaleSlack. O / l and the
// lse m + log2 l are the same for any reference, so this is exact; once the
// rows' maxima settle, a slice skips both the O rescale (kOTiles * 4
// multiplies a thread and used row tile: 32 at head dim 128) and the row
// max's shuffles (three per row a thread holds): one vote
// instead. A grown row sets every row of the warp to its exact max (uniform
// branch). l is this lane's share, so P's sum needs no shuffle either.
template <int HeadDim>
__device__ __forceinline__ void slice_softmax(const TileWork& t, float (&s)[Traits<HeadDim>::kRowTiles][4],
                                              WarpState<HeadDim>& ws) {
  using Tr = Traits<HeadDim>;
  bool grown = false;
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
    if (!row_tile_used(t, nt)) continue;
#pragma unroll
    for (int j = 0; j < 2; ++j) grown |= fmaxf(s[nt][j], s[nt][j + 2]) > ws.m[nt][j] + kRescaleSlack;
  }
  if (__any_sync(0xffffffffu, grown)) {
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
      if (!row_tile_used(t, nt)) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // m_new = max(m, rowmax(S)); c = 2^(m_old - m_new), 1 for a row that has seen no key (m = -inf)
        const float m_new = key_lanes_max(fmaxf(ws.m[nt][j], fmaxf(s[nt][j], s[nt][j + 2])));
        const float c = m_new == -INFINITY ? 1.0f : fast_exp2(ws.m[nt][j] - m_new);
        ws.m[nt][j] = m_new;
        ws.l[nt][j] *= c;
#pragma unroll
        for (int ot = 0; ot < Tr::kOTiles; ++ot) {
          ws.o[ot][nt][j] *= c;
          ws.o[ot][nt][j + 2] *= c;
        }
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
    if (!row_tile_used(t, nt)) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // P = 2^(S - m); 2^-inf = 0 for masked keys, and 0 throughout a row without a max yet
      const float m = ws.m[nt][e % 2];
      s[nt][e] = m == -INFINITY ? 0.0f : fast_exp2(s[nt][e] - m);
      ws.l[nt][e % 2] += s[nt][e];
    }
  }
}

// O^T += V^T P^T over the slice's 16 keys and the warp's columns: V^T is the A
// fragment (columns x keys), P^T the B fragment (keys x rows), the transpose
// of the scores' C fragments (keys 0-7 and 8-15 of the slice).
template <typename T, int HeadDim>
__device__ __forceinline__ void slice_pv(const TileWork& t, const float (&s)[Traits<HeadDim>::kRowTiles][4],
                                         int slice_key, int column0, const T* v_s, WarpState<HeadDim>& ws) {
  using Tr = Traits<HeadDim>;
  uint32_t pb[Tr::kRowTiles][2];
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
    if (!row_tile_used(t, nt)) continue;
    pb[nt][0] = movmatrix_trans(MmaType<T>::pack(s[nt][0], s[nt][1]));
    pb[nt][1] = movmatrix_trans(MmaType<T>::pack(s[nt][2], s[nt][3]));
  }
  const int lane = threadIdx.x % 32;
  // ldmatrix.x4.trans: lanes 8m..8m+7 address keys (m / 2) * 8 + 0..7 at
  // columns c + (m % 2) * 8: a0..a3 of V^T's columns c..c+15.
  const int row = slice_key + (lane / 16) * 8 + lane % 8;
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ++ot) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, smem_addr(v_s + Tr::ring_elem(row, column0 / 8 + 2 * ot + (lane / 8) % 2)));
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
      if (row_tile_used(t, nt)) mma_m16n8k16<T>(ws.o[ot][nt], a, pb[nt][0], pb[nt][1]);
    }
  }
}

// The warps' slices merged through the drained ring, then the rows written: out
// and lse with one split, else the normalised partial. Returns (to every
// thread) the rows stored with an Inf or NaN, bit r for packed row r, for
// fix_rows (nonfinite.cuh), gathered in the shared word *nonfinite_rows; none
// when `poisoned` (indices out of range: NaN rows by design). NOTES: the
// merged state of each row and its slices' weights (merge_weight) are computed
// once per row, so an element is a weighted sum of its slices' O.
template <typename T, int HeadDim>
__device__ __forceinline__ uint32_t write_rows(const KvCacheParams& p, const Work& w, const TileWork& t,
                                           const WarpState<HeadDim>& ws, float* scratch,
                                           uint32_t* nonfinite_rows, bool poisoned) {
  using Tr = Traits<HeadDim>;
  const AttentionParams& a = p.attn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int slice = warp % Tr::kKeySlices, part = warp / Tr::kKeySlices;
  float* o_s = scratch;                                            // [slice][row][column]
  float* ml_s = o_s + Tr::kKeySlices * kMaxRows * Tr::kMergeRowFloats;  // [slice][row][m, l]
  float* weight_s = ml_s + Tr::kKeySlices * kMaxRows * 2;          // [slice][row]
  float* lse_s = weight_s + Tr::kKeySlices * kMaxRows;             // [row]
  if (threadIdx.x == 0) *nonfinite_rows = 0;
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ++ot) {
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = nt * 8 + 2 * tq + e % 2, c = part * Tr::kColumns + ot * 16 + g + (e >= 2 ? 8 : 0);
        o_s[(slice * kMaxRows + r) * Tr::kMergeRowFloats + c] = ws.o[ot][nt][e];
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float l = key_lanes_sum(ws.l[nt][j]);  // the row's l over the lanes' keys
      if (part == 0 && g == 0) {
        float* ml = ml_s + (slice * kMaxRows + nt * 8 + 2 * tq + j) * 2;
        ml[0] = ws.m[nt][j] * kLn2;  // the merge works in the natural-log domain
        ml[1] = l;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kMaxRows) {
    const int r = threadIdx.x;
    // With one split this is the row's whole key set: its sink joins here.
    RowState st = w.splits == 1 && r < t.rows ? sink_state(a, t.head_of(r)) : RowState::empty();
    for (int sl = 0; sl < Tr::kKeySlices; ++sl) {
      const float* ml = ml_s + (sl * kMaxRows + r) * 2;
      st = merge_factors(st, RowState{ml[0], ml[1]}, OutputForm::kUnnormalized).merged;
    }
    for (int sl = 0; sl < Tr::kKeySlices; ++sl) {
      weight_s[sl * kMaxRows + r] = merge_weight(st, ml_s[(sl * kMaxRows + r) * 2]);
    }
    lse_s[r] = st.lse();
  }
  __syncthreads();
  uint32_t found = 0;  // rows of this thread's values that are Inf or NaN
  // Columns counted in the bucket's HeadDim (a shift, not a runtime division:
  // this loop is the CTA's last stretch), those past the head dim skipped.
  for (int idx = threadIdx.x; idx < t.rows * HeadDim; idx += kThreads) {
    const int r = idx / HeadDim, c = idx % HeadDim;
    if (c >= a.head_dim) continue;
    float o = 0.0f;
#pragma unroll
    for (int sl = 0; sl < Tr::kKeySlices; ++sl) {
      o += weight_s[sl * kMaxRows + r] * o_s[(sl * kMaxRows + r) * Tr::kMergeRowFloats + c];
    }
    float lse = lse_s[r];
    if (poisoned) o = lse = NAN;
    if (nonfinite::found(nonfinite::poison(0.0f, o))) found |= 1u << r;
    const int i = t.query_of(r), h = t.head_of(r);
    if (w.splits == 1) {
      static_cast<T*>(a.out)[out_offset(a, t.b, i, h) + c] = from_float<T>(o);
      if (a.lse != nullptr && c == 0) a.lse[lse_index(a, t.b, i, h)] = lse;
    } else {
      const int64_t row = partial_row(a, t.split, t.b, i, h);
      w.partial_o[row * a.head_dim + c] = o;
      if (c == 0) w.partial_lse[row] = lse;
    }
  }
  found = __reduce_or_sync(0xffffffffu, found);
  if (lane == 0 && found != 0 && !poisoned) atomicOr(nonfinite_rows, found);
  __syncthreads();  // also orders the stores above before fix_rows' stores
  return *nonfinite_rows;
}

// Q^T as the warp's mma B fragments, O zero, the softmax state empty, the rows' slopes.
template <typename T, int HeadDim>
__device__ __forceinline__ void init_warp(const AttentionParams& a, const TileWork& t, const T* q_s,
                                          WarpState<HeadDim>& ws) {
  using Tr = Traits<HeadDim>;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int ks = 0; ks < Tr::kKSteps; ++ks) {
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
      // b0, b1 = Q^T[columns 2tq.. (+8)][row g] = Q[row g][columns 2tq.. (+8)]
      const T* q = q_s + (nt * 8 + g) * Tr::kQRowElems + ks * 16 + 2 * tq;
      ws.q[ks][nt][0] = lds32(q);
      ws.q[ks][nt][1] = lds32(q + 8);
    }
  }
#pragma unroll
  for (int ot = 0; ot < Tr::kOTiles; ++ot) {
#pragma unroll
    for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ws.o[ot][nt][e] = 0.0f;
    }
  }
#pragma unroll
  for (int nt = 0; nt < Tr::kRowTiles; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = nt * 8 + 2 * tq + j;
      ws.m[nt][j] = -INFINITY;
      ws.l[nt][j] = 0.0f;
      ws.slope[nt][j] = a.has_alibi() && r < t.rows ? a.alibi_slope(t.b, t.head_of(r)) : 0.0f;
    }
  }
}

// NOTES: cp.async groups, oldest first: q, then one per key tile. The ring
// holds kStages tiles, kStages - 1 in flight while one is read; the source
// rows (block-table entries) of the tile after the next one to copy are
// fetched in the loop, two tiles ahead: a tile of math is shorter than a table
// lookup under full HBM traffic (fetched a tile ahead, the lookups' latency
// showed: paged caches at batch 1 read 3-9% slower, docs/performance.md 3.6). With
// w.l2_prefetch (a short split of a contiguous cache, api.cu) the tile after
// the ring's is also requested into the L2 (prefetch_tile), so one more tile
// is in flight without shared memory.
//
// Indices may have changed since the host checked them (graph replays): a
// sequence whose length or cache row is out of range reads nothing, a page
// outside the pool is not read; either gives NaN rows.
template <typename T, int HeadDim, int RingBytes, template <int> class Source>
__global__ void __launch_bounds__(kThreads, 2) decode_kernel(const __grid_constant__ KvCacheParams p,
                                                                  const __grid_constant__ Work w) {
  using Tr = Traits<HeadDim>;
  using Src = Source<HeadDim>;
  constexpr int kStages = Ring<HeadDim, RingBytes>::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  T* ring = reinterpret_cast<T*>(smem);
  T* q_s = reinterpret_cast<T*>(smem + Ring<HeadDim, RingBytes>::kBytes);
  if constexpr (Src::kAddressesAhead && griddepcontrol_compiled()) {
    if (w.early_prefetch) prefetch_before_wait<T, HeadDim, Src>(p, w, kStages);
  }
  // Launched early behind the kernel before it (api.cu), this CTA uses
  // nothing that kernel may write (q, lengths, pages, cache rows) before its
  // writes are visible (the prefetch's guessed length above only picks lines
  // for the L2); then the combine kernel may take free slots and wait in turn.
  wait_for_prior_grid();
  allow_dependent_launch();

  const TileWork t = tile_work(p, w, Tr::kBlockK);
  Src src(p, w, t);
  const bool readable = t.length_ok && src.indices_ok();
  const int tiles = readable ? t.tile_end - t.tile_begin : 0;
  constexpr int kStageElems = Tr::kStageBytes / 2;
  typename Src::Rows rows, next;  // the source rows of the next tile to copy and of the tile after it
  const uint64_t policy = evict_first_policy();
  // A short split also keeps the tile after the ring's on its way into the L2.
  const bool prefetch = Src::kPrefetchesAhead && w.l2_prefetch;
  if (tiles > 0) src.fetch(t.tile_begin, rows);
  load_queries<T, HeadDim>(p, w, t, q_s);
  cp_async_commit();
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) {
      load_tile<T, HeadDim>(p, t, src, rows, t.tile_begin + s, ring + s * kStageElems, policy);
      if (s + 1 < tiles) src.fetch(t.tile_begin + s + 1, rows);
    }
    cp_async_commit();
  }
  if (kStages < tiles) src.fetch(t.tile_begin + kStages, next);
  if (prefetch && kStages - 1 < tiles) prefetch_tile<T, HeadDim>(p, t, src, rows, t.tile_begin + kStages - 1);
  cp_async_wait<kStages - 1>();  // q landed
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int slice = warp % Tr::kKeySlices, column0 = (warp / Tr::kKeySlices) * Tr::kColumns;
  WarpState<HeadDim> ws;
  init_warp<T, HeadDim>(p.attn, t, q_s, ws);
  for (int it = 0; it < tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` landed for every thread; the stage read last turn is free
    const int ahead = it + kStages - 1;
    if (ahead < tiles) {
      load_tile<T, HeadDim>(p, t, src, rows, t.tile_begin + ahead, ring + (ahead % kStages) * kStageElems,
                            policy);
      if (ahead + 1 < tiles) {
        rows = next;
        if (ahead + 2 < tiles) src.fetch(t.tile_begin + ahead + 2, next);
        if (prefetch) prefetch_tile<T, HeadDim>(p, t, src, rows, t.tile_begin + ahead + 1);
      }
    }
    cp_async_commit();
    const T* k_s = ring + (it % kStages) * kStageElems;
    const int key0 = (t.tile_begin + it) * Tr::kBlockK + slice * Tr::kSliceKeys;
    float s[Tr::kRowTiles][4];
    slice_scores<T, HeadDim>(p, t, key0, k_s, ws, s);
    slice_softmax<HeadDim>(t, s, ws);
    slice_pv<T, HeadDim>(t, s, slice * Tr::kSliceKeys, column0, k_s + Tr::kBlockElems, ws);
  }
  cp_async_wait<0>();
  const bool poisoned = __syncthreads_or(!readable || src.saw_bad_index());
  uint32_t* flag = reinterpret_cast<uint32_t*>(smem + Ring<HeadDim, RingBytes>::kFlagOffset);
  const uint32_t nonfinite_rows = write_rows<T, HeadDim>(p, w, t, ws, reinterpret_cast<float*>(smem), flag, poisoned);
  if (nonfinite_rows != 0) fix_rows<T>(p, w, Tr::kBlockK, nonfinite_rows);  // rare
}

// Appends k_new (rotated) / v_new into the cache and writes the rotated q: one
// block per (token row, sequence). Sequences with indices out of range write nothing.
template <typename T>
__global__ void __launch_bounds__(kThreads) append_kernel(const KvCacheParams p, const Work w) {
  allow_dependent_launch();  // the decode kernel may launch and wait for this one
  const AttentionParams& a = p.attn;
  const int i = blockIdx.x, b = blockIdx.y, d = a.head_dim;
  // The Hopper route's key counts: the forward reads every key of the sequence
  // (through the cache's tensor map), so block 0 checks all of them again and
  // marks a sequence with an index out of range (-1: its rows come out NaN, as
  // from the decode kernel).
  if (w.key_counts != nullptr && i == 0) {
    const bool ok = __syncthreads_and(cache_length_valid(p, b) &&
                                      keys_addressable(p, b, 0, p.keys(b), threadIdx.x, kThreads));
    if (threadIdx.x == 0) w.key_counts[b] = ok ? p.keys(b) : -1;
  }
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
