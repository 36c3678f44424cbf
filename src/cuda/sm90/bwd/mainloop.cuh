// The Hopper backward's consumers (mainloop).
#pragma once

#include "attention/mask.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/bwd/dq.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/softmax.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// A consumer warpgroup's walk: dK, dV accumulate over every query tile, then
// the epilogue writes them.
template <class K, typename T>
__device__ __forceinline__ void consume(const AttentionParams& p, const bwd::Workspace& ws, const BwdCta& cta,
                                        const BwdSmem<K>& sm, int cw) {
  constexpr int D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  uint8_t* const smem = smem_raw + smem_align_pad();
  // ------------------------------------------------------------ consumers
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int quad = lane % 4;

  const uint32_t k_base = smem_addr(smem + K::kKOff);
  const uint32_t v_base = smem_addr(smem + K::kVOff);
  const uint32_t q_base = smem_addr(smem + K::kQOff);
  const uint32_t do_base = smem_addr(smem + K::kDoOff);
  const uint32_t ds_base = smem_addr(smem + K::kDsOff);
  const uint32_t p_base = smem_addr(smem + K::kPOff);
  const int key_off = K::kSplitD ? 0 : cw * 64;  // this consumer's first key of the tile
  const int q_col = K::kSplitD ? cw * K::kSN : 0;  // this consumer's first query of S^T
  const uint32_t lse_base = smem_addr(sm.lse), d_base = smem_addr(sm.d);
  // Operand descriptors: one per buffer and role, built once, then moved by
  // byte offsets (desc_advance: one add per wgmma operand instead of
  // rebuilding it from the address; see the forward kernel's NOTES).
  // S^T / dP^T: A = this warpgroup's 64 keys of K / V (K-major over d).
  const uint64_t k_rows = make_smem_desc_sw128(k_base + key_off * 128, 16, 1024);
  const uint64_t v_rows = make_smem_desc_sw128(v_base + key_off * 128, 16, 1024);
  auto desc_kv_rows = [&](uint64_t rows, int kk) {
    return desc_advance(rows, (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
  };
  // B = this consumer's queries of the Q / dO tile as N (K-major over d).
  const uint64_t q_rows = make_smem_desc_sw128(q_base + q_col * 128, 16, 1024);
  const uint64_t do_rows = make_smem_desc_sw128(do_base + q_col * 128, 16, 1024);
  auto desc_qdo_rows = [&](uint64_t rows, int s, int kk) {
    return desc_advance(desc_advance(rows, s * K::kQBytes), (kk / 4) * kBlockM * 128 + (kk % 4) * 32);
  };
  // dV / dK: B = dO / Q with queries as K, d as N (MN-major; this
  // consumer's kDvN columns), k-step kt.
  const uint32_t dv_col_off = K::kSplitD ? cw * (K::kDvN / 64) * kBlockM * 128 : 0;
  const uint64_t q_mn = make_smem_desc_sw128(q_base + dv_col_off, kBlockM * 128, 1024);
  const uint64_t do_mn = make_smem_desc_sw128(do_base + dv_col_off, kBlockM * 128, 1024);
  auto desc_qdo_mn = [&](uint64_t mn, int s, int kt) {
    return desc_advance(desc_advance(mn, s * K::kQBytes), kt * 16 * 128);
  };
  // dQ: A = dS (queries as M, keys as K; stored [key][query]), B = K (keys
  // as K, d as N; stored [key][d]): both MN-major, k-step kt of 16 keys.
  const uint32_t dq_a_off = K::kDqSplitM ? cw * kBlockN * 128 : 0;
  const uint32_t dq_b_off = K::kDqSplitM ? 0 : cw * (K::kDqN / 64) * kBlockN * 128;
  const uint64_t ds_mn = make_smem_desc_sw128(ds_base + dq_a_off, kBlockN * 128, 1024);
  const uint64_t k_mn = make_smem_desc_sw128(k_base + dq_b_off, kBlockN * 128, 1024);
  auto desc_ds = [&](int buf, int kt) {
    return desc_advance(desc_advance(ds_mn, buf * K::kDsBytes), kt * 16 * 128);
  };
  auto desc_k_mn = [&](int kt) { return desc_advance(k_mn, kt * 16 * 128); };
  // Split-d dV / dK: A = P^T / dS^T (keys as M, queries as K; K-major), k-step kt.
  const uint64_t p_t_rows = make_smem_desc_sw128(p_base, 16, 1024);
  const uint64_t ds_t_rows = make_smem_desc_sw128(ds_base, 16, 1024);
  auto desc_t_rows = [&](uint64_t rows, int buf, int kt) {
    return desc_advance(desc_advance(rows, buf * K::kDsBytes), kt * 32);
  };

  const float scale_log2 = ws.scale_log2;
  // This thread's keys (accumulator rows): key_r and key_r + 8 of the tile.
  const int key_r = key_off + warp * 16 + lane / 4;
  const ConsumerThread th{cw, tid, warp, lane, quad, key_off, q_col, key_r};

  float dk[K::kDvN / 2], dv[K::kDvN / 2];
#pragma unroll
  for (int i = 0; i < K::kDvN / 2; ++i) dk[i] = dv[i] = 0.0f;

  if (cta.w.iters > 0) mbar_wait(sm.full_kv, 0);
  for (int it = 0; it < cta.w.iters; ++it) {
    const int s = it % kStages;
    const uint32_t ph = (it / kStages) & 1;
    const int buf = it & 1;
    const int h = cta.head(it);
    const int q0 = cta.w.query_tile(it) * kBlockM;
    mbar_wait(&sm.full[s], ph);

    // S^T = K Q^T and dP^T = V dO^T (64 keys x kSN queries each), two
    // commit groups so that P can be computed while dP^T is still running.
    constexpr int kSN = K::kSN;
    float st[kSN / 2], dpt[kSN / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaSS<kSN, T>::run(st, desc_kv_rows(k_rows, kk), desc_qdo_rows(q_rows, s, kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaSS<kSN, T>::run(dpt, desc_kv_rows(v_rows, kk), desc_qdo_rows(do_rows, s, kk), kk > 0);
    wgmma_commit();

    // Element e of accumulator tile i: key key_r + 8*(e>>1), query
    // q0 + q_col + 8i + 2*quad + (e&1). P = 0 where masked (see NOTES).
    const bool full_tile = cta.mask.tile_fully_visible(q0, q0 + kBlockM, cta.w.k0, cta.w.k0 + kBlockN);
    const uint32_t row_off = 4u * (s * kBlockM + q_col + 2 * quad);
    uint32_t pa[kSN / 16][4], da[kSN / 16][4];
    // dV += P^T dO and dK += dS^T Q (issue only; the fragments stay untouched).
    auto issue_dv = [&]() {
      fence_operands(dv);
      fence_operands(pa);
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dv, pa[kt], desc_qdo_mn(do_mn, s, kt), 1);
      wgmma_commit();
    };
    auto issue_dk = [&]() {
      fence_operands(dk);
      fence_operands(da);
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dk, da[kt], desc_qdo_mn(q_mn, s, kt), 1);
      wgmma_commit();
    };

    // P^T (st) while dP^T runs; with kEarlyDv, dV's wgmmas then run while
    // dS^T is computed.
    if constexpr (K::Tune::kOverlapP) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    exp_scores<K>(st, lse_base + row_off, scale_log2);
    if (!full_tile) {
      int rel_lo[2], count[2];
      visible_spans(rel_lo, count, cta, th, q0);
      zero_invisible<K>(st, rel_lo, count);
    }
    if constexpr (K::kSplitD) {
      to_frags<K, T>(st, pa);
      store_transposed<K>(p_base, buf, pa, th);
      wgmma_wait<0>();
    } else if constexpr (K::Tune::kEarlyDv) {
      to_frags<K, T>(st, pa);
      issue_dv();
      wgmma_wait<1>();  // dP^T done (dV may still run)
    } else {
      wgmma_wait<0>();
    }
    ds_scores<K>(dpt, st, d_base + row_off);
    if constexpr (K::kSplitD) {
      to_frags<K, T>(dpt, da);
    } else if constexpr (K::Tune::kEarlyDv) {
      to_frags<K, T>(dpt, da);
      issue_dk();
    } else {
      // One group for both (two groups made ptxas serialize the wgmmas at d 64).
      to_frags<K, T>(st, pa);
      to_frags<K, T>(dpt, da);
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

    store_transposed<K>(ds_base, buf, da, th);
    fence_proxy_async_smem();
    named_sync(K::kDsBarrier, 128 * K::kConsumers);

    // dQ partial = dS K (this warpgroup's half), then into the accumulator;
    // split-d: dV += P^T dO and dK += dS^T Q behind it, in their own group.
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
    // Q, dO, lse, D of stage s are no longer read (split-d: once dV, dK are done).
    auto release_stage = [&]() {
      fence_operands(dv);
      fence_operands(dk);
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.empty[s]);
    };
    if constexpr (!K::kSplitD) release_stage();

    write_dq<K>(dq, p, ws, cta, th, p_base, ds_base, it, buf, h, q0);
    if constexpr (K::kSplitD) {
      wgmma_wait<0>();
      release_stage();
    }
  }

  store_dk_dv<K, T>(dk, dv, p, cta, th);
}

}  // namespace flashattn::cuda::sm90
