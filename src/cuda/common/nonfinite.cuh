// The GPU NaN/Inf rules (docs/semantics.md) where a kernel stores its rows.
//
// Why a store-time check is enough: a tensor-core product adds P x V (or
// dS x K, ...) for every pair of a tile, and at a masked pair the factor is 0
// exactly, but 0 x Inf and 0 x NaN are NaN. NaN is absorbing in every later
// step of the kernels (sums, products, the O / l scaling; the running maxima
// never take an accumulator), so such a contamination always leaves a NaN in
// the f32 value about to be stored. A finite value never met one.
//
// So each epilogue folds the values it stores into one f32 check (poison():
// x * 0 is NaN exactly when x is Inf or NaN, one FFMA a value) and, only when
// that comes out NaN, calls one of the out-of-line fixes below. A fix
// recomputes the affected rows exactly, in f32, pair by pair over the pairs
// the row really has (its visible keys, or a key's visible queries), with the
// code the reference and the CPU backend use (attention/mask.h, score_mod.h,
// dropout.h, block masks through the launch's tile lists (ListedPairs)), and
// stores them over the tile's regular stores:
//   forward   out rows and their lse
//   backward  dq rows (post-pass); dk and dv rows of a key and KV head
// Formulas (the reference's, src/reference/reference.cpp):
//   s_ij  = softcap(scale q_i . k_j) + ALiBi(i, j)
//   P_ij  = exp(s_ij - lse_i), 0 where s_ij = -inf
//   out_i = sum_j P_ij z_ij v_j                         (z: dropout's factor)
//   dS_ij = P_ij (z_ij dO_i . v_j - D_i) softcap'(s_ij)
//   dq_i  = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij z_ij dO_i
//
// NOTES: the fixes are __noinline__ so the kernels' own code (and registers)
// stay as they were: the plain path pays the FFMAs and one vote or barrier
// per tile. They take the call's parameters by reference (the kernels'
// parameter is __grid_constant__: no local copy) and few scalars. The rare
// path is written for clarity, not speed: one warp a row, lane l holding
// columns l, l + 32, ..., every dot product a warp-wide sum.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/dropout.h"
#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/common/convert.h"
#include "cuda/common/block_sparse.cuh"

namespace flashattn::cuda::nonfinite {

// Bit 15 of each 16-bit half of a packed pair set where that half is Inf or
// NaN (exponent all ones: |h| >= E).
// NOTES: |h| + (0x8000 - E) reaches 0x8000 exactly when |h| >= E and never
// carries into the next half (|h| <= 0x7fff): three integer instructions a
// pair, for epilogues that hold the packed values and have no register to
// spare for an f32 check (the Hopper forward's d64 kernel spilled with one).
template <typename T>
__device__ __forceinline__ uint32_t nonfinite_bits(uint32_t packed) {
  constexpr uint32_t kAllOnes = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;  // else bf16
  constexpr uint32_t kBias = (0x8000u - kAllOnes) * 0x10001u;
  return ((packed & 0x7fff7fffu) + kBias) & 0x80008000u;
}

// check = poison(check, x) over every stored x: NaN iff one of them is Inf or NaN.
__device__ __forceinline__ float poison(float check, float x) { return fmaf(x, 0.0f, check); }
__device__ __forceinline__ bool found(float check) { return check != check; }

// Which 8-column chunks of a row a fix stores (bit c: columns 8c .. 8c + 7;
// 32 bits cover kMaxHeadDim): a warp that owns only some columns of a row
// (the Hopper backward's split-d, the dq post-pass) rewrites only those.
inline constexpr uint32_t kAllChunks = 0xffffffffu;
static_assert(kMaxHeadDim / 8 <= 32, "one bit per 8-column chunk");

// A launch without a block mask (its walk's Tiles is empty): the fixes take
// no ListedPairs argument then.
struct NoBlockMask {};

// The fixes' view of a launch's lists (kernel tiles kTileM x kTileN).
template <int kTileM, int kTileN>
__device__ __forceinline__ ListedPairs pairs_of(const BlockTiles& tiles) {
  return {tiles.key_tiles, tiles.blocks, kTileM, kTileN};
}
template <int kTileM, int kTileN, class Tiles>
__device__ __forceinline__ NoBlockMask pairs_of(const Tiles&) {
  return {};
}

// Where a fix finds a sequence's keys and their K and V rows: the call's
// tensors (TensorKeys), or a KV cache with per-sequence key counts in
// p.seqused_k (the Hopper forward's KV-cache route): its rows (CacheKeys), or
// its pages through a block table (PagedKeys: key j is row j % page of page
// table[b * stride + j / page]; the route's pages are powers of two).
struct TensorKeys {
  __device__ __forceinline__ SequenceInfo sequence(const AttentionParams& p, int b) const {
    return sequence_info(p, b);
  }
  __device__ __forceinline__ int64_t offset(const AttentionParams& p, const SequenceInfo& seq, int b, int j, int hk,
                                            int64_t batch_stride, int64_t row_stride, int64_t head_stride) const {
    return row_offset(b, seq.row_k, j, hk, batch_stride, row_stride, head_stride, p.is_varlen());
  }
};
struct CacheKeys : TensorKeys {
  __device__ __forceinline__ SequenceInfo sequence(const AttentionParams& p, int b) const {
    SequenceInfo s = sequence_info(p, b);
    s.seqlen_k = p.seqused_k[b];
    return s;
  }
};
struct PagedKeys : CacheKeys {
  const int32_t* table;
  int64_t table_stride;
  int page_shift;
  __device__ __forceinline__ PagedKeys(const int32_t* t, int64_t stride, int shift)
      : table(t), table_stride(stride), page_shift(shift) {}
  __device__ __forceinline__ int64_t offset(const AttentionParams&, const SequenceInfo&, int b, int j, int hk,
                                            int64_t batch_stride, int64_t row_stride, int64_t head_stride) const {
    const int64_t page = table[b * table_stride + (j >> page_shift)];
    return page * batch_stride + static_cast<int64_t>(j & ((1 << page_shift) - 1)) * row_stride + hk * head_stride;
  }
};

namespace detail {

constexpr int kLaneCols = kMaxHeadDim / 32;  // columns per lane: lane + 32 r

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// This lane's columns of one row, in f32 (0 past the head dim).
struct LaneRow {
  float v[kLaneCols];

  template <typename T>
  __device__ __forceinline__ void load(const T* row, int d, int lane) {
#pragma unroll
    for (int r = 0; r < kLaneCols; ++r) {
      const int c = lane + 32 * r;
      v[r] = c < d ? to_float(row[c]) : 0.0f;
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int r = 0; r < kLaneCols; ++r) v[r] = 0.0f;
  }
  __device__ __forceinline__ float dot(const LaneRow& o) const {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < kLaneCols; ++r) s += v[r] * o.v[r];
    return warp_sum(s);
  }
  // this += a x.
  __device__ __forceinline__ void add(float a, const LaneRow& x) {
#pragma unroll
    for (int r = 0; r < kLaneCols; ++r) v[r] += a * x.v[r];
  }
  template <typename T>
  __device__ __forceinline__ void store(T* row, float factor, int d, int lane, uint32_t chunks) const {
#pragma unroll
    for (int r = 0; r < kLaneCols; ++r) {
      const int c = lane + 32 * r;
      if (c < d && ((chunks >> (c / 8)) & 1u)) row[c] = from_float<T>(v[r] * factor);
    }
  }
};

// Whether any of the d values of a row (those of `chunks`) is Inf or NaN
// (the whole warp answers).
// NOTES: unrolled over the lane's columns like LaneRow: a loop from `lane` on
// (a trip count per lane) before the vote made ptxas reshape the calling
// kernels' K/V loops (the sm80 backward's: 100 more instructions).
template <typename T>
__device__ __forceinline__ bool row_nonfinite(const T* row, int d, int lane, uint32_t chunks = kAllChunks) {
  bool bad = false;
#pragma unroll
  for (int r = 0; r < kLaneCols; ++r) {
    const int c = lane + 32 * r;
    if (c < d && ((chunks >> (c / 8)) & 1u)) bad |= !isfinite(to_float(row[c]));
  }
  return __any_sync(0xffffffffu, bad);
}

// One (sequence, query head)'s view of the call: its rows, its mask, its
// score modifiers and its dropout stream.
// Keys (TensorKeys, CacheKeys, PagedKeys) is a base: the empty TensorKeys
// then takes no bytes, and the plain kernels' fixes are as they were.
template <class Keys>
struct HeadViewOf : Keys {
  const AttentionParams& p;
  int b, h;
  SequenceInfo seq;
  MaskPolicy mask;
  ListedPairs pairs;  // the block mask's pairs (unread without one)

  __device__ __forceinline__ HeadViewOf(const AttentionParams& params, const ListedPairs& listed, int b_, int h_,
                                        Keys keys = {})
      : Keys(keys), p(params), b(b_), h(h_), seq(keys.sequence(params, b_)), mask(mask_for(params, seq)),
        pairs(listed) {}

  __device__ __forceinline__ bool visible(int i, int j) const {
    if (!mask.visible(i, j)) return false;
    if (!p.has_block_mask()) return true;
    return pairs.listed(p.block_mask, BlockTiles::list_row(p.block_mask, b, h), i, j);
  }
  // The modified score of (i, j) from q_i . k_j; *capped gets it before ALiBi
  // (softcap's derivative is a function of it).
  __device__ __forceinline__ float score(float dot, int i, int j, float* capped) const {
    float s = dot * p.scale;
    if (p.softcap > 0.0f) s = SoftcapScore{p.softcap}(s);
    *capped = s;
    return p.has_alibi() ? alibi_for(p, seq, b, h)(s, i, j) : s;
  }
  // dropout.h's factor(), read from the pair's fragment bits.
  // NOTES: factor() picks its byte with a runtime index into the Philox
  // output, a 16-byte local array: a stack frame in every kernel with a fix.
  __device__ __forceinline__ float dropout_factor(int i, int j) const {
    if (!p.has_dropout()) return 1.0f;
    const uint32_t bits =
        p.dropout.fragment(b * p.heads_q + h, i / dropout::kBlockRows, i % 8, j / dropout::kBlockKeys, (j % 8) / 2);
    const int bit = dropout::fragment_bit((i % dropout::kBlockRows) / 8, (j % dropout::kBlockKeys) / 8, j % 2);
    return (bits >> bit) & 1u ? p.dropout.scale : 0.0f;
  }
  // P = exp(s - lse); a score of -inf contributes nothing.
  __device__ __forceinline__ static float prob(float s, float lse) { return s == -INFINITY ? 0.0f : expf(s - lse); }
  // dS before the scale, from P, dP = dO . v, D and the score before ALiBi.
  __device__ __forceinline__ float ds(float pr, float dp, float row_d, float capped, int i, int j) const {
    const float g = pr * (dropout_factor(i, j) * dp - row_d);
    return p.softcap > 0.0f ? g * SoftcapScore{p.softcap}.grad(capped) : g;
  }

  __device__ __forceinline__ int64_t q_offset(int i, int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride) const {
    return row_offset(b, seq.row_q, i, h, batch_stride, row_stride, head_stride, p.is_varlen());
  }
  __device__ __forceinline__ int64_t k_offset(int j, int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride) const {
    return Keys::offset(p, seq, b, j, h / p.group_size(), batch_stride, row_stride, head_stride);
  }
  template <typename T>
  __device__ __forceinline__ const T* q_row(int i) const {
    return static_cast<const T*>(p.q) + q_offset(i, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  }
  template <typename T>
  __device__ __forceinline__ const T* do_row(int i) const {
    return static_cast<const T*>(p.dout) + q_offset(i, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  }
  template <typename T>
  __device__ __forceinline__ const T* k_row(int j) const {
    return static_cast<const T*>(p.k) + k_offset(j, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  }
  template <typename T>
  __device__ __forceinline__ const T* v_row(int j) const {
    return static_cast<const T*>(p.v) + k_offset(j, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  }
  __device__ __forceinline__ float lse(int i) const { return p.lse[lse_offset(p, b, seq.row_q, i, h)]; }
  // D of row i (the backward's pre-pass, [heads_q][total_q]).
  __device__ __forceinline__ float row_d(const float* d, int i) const {
    return d[static_cast<int64_t>(h) * p.total_q + seq.row_q + i];
  }
};

using HeadView = HeadViewOf<TensorKeys>;

// A row's softmax sums (sum_row below): its max score m, l and o.
struct RowSums {
  float m, l;
  LaneRow o;
  // O / l (0 for a row that saw no key: l == 0) and lse = m + log l (-inf then).
  __device__ __forceinline__ float inv() const { return l == 0.0f ? 0.0f : 1.0f / l; }
  __device__ __forceinline__ float lse() const { return l == 0.0f ? -INFINITY : m + logf(l); }
};

// One row's softmax over keys [j_begin, j_end), those `keys` shows it:
//   m = max_j s_j,  l = sum_j P_j,  o = sum_j P_j z_j v_j,  P_j = exp(s_j - m)
// Keys: visible(j), score(dot, j) (the modified score of q . k_j), k_row(j) and
// v_row(j) (T*), factor(j) (dropout's z_j). Shared by every forward fix.
template <typename T, class Keys>
__device__ __forceinline__ void sum_row(const LaneRow& q, const Keys& keys, int j_begin, int j_end, int d, int lane,
                                        RowSums& r) {
  LaneRow kv;
  r.m = -INFINITY;
  for (int j = j_begin; j < j_end; ++j) {
    if (!keys.visible(j)) continue;
    kv.load(keys.template k_row<T>(j), d, lane);
    r.m = fmaxf(r.m, keys.score(q.dot(kv), j));  // fmaxf drops NaN: its P below is NaN
  }
  r.l = 0.0f;
  r.o.zero();
  for (int j = j_begin; j < j_end; ++j) {
    if (!keys.visible(j)) continue;
    kv.load(keys.template k_row<T>(j), d, lane);
    const float s = keys.score(q.dot(kv), j);
    const float pr = HeadView::prob(s, r.m);
    r.l += pr;
    kv.load(keys.template v_row<T>(j), d, lane);
    r.o.add(pr * keys.factor(j), kv);  // every visible key, even at weight 0 (0 x NaN = NaN)
  }
}

// sum_row's view of row i of a head.
template <class HV>
struct HeadRowKeys {
  const HV& hv;
  int i;
  __device__ __forceinline__ bool visible(int j) const { return hv.visible(i, j); }
  __device__ __forceinline__ float score(float dot, int j) const {
    float capped;
    return hv.score(dot, i, j, &capped);
  }
  template <typename T>
  __device__ __forceinline__ const T* k_row(int j) const {
    return hv.template k_row<T>(j);
  }
  template <typename T>
  __device__ __forceinline__ const T* v_row(int j) const {
    return hv.template v_row<T>(j);
  }
  __device__ __forceinline__ float factor(int j) const { return hv.dropout_factor(i, j); }
};

// A row's whole key set summed: the factor from o to the output and the lse,
// with query head h's sink joining (score_mod.h) when the call has sinks.
__device__ __forceinline__ void finish_row(const AttentionParams& p, int h, const RowSums& r, float& inv, float& lse) {
  inv = r.inv();
  lse = r.lse();
  if (p.has_sinks()) {
    const AttentionSink sink{p.sinks[h]};
    const float lse_keys = lse;
    lse = sink.lse(lse_keys);
    inv *= sink.output_factor(lse_keys, lse);
  }
}

// The end of forward row i of one head (head dim d) from its sums: the sink's
// share, then O and the lse out.
template <typename T, class HV>
__device__ __forceinline__ void store_out_row(const HV& hv, int i, int d, int lane, const RowSums& r) {
  const AttentionParams& p = hv.p;
  float inv, lse;
  finish_row(p, hv.h, r, inv, lse);
  r.o.store(static_cast<T*>(p.out) + hv.q_offset(i, p.o_batch_stride, p.o_row_stride, p.o_head_stride), inv, d, lane,
            kAllChunks);
  if (lane == 0 && p.lse != nullptr) p.lse[lse_offset(p, hv.b, hv.seq.row_q, i, hv.h)] = lse;
}

// Forward row i of one head: sum_row over its keys, then store_out_row.
template <typename T, class HV>
__device__ __forceinline__ void recompute_out_row(const HV& hv, int i, int lane) {
  const int d = hv.p.head_dim;
  LaneRow q;
  q.load(hv.template q_row<T>(i), d, lane);
  RowSums r;
  sum_row<T>(q, HeadRowKeys<HV>{hv, i}, hv.mask.key_begin(i), hv.mask.key_end(i + 1), d, lane, r);
  store_out_row<T>(hv, i, d, lane, r);
}

// dq row i of one head (its chunks in `chunks`).
template <typename T>
__device__ __forceinline__ void recompute_dq_row(const HeadView& hv, const float* row_d, int i, int lane,
                                                 uint32_t chunks) {
  const AttentionParams& p = hv.p;
  const int d = p.head_dim;
  LaneRow q, dout, k, v, dq;
  q.load(hv.q_row<T>(i), d, lane);
  dout.load(hv.do_row<T>(i), d, lane);
  dq.zero();
  const float lse = hv.lse(i), di = hv.row_d(row_d, i);
  // A row of only -inf scores (lse -inf, no sink) has zero gradients, as one
  // that sees no key.
  const int j_end = lse == -INFINITY ? 0 : hv.mask.key_end(i + 1);
  for (int j = hv.mask.key_begin(i); j < j_end; ++j) {
    if (!hv.visible(i, j)) continue;
    k.load(hv.k_row<T>(j), d, lane);
    v.load(hv.v_row<T>(j), d, lane);
    float capped;
    const float pr = HeadView::prob(hv.score(q.dot(k), i, j, &capped), lse);
    dq.add(hv.ds(pr, dout.dot(v), di, capped, i, j), k);
  }
  dq.store(static_cast<T*>(p.dq) + hv.q_offset(i, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride), p.scale, d,
           lane, chunks);
}

// dk and dv rows of key j of sequence b, KV head hk (their chunks in
// `chunks`): every query head of the group, every query row that sees the key.
template <typename T>
__device__ __forceinline__ void recompute_dkdv_row(const AttentionParams& p, const ListedPairs& pairs,
                                                   const float* row_d, int b, int hk, int j, int lane,
                                                   uint32_t chunks) {
  const int d = p.head_dim, group = p.group_size();
  LaneRow k, v, q, dout, dk, dv;
  const HeadView first(p, pairs, b, hk * group);
  k.load(first.k_row<T>(j), d, lane);
  v.load(first.v_row<T>(j), d, lane);
  dk.zero();
  dv.zero();
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadView hv(p, pairs, b, h);
    const int i_end = hv.mask.query_end(j + 1);
    for (int i = hv.mask.query_begin(j); i < i_end; ++i) {
      const float lse = hv.lse(i);
      if (!hv.visible(i, j) || lse == -INFINITY) continue;  // -inf: zero gradients (recompute_dq_row)
      q.load(hv.q_row<T>(i), d, lane);
      dout.load(hv.do_row<T>(i), d, lane);
      float capped;
      const float pr = HeadView::prob(hv.score(q.dot(k), i, j, &capped), lse);
      dv.add(pr * hv.dropout_factor(i, j), dout);
      dk.add(hv.ds(pr, dout.dot(v), hv.row_d(row_d, i), capped, i, j), q);
    }
  }
  dk.store(static_cast<T*>(p.dk) + first.k_offset(j, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride), p.scale, d,
           lane, chunks);
  dv.store(static_cast<T*>(p.dv) + first.k_offset(j, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride), 1.0f, d,
           lane, chunks);
}

}  // namespace detail

// ---- The fixes the epilogues call (all lanes of each calling warp). ----
// pairs: the launch's block mask (pairs_of; by value into the out-of-line
// ones: a reference made the callers copy it to a stack frame); NoBlockMask
// overloads for the kernels without one take no such argument (their call
// sites as before).

// Warp (after its stores are visible to it): out rows [row0, row0 + rows) of
// sequence b, head h, those stored non-finite; keys: where the sequence's keys
// live (TensorKeys, CacheKeys, PagedKeys).
template <typename T, class Keys = TensorKeys>
__device__ __forceinline__ void fix_out_rows(const AttentionParams& p, const ListedPairs& pairs, int b, int h, int row0,
                                             int rows, Keys keys = {}) {
  const detail::HeadViewOf<Keys> hv(p, pairs, b, h, keys);
  const int lane = threadIdx.x % 32;
  for (int i = row0; i < row0 + rows; ++i) {
    const T* o = static_cast<const T*>(p.out) + hv.q_offset(i, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
    if (detail::row_nonfinite(o, p.head_dim, lane)) detail::recompute_out_row<T>(hv, i, lane);
  }
}
template <typename T, class Keys = TensorKeys>
__device__ __forceinline__ void fix_out_rows(const AttentionParams& p, NoBlockMask, int b, int h, int row0, int rows,
                                             Keys keys = {}) {
  fix_out_rows<T>(p, ListedPairs{}, b, h, row0, rows, keys);
}

// CTA (after a barrier that follows its stores): out rows [m0, m0 + rows) of
// sequence b, head h, those stored non-finite.
template <typename T>
__device__ __forceinline__ void fix_out_tile(const AttentionParams& p, const ListedPairs& pairs, int b, int h, int m0,
                                             int rows) {
  const detail::HeadView hv(p, pairs, b, h);
  const int lane = threadIdx.x % 32;
  for (int i = m0 + static_cast<int>(threadIdx.x / 32); i < m0 + rows; i += blockDim.x / 32) {
    const T* o = static_cast<const T*>(p.out) + hv.q_offset(i, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
    if (detail::row_nonfinite(o, p.head_dim, lane)) detail::recompute_out_row<T>(hv, i, lane);
  }
}
template <typename T>
__device__ __forceinline__ void fix_out_tile(const AttentionParams& p, NoBlockMask, int b, int h, int m0, int rows) {
  fix_out_tile<T>(p, ListedPairs{}, b, h, m0, rows);
}

namespace detail {

// dk / dv rows of keys k0 + first, k0 + first + step, ... below k0 + rows of
// sequence b, KV head hk, those whose columns in `chunks` were stored
// non-finite, recomputed there.
template <typename T>
__device__ __forceinline__ void fix_dkdv_keys(const AttentionParams& p, const ListedPairs& pairs, const float* row_d,
                                              int b, int hk, int k0, int rows, int first, int step, uint32_t chunks) {
  const HeadView kv(p, pairs, b, hk * p.group_size());
  const int lane = threadIdx.x % 32;
  for (int j = k0 + first; j < k0 + rows; j += step) {
    const T* dk = static_cast<const T*>(p.dk) + kv.k_offset(j, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    const T* dv = static_cast<const T*>(p.dv) + kv.k_offset(j, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
    if (row_nonfinite(dk, p.head_dim, lane, chunks) || row_nonfinite(dv, p.head_dim, lane, chunks))
      recompute_dkdv_row<T>(p, pairs, row_d, b, hk, j, lane, chunks);
  }
}

}  // namespace detail

// CTA (after a barrier that follows its stores): dk / dv rows of keys
// [k0, k0 + rows) of sequence b, KV head hk, those stored non-finite.
template <typename T>
__device__ __noinline__ void fix_dkdv_tile(const AttentionParams& p, const ListedPairs pairs, const float* row_d,
                                           int b, int hk, int k0, int rows) {
  detail::fix_dkdv_keys<T>(p, pairs, row_d, b, hk, k0, rows, threadIdx.x / 32, blockDim.x / 32, kAllChunks);
}
template <typename T>
__device__ __noinline__ void fix_dkdv_tile(const AttentionParams& p, NoBlockMask, const float* row_d, int b, int hk,
                                           int k0, int rows) {
  detail::fix_dkdv_keys<T>(p, ListedPairs{}, row_d, b, hk, k0, rows, threadIdx.x / 32, blockDim.x / 32, kAllChunks);
}

// Warp (after its stores are visible to it): dk / dv rows of keys
// [key0, key0 + keys) of sequence b, KV head hk, those whose columns in
// `chunks` were stored non-finite, recomputed there.
template <typename T>
__device__ __noinline__ void fix_dkdv_rows(const AttentionParams& p, const ListedPairs pairs, const float* row_d,
                                           int b, int hk, int key0, int keys, uint32_t chunks) {
  detail::fix_dkdv_keys<T>(p, pairs, row_d, b, hk, key0, keys, 0, 1, chunks);
}
template <typename T>
__device__ __noinline__ void fix_dkdv_rows(const AttentionParams& p, NoBlockMask, const float* row_d, int b, int hk,
                                           int key0, int keys, uint32_t chunks) {
  detail::fix_dkdv_keys<T>(p, ListedPairs{}, row_d, b, hk, key0, keys, 0, 1, chunks);
}

// Warp: the dq row of (flattened row `row`, head h) of sequence b, row i in
// it, the columns of `chunks`.
template <typename T>
__device__ __forceinline__ void fix_dq_row(const AttentionParams& p, const ListedPairs& pairs, const float* row_d,
                                           int b, int h, int i, uint32_t chunks) {
  const detail::HeadView hv(p, pairs, b, h);
  detail::recompute_dq_row<T>(hv, row_d, i, threadIdx.x % 32, chunks);
}

}  // namespace flashattn::cuda::nonfinite
