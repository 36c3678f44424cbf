// The Hopper backward's consumers: warpgroups 1 and 2, 64 keys each (split-d:
// the same 64 keys, the work split along queries and d), with keys as wgmma's
// M dimension. Per query tile:
//   S^T  = K Q^T,  dP^T = V dO^T                  (wgmma, both from smem)
//   P^T  = exp2(S^T * scale log2 e - lse log2 e)   (0 where masked)
//   dS^T = P^T * (dP^T - D)
//   dV  += P^T dO,  dK += dS^T Q                  (wgmma, A from registers)
//   dS^T -> shared memory; dQ_partial = dS K       (wgmma) -> dq_write.cuh
// dK and dV stay in registers for the whole walk (epilogue: store_dk_dv).
#pragma once

#include "attention/mask.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/bwd/dq_write.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/smem.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

template <class K, typename T>
struct BwdConsumer {
  static constexpr int D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN, kSN = K::kSN;
  using Acc = float[kSN / 2];           // S^T or dP^T: 64 keys x kSN queries
  using Frags = uint32_t[kSN / 16][4];  // P^T or dS^T as 16-bit wgmma A fragments

  const AttentionParams& p;
  const bwd::Workspace& ws;
  const MaskPolicy& mask;
  const KeyTileWork& w;
  const SequenceInfo& seq;
  const BwdSmem<K>& sm;
  const int n_tile, hk, b, group, cw, warp, lane, quad;
  const int key_off;  // this consumer's first key of the tile
  const int q_col;    // this consumer's first query of S^T
  const int key_r;    // this thread's keys (accumulator rows): key_r and key_r + 8 of the tile
  const uint32_t ds_base, p_base, lse_base, d_base;
  const float scale_log2;
  // Operand descriptors: one per buffer and role, built once, then moved by
  // byte offsets (desc_advance: one add per wgmma operand).
  uint64_t k_rows, v_rows;  // S^T / dP^T: A = this warpgroup's 64 keys of K / V (K-major over d)
  uint64_t q_rows, do_rows;  // B = this consumer's queries of the Q / dO tile as N (K-major over d)
  uint64_t q_mn, do_mn;     // dV / dK: B = dO / Q, queries as K, d as N (MN-major)
  uint64_t ds_mn, k_mn;     // dQ: A = dS (queries as M, keys as K), B = K (keys as K, d as N)
  uint64_t p_t_rows, ds_t_rows;  // split-d dV / dK: A = P^T / dS^T (keys as M, K-major)
  float dk[K::kDvN / 2], dv[K::kDvN / 2];

  __device__ __forceinline__ BwdConsumer(const AttentionParams& p_, const bwd::Workspace& ws_, const MaskPolicy& mask_,
                                         const KeyTileWork& w_, const SequenceInfo& seq_, const BwdSmem<K>& sm_, int n_tile_,
                                         int hk_, int b_, int group_, int cw_, int tid)
      : p(p_), ws(ws_), mask(mask_), w(w_), seq(seq_), sm(sm_), n_tile(n_tile_), hk(hk_), b(b_),
        group(group_), cw(cw_),
        warp(tid / 32), lane(tid % 32), quad(lane % 4), key_off(K::kSplitD ? 0 : cw_ * 64),
        q_col(K::kSplitD ? cw_ * K::kSN : 0), key_r(key_off + warp * 16 + lane / 4),
        ds_base(smem_addr(sm_.base + K::kDsOff)), p_base(smem_addr(sm_.base + K::kPOff)),
        lse_base(smem_addr(sm_.lse)), d_base(smem_addr(sm_.d)), scale_log2(ws_.scale_log2) {
    const uint32_t k_base = smem_addr(sm.base + K::kKOff);
    const uint32_t v_base = smem_addr(sm.base + K::kVOff);
    const uint32_t q_base = smem_addr(sm.base + K::kQOff);
    const uint32_t do_base = smem_addr(sm.base + K::kDoOff);
    k_rows = make_smem_desc_sw128(k_base + key_off * 128, 16, 1024);
    v_rows = make_smem_desc_sw128(v_base + key_off * 128, 16, 1024);
    q_rows = make_smem_desc_sw128(q_base + q_col * 128, 16, 1024);
    do_rows = make_smem_desc_sw128(do_base + q_col * 128, 16, 1024);
    const uint32_t dv_col_off = K::kSplitD ? cw * (K::kDvN / 64) * kBlockM * 128 : 0;
    q_mn = make_smem_desc_sw128(q_base + dv_col_off, kBlockM * 128, 1024);
    do_mn = make_smem_desc_sw128(do_base + dv_col_off, kBlockM * 128, 1024);
    const uint32_t dq_a_off = K::kDqSplitM ? cw * kBlockN * 128 : 0;
    const uint32_t dq_b_off = K::kDqSplitM ? 0 : cw * (K::kDqN / 64) * kBlockN * 128;
    ds_mn = make_smem_desc_sw128(ds_base + dq_a_off, kBlockN * 128, 1024);
    k_mn = make_smem_desc_sw128(k_base + dq_b_off, kBlockN * 128, 1024);
    p_t_rows = make_smem_desc_sw128(p_base, 16, 1024);
    ds_t_rows = make_smem_desc_sw128(ds_base, 16, 1024);
#pragma unroll
    for (int i = 0; i < K::kDvN / 2; ++i) dk[i] = dv[i] = 0.0f;
  }

  // The key tile's first key (recomputed where needed rather than held in a
  // register across the walk: the d 64 kernel sits at its 168-register cap).
  __device__ __forceinline__ int k0() const { return n_tile * kBlockN; }

  __device__ __forceinline__ uint64_t desc_kv_rows(uint64_t rows, int kk) const {
    return desc_advance(rows, (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t desc_qdo_rows(uint64_t rows, int s, int kk) const {
    return desc_advance(desc_advance(rows, s * K::kQBytes), (kk / 4) * kBlockM * 128 + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t desc_qdo_mn(uint64_t mn, int s, int kt) const {
    return desc_advance(desc_advance(mn, s * K::kQBytes), kt * 16 * 128);
  }
  __device__ __forceinline__ uint64_t desc_ds(int buf, int kt) const {
    return desc_advance(desc_advance(ds_mn, buf * K::kDsBytes), kt * 16 * 128);
  }
  __device__ __forceinline__ uint64_t desc_k_mn(int kt) const { return desc_advance(k_mn, kt * 16 * 128); }
  __device__ __forceinline__ uint64_t desc_t_rows(uint64_t rows, int buf, int kt) const {
    return desc_advance(desc_advance(rows, buf * K::kDsBytes), kt * 32);
  }

  // S^T = K Q^T and dP^T = V dO^T, two commit groups so that P can be
  // computed while dP^T is still running.
  __device__ __forceinline__ void issue_st_dpt(int s, Acc& st, Acc& dpt) const {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaSS<kSN, T>::run(st, desc_kv_rows(k_rows, kk), desc_qdo_rows(q_rows, s, kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaSS<kSN, T>::run(dpt, desc_kv_rows(v_rows, kk), desc_qdo_rows(do_rows, s, kk), kk > 0);
    wgmma_commit();
  }

  // 16-bit A fragments: two accumulator n8 tiles make one k16 fragment.
  __device__ __forceinline__ static void to_frags(const Acc& acc, Frags& f) {
#pragma unroll
    for (int kt = 0; kt < kSN / 16; ++kt)
#pragma unroll
      for (int j = 0; j < 4; ++j) f[kt][j] = pack2<T>(acc[8 * kt + 2 * j], acc[8 * kt + 2 * j + 1]);
  }
  // dV += P^T dO and dK += dS^T Q (issue only; the fragments stay untouched).
  __device__ __forceinline__ void issue_dv(int s, Frags& pa) {
    fence_operands(dv);
    fence_operands(pa);
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dv, pa[kt], desc_qdo_mn(do_mn, s, kt), 1);
    wgmma_commit();
  }
  __device__ __forceinline__ void issue_dk(int s, Frags& da) {
    fence_operands(dk);
    fence_operands(da);
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dk, da[kt], desc_qdo_mn(q_mn, s, kt), 1);
    wgmma_commit();
  }

  // P^T = exp2(S^T scale log2 e - lse log2 e) in place. Element e of
  // accumulator tile i: key key_r + 8*(e>>1), query q0 + q_col + 8i + 2*quad +
  // (e&1); P = 0 where masked.
  // NOTES (mask): a separate pass with two bounds per key row, not visible()
  // per element inside the exp loop: that made the d 64 kernel's loop body
  // large enough to stall on instruction fetch (ncu: no_instruction was the
  // top stall reason). Key j sees queries [query_begin(j), query_end(j + 1))
  // of the sequence (none if j is past it): query column c of the tile is
  // visible iff c - lo_r (unsigned) < n_r.
  // row_off: byte offset of this thread's first query column in the stage's
  // lse / D rows.
  __device__ __forceinline__ void probabilities(Acc& st, uint32_t row_off, int q0, bool full_tile) const {
#pragma unroll
    for (int i = 0; i < kSN / 8; ++i) {
      const float2 lse2 = ld_shared_v2(lse_base + row_off + 32u * i);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[4 * i + e] = fast_exp2(fmaf(st[4 * i + e], scale_log2, -((e & 1) ? lse2.y : lse2.x)));
    }
    if (full_tile) return;
    int rel_lo[2], count[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kj = k0() + key_r + 8 * r;
      const int lo = mask.query_begin(kj);
      const int hi = kj < seq.seqlen_k ? min(mask.query_end(kj + 1), seq.seqlen_q) : lo;
      rel_lo[r] = lo - q0 - q_col - 2 * quad;
      count[r] = max(hi - lo, 0);
    }
#pragma unroll
    for (int i = 0; i < kSN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const bool vis = static_cast<unsigned>(8 * i + (e & 1) - rel_lo[r]) < static_cast<unsigned>(count[r]);
        st[4 * i + e] = vis ? st[4 * i + e] : 0.0f;
      }
  }

  // dS^T = P^T * (dP^T - D) into dpt.
  __device__ __forceinline__ void ds_from_dp(const Acc& st, Acc& dpt, uint32_t row_off) const {
#pragma unroll
    for (int i = 0; i < kSN / 8; ++i) {
      const float2 dd = ld_shared_v2(d_base + row_off + 32u * i);
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - ((e & 1) ? dd.y : dd.x));
    }
  }

  // dS^T (or P^T) -> shared memory [key][query], 128B-swizzled (chunk ^= row %
  // 8): fragment f[kt][j] is accumulator tile i = 2kt + (j >> 1), key row
  // key_r + 8 * (j & 1), queries q_col + 8i + 2*quad, +1.
  __device__ __forceinline__ void store_t(uint32_t base, int buf, const Frags& f) const {
    const uint32_t rowb = base + buf * K::kDsBytes + key_r * 128 + quad * 4;
    const uint32_t swz = opaque(lane / 4);  // row % 8 of both rows stored
#pragma unroll
    for (int kt = 0; kt < kSN / 16; ++kt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = q_col / 8 + 2 * kt + (j >> 1);
        st_shared_b32(rowb + (i / 8) * (kBlockN * 128) + (j & 1) * 1024 + ((i % 8) ^ swz) * 16, f[kt][j]);
      }
    }
  }

  // Q, dO, lse, D of stage s are no longer read (split-d: once dV, dK are done).
  __device__ __forceinline__ void release_stage(int s) {
    fence_operands(dv);
    fence_operands(dk);
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[s]);
  }

  // One query tile of the walk (iteration it).
  __device__ __forceinline__ void query_tile(int it) {
    const int s = it % K::kStages;
    const uint32_t ph = (it / K::kStages) & 1;
    const int buf = it & 1;
    const int h = hk * group + it / w.n_m;
    const int q0 = w.query_tile(it) * kBlockM;
    mbar_wait(&sm.full[s], ph);

    float st[kSN / 2], dpt[kSN / 2];
    issue_st_dpt(s, st, dpt);
    const bool full_tile = mask.tile_fully_visible(q0, q0 + kBlockM, k0(), k0() + kBlockN);
    const uint32_t row_off = 4u * (s * kBlockM + q_col + 2 * quad);
    uint32_t pa[kSN / 16][4], da[kSN / 16][4];
    // P^T while dP^T runs; with kEarlyDv, dV's wgmmas then run while dS^T is computed.
    if constexpr (K::Tune::kOverlapP) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    fence_operands(st);
    probabilities(st, row_off, q0, full_tile);
    if constexpr (K::kSplitD) {
      to_frags(st, pa);
      store_t(p_base, buf, pa);
      wgmma_wait<0>();
    } else if constexpr (K::Tune::kEarlyDv) {
      to_frags(st, pa);
      issue_dv(s, pa);
      wgmma_wait<1>();  // dP^T done (dV may still run)
    } else {
      wgmma_wait<0>();
    }
    fence_operands(dpt);
    ds_from_dp(st, dpt, row_off);
    if constexpr (K::kSplitD) {
      to_frags(dpt, da);
    } else if constexpr (K::Tune::kEarlyDv) {
      to_frags(dpt, da);
      issue_dk(s, da);
    } else {
      // One group for both (two groups made ptxas serialize the wgmmas at d 64).
      to_frags(st, pa);
      to_frags(dpt, da);
      fence_operands(dv);
      fence_operands(dk);
      fence_operands(pa);
      fence_operands(da);
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dv, pa[kt], desc_qdo_mn(do_mn, s, kt), 1);
#pragma unroll
      for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dk, da[kt], desc_qdo_mn(q_mn, s, kt), 1);
      wgmma_commit();
    }

    store_t(ds_base, buf, da);
    fence_proxy_async_smem();
    named_sync(K::kDsBarrier, 128 * K::kConsumers);

    // dQ partial = dS K (this warpgroup's half); split-d: dV += P^T dO and
    // dK += dS^T Q behind it, in their own group.
    float dq[K::kDqN / 2];
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < kBlockN / 16; ++kt) WgmmaSSTT<K::kDqN, T>::run(dq, desc_ds(buf, kt), desc_k_mn(kt), kt > 0);
    wgmma_commit();
    if constexpr (K::kSplitD) {
#pragma unroll
      for (int kt = 0; kt < kBlockM / 16; ++kt)
        WgmmaSST<K::kDvN, T>::run(dv, desc_t_rows(p_t_rows, buf, kt), desc_qdo_mn(do_mn, s, kt), 1);
#pragma unroll
      for (int kt = 0; kt < kBlockM / 16; ++kt)
        WgmmaSST<K::kDvN, T>::run(dk, desc_t_rows(ds_t_rows, buf, kt), desc_qdo_mn(q_mn, s, kt), 1);
      wgmma_commit();
      wgmma_wait<1>();  // dQ done; dV, dK run on under its write-out
    } else {
      wgmma_wait<0>();
    }
    fence_operands(dq);
    fence_operands(pa);
    fence_operands(da);
    if constexpr (!K::kSplitD) release_stage(s);
    const DqWrite<K> dq_write{p, ws, mask, seq, sm.base, p_base, ds_base, n_tile, b, cw, 32 * warp + lane, warp, lane,
                              quad};
    dq_write(it, buf, h, q0, dq);
    if constexpr (K::kSplitD) {
      wgmma_wait<0>();
      release_stage(s);
    }
  }

  // dK (scaled by the softmax scale) and dV: rows of this sequence's keys only.
  __device__ __forceinline__ void store_dk_dv() const {
    const bool varlen = p.is_varlen();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k0() + key_r + 8 * r;
      if (key >= seq.seqlen_k) continue;
      T* dkrow = static_cast<T*>(p.dk) +
                 row_offset(b, seq.row_k, key, hk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, varlen);
      T* dvrow = static_cast<T*>(p.dv) +
                 row_offset(b, seq.row_k, key, hk, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, varlen);
#pragma unroll
      for (int i = 0; i < K::kDvN / 8; ++i) {
        const int c = (K::kSplitD ? cw * K::kDvN : 0) + 8 * i + 2 * quad;
        *reinterpret_cast<uint32_t*>(dkrow + c) = pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dvrow + c) = pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
      }
    }
  }

  __device__ __forceinline__ void run() {
    if (w.iters > 0) mbar_wait(sm.full_kv, 0);
    for (int it = 0; it < w.iters; ++it) query_tile(it);
    store_dk_dv();
  }
};

}  // namespace flashattn::cuda::sm90
