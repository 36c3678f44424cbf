// The Hopper backward's consumers (warpgroups 1 and 2): 64 keys each (split-d,
// d 256: the same 64 keys, the queries of S^T and the columns of dK, dV, dQ
// split between them), keys as wgmma's M dimension. Per query tile of the walk:
//   S^T  = K Q^T                  wgmma, A = K (smem, K-major), B = Q (K-major)
//   dP^T = V dO^T                 wgmma, A = V, B = dO
//   P^T, dS^T                     softmax.cuh
//   dV  += P^T dO                 wgmma, A = P^T (registers), B = dO (MN-major)
//   dK  += dS^T Q                 wgmma, A = dS^T (registers), B = Q (MN-major)
//   dS^T -> shared memory ([key][query], 128B-swizzled), both warpgroups
//   dQ_partial = dS K             wgmma, A = dS (smem, MN-major), B = K (MN-major)
//   dQ_partial -> the f32 accumulator (dq.cuh)
// dK and dV stay in registers over the whole walk; epilogue.cuh writes them.
//
// NOTES:
// - kDqAlternate (d 64, d 128): query tile it's dQ (all 128 keys, every
//   column) is warpgroup (it & 1)'s alone. The other arrives at the tile's
//   dS^T barrier and goes on to tile it + 1's S^T and dP^T, which then run on
//   the tensor cores under the dQ product, its wait and its staging: with
//   both warpgroups computing half of every tile's dQ, they left the tensor
//   cores idle there together. One barrier id per tile parity: a warpgroup
//   that arrives at tile it's may reach tile it + 1's before the other has
//   left tile it's. The dS^T buffer a warpgroup writes at tile it + 2 was
//   read by tile it's dQ, which its owner waited for before arriving at tile
//   it + 1's barrier, and the writer passed that barrier (it waits there for
//   tile it + 1's dQ). Measured +4-10% at d 64, +2-3% at d 128 (means over
//   1k-16k; docs/performance.md 3.3). Issuing tile it + 1's S^T and dP^T
//   before tile it's dQ ends (the same overlap within one warpgroup) puts
//   wgmma accumulators in flight across the loop's back edge: ptxas spilled
//   500-1000 bytes and serialized every wgmma (C7515) in each form tried.
// - dS^T is double-buffered in shared memory: the one named barrier per query
//   tile (both warpgroups have written their half) also proves that both have
//   finished the dQ wgmma of the tile before, which read the other buffer.
// - The loop body stays in consume(): wrapped in a function (or a lambda) of
//   its own, the compiler rematerialized the descriptors' shared-memory base
//   inside the loop and the machine code changed. The steps it calls are
//   functions, each checked to leave the SASS identical; cut differently (the
//   mask bounds and zeroing in one function, or the whole P^T / dS^T block in
//   one), the PTX's registers came out in another order.
#pragma once

#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/mma.h"
#include "cuda/common/named_barrier.h"
#include "cuda/sm90/bwd/dq.cuh"
#include "cuda/sm90/bwd/dropout.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/softmax.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// A consumer's shared-memory operands, built once per kernel: the buffers'
// addresses and one wgmma descriptor per buffer and role, moved by byte
// offsets per k-step (desc_kv_rows, ...) instead of rebuilt from the address
// (see the forward kernel's NOTES).
struct ConsumerOperands {
  uint32_t ds_base, p_base, lse_base, d_base;
  uint64_t k_rows, v_rows, q_rows, do_rows, q_mn, do_mn, ds_mn, k_mn, p_t_rows, ds_t_rows;

  template <class K>
  __device__ __forceinline__ void build(const BwdSmem<K>& sm, const ConsumerThread& th) {
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN;
    uint8_t* const smem = smem_raw + smem_align_pad();
    const uint32_t k_base = smem_addr(smem + K::kKOff);
    const uint32_t v_base = smem_addr(smem + K::kVOff);
    const uint32_t q_base = smem_addr(smem + K::kQOff);
    const uint32_t do_base = smem_addr(smem + K::kDoOff);
    ds_base = smem_addr(smem + K::kDsOff);
    p_base = smem_addr(smem + K::kPOff);
    lse_base = smem_addr(sm.lse);
    d_base = smem_addr(sm.d);
    // S^T / dP^T: A = this warpgroup's 64 keys of K / V (K-major over d).
    k_rows = make_smem_desc_sw128(k_base + th.key_off * 128, 16, 1024);
    v_rows = make_smem_desc_sw128(v_base + th.key_off * 128, 16, 1024);
    // B = this consumer's queries of the Q / dO tile as N (K-major over d).
    q_rows = make_smem_desc_sw128(q_base + th.q_col * 128, 16, 1024);
    do_rows = make_smem_desc_sw128(do_base + th.q_col * 128, 16, 1024);
    // dV / dK: B = dO / Q with queries as K, d as N (MN-major; this
    // consumer's kDvN columns), k-step kt.
    const uint32_t dv_col_off = K::kSplitD ? th.cw * (K::kDvN / 64) * kBlockM * 128 : 0;
    q_mn = make_smem_desc_sw128(q_base + dv_col_off, kBlockM * 128, 1024);
    do_mn = make_smem_desc_sw128(do_base + dv_col_off, kBlockM * 128, 1024);
    // dQ: A = dS (queries as M, keys as K; stored [key][query]), B = K (keys
    // as K, d as N; stored [key][d]): both MN-major, k-step kt of 16 keys.
    const uint32_t dq_a_off = K::kDqSplitRows ? th.cw * kBlockN * 128 : 0;
    const uint32_t dq_b_off = K::kDqSplitCols ? th.cw * (K::kDqN / 64) * kBlockN * 128 : 0;
    ds_mn = make_smem_desc_sw128(ds_base + dq_a_off, kBlockN * 128, 1024);
    k_mn = make_smem_desc_sw128(k_base + dq_b_off, kBlockN * 128, 1024);
    // Split-d dV / dK: A = P^T / dS^T (keys as M, queries as K; K-major), k-step kt.
    p_t_rows = make_smem_desc_sw128(p_base, 16, 1024);
    ds_t_rows = make_smem_desc_sw128(ds_base, 16, 1024);
  }
};

// Operand descriptor steps (desc_advance: one add per wgmma operand instead of
// rebuilding the descriptor from the address; see the forward kernel's NOTES).
// K / V rows (K-major over d), k-step kk of 16 columns: 4 per 128-byte row,
// then the next 64-column block.
template <class K>
__device__ __forceinline__ uint64_t desc_kv_rows(uint64_t rows, int kk) {
  return desc_advance(rows, (kk / 4) * K::kBlockN * 128 + (kk % 4) * 32);
}
// Q / dO rows of stage s (K-major over d), k-step kk.
template <class K>
__device__ __forceinline__ uint64_t desc_qdo_rows(uint64_t rows, int s, int kk) {
  return desc_advance(desc_advance(rows, s * K::kQBytes), (kk / 4) * K::kBlockM * 128 + (kk % 4) * 32);
}
// Q / dO of stage s, MN-major, k-step kt of 16 queries.
template <class K>
__device__ __forceinline__ uint64_t desc_qdo_mn(uint64_t mn, int s, int kt) {
  return desc_advance(desc_advance(mn, s * K::kQBytes), kt * 16 * 128);
}
// dS of buffer buf, MN-major, k-step kt of 16 keys.
template <class K>
__device__ __forceinline__ uint64_t desc_ds(uint64_t ds_mn, int buf, int kt) {
  return desc_advance(desc_advance(ds_mn, buf * K::kDsBytes), kt * 16 * 128);
}
// K, MN-major, k-step kt of 16 keys.
__device__ __forceinline__ uint64_t desc_k_mn(uint64_t k_mn, int kt) { return desc_advance(k_mn, kt * 16 * 128); }
// Split-d P^T / dS^T of buffer buf (K-major over queries), k-step kt.
template <class K>
__device__ __forceinline__ uint64_t desc_t_rows(uint64_t rows, int buf, int kt) {
  return desc_advance(desc_advance(rows, buf * K::kDsBytes), kt * 32);
}

// S^T = K Q^T and dP^T = V dO^T of stage s (64 keys x kSN queries each), two
// commit groups so that P can be computed while dP^T is still running.
template <class K, typename T>
__device__ __forceinline__ void issue_s_dp(float (&st)[K::kSN / 2], float (&dpt)[K::kSN / 2], uint64_t k_rows,
                                           uint64_t v_rows, uint64_t q_rows, uint64_t do_rows, int s) {
  constexpr int kSN = K::kSN;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K::kHeadDim / 16; ++kk)
    WgmmaSS<kSN, T>::run(st, desc_kv_rows<K>(k_rows, kk), desc_qdo_rows<K>(q_rows, s, kk), kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < K::kHeadDim / 16; ++kk)
    WgmmaSS<kSN, T>::run(dpt, desc_kv_rows<K>(v_rows, kk), desc_qdo_rows<K>(do_rows, s, kk), kk > 0);
  wgmma_commit();
}

// acc += F B, A fragments f from registers, B = dO or Q of stage s (MN-major
// descriptor mn): dV += P^T dO, dK += dS^T Q (issue only; the fragments stay
// untouched).
template <class K, typename T>
__device__ __forceinline__ void issue_update(float (&acc)[K::kDvN / 2], uint32_t (&f)[K::kSN / 16][4], uint64_t mn,
                                             int s) {
  fence_operands(acc);
  fence_operands(f);
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < K::kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(acc, f[kt], desc_qdo_mn<K>(mn, s, kt), 1);
  wgmma_commit();
}

// dV += P^T dO and dK += dS^T Q in one commit group (two groups made ptxas
// serialize the wgmmas at d 64).
template <class K, typename T>
__device__ __forceinline__ void issue_updates_together(float (&dv)[K::kDvN / 2], float (&dk)[K::kDvN / 2],
                                                       uint32_t (&pa)[K::kSN / 16][4], uint32_t (&da)[K::kSN / 16][4],
                                                       uint64_t do_mn, uint64_t q_mn, int s) {
  fence_operands(dv);
  fence_operands(dk);
  fence_operands(pa);
  fence_operands(da);
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < K::kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dv, pa[kt], desc_qdo_mn<K>(do_mn, s, kt), 1);
#pragma unroll
  for (int kt = 0; kt < K::kSN / 16; ++kt) WgmmaRS<K::kDvN, T>::run(dk, da[kt], desc_qdo_mn<K>(q_mn, s, kt), 1);
  wgmma_commit();
}

// dQ partial = dS K (this warpgroup's share of the tile: half of it, or with
// kDqAlternate the whole of it, part r the queries 64 r .. 64 r + 63; dS^T of
// buffer buf), its own group.
template <class K, typename T>
__device__ __forceinline__ void issue_dq(float (&dq)[K::kDqParts][K::kDqN / 2], uint64_t ds_mn, uint64_t k_mn,
                                         int buf) {
  wgmma_fence();
#pragma unroll
  for (int r = 0; r < K::kDqParts; ++r)
#pragma unroll
    for (int kt = 0; kt < K::kBlockN / 16; ++kt)
      WgmmaSSTT<K::kDqN, T>::run(dq[r], desc_ds<K>(desc_advance(ds_mn, r * K::kBlockN * 128), buf, kt),
                                 desc_k_mn(k_mn, kt), kt > 0);
  wgmma_commit();
}

// Split-d: dV += P^T dO and dK += dS^T Q with A = P^T / dS^T from shared
// memory (both warpgroups' halves of buffer buf), in their own group.
template <class K, typename T>
__device__ __forceinline__ void issue_split_d_updates(float (&dv)[K::kDvN / 2], float (&dk)[K::kDvN / 2],
                                                      uint64_t p_t_rows, uint64_t ds_t_rows, uint64_t do_mn,
                                                      uint64_t q_mn, int buf, int s) {
#pragma unroll
  for (int kt = 0; kt < K::kBlockM / 16; ++kt)
    WgmmaSST<K::kDvN, T>::run(dv, desc_t_rows<K>(p_t_rows, buf, kt), desc_qdo_mn<K>(do_mn, s, kt), 1);
#pragma unroll
  for (int kt = 0; kt < K::kBlockM / 16; ++kt)
    WgmmaSST<K::kDvN, T>::run(dk, desc_t_rows<K>(ds_t_rows, buf, kt), desc_qdo_mn<K>(q_mn, s, kt), 1);
  wgmma_commit();
}

// Q, dO, lse, D of the stage are no longer read (split-d: once dV, dK are done).
template <class K>
__device__ __forceinline__ void release_stage(float (&dv)[K::kDvN / 2], float (&dk)[K::kDvN / 2], uint64_t* empty,
                                              int lane) {
  fence_operands(dv);
  fence_operands(dk);
  __syncwarp();
  if (lane == 0) mbar_arrive(empty);
}

// A consumer warpgroup's walk: dK, dV accumulate over every query tile, then
// the epilogue writes them. Drop: NoDropout or PhiloxDropout
// (cuda/sm90/dropout.cuh; bwd/dropout.cuh applies it).
template <class K, typename T, class Drop, class Walk, class Mods>
__device__ __forceinline__ void consume(const AttentionParams& p, const bwd::Workspace& ws, const BwdCta& cta,
                                        const typename Walk::Tiles& tiles, const BwdSmem<K>& sm, int cw) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  ConsumerThread th;
  th.place<K>(cw);
  ConsumerOperands op;
  op.build<K>(sm, th);
  const float scale_log2 = ws.scale_log2;
  const bool alibi = p.has_alibi();
  const bool softcap = p.softcap > 0.0f;

  float dk[K::kDvN / 2], dv[K::kDvN / 2];
#pragma unroll
  for (int i = 0; i < K::kDvN / 2; ++i) dk[i] = dv[i] = 0.0f;

  if (cta.w.iters > 0) mbar_wait(sm.full_kv, 0);
  for (int it = 0; it < cta.w.iters; ++it) {
    const int s = it % kStages;
    const uint32_t ph = (it / kStages) & 1;
    const int buf = it & 1;
    int h, m;
    const bool partial = Walk::step(tiles, cta, it, h, m);
    const int q0 = m * kBlockM;
    // Dropout's keep bits while the stage's Q and dO load, before S^T and
    // dP^T are issued (their accumulators not live yet).
    TransposedKeep<K> keep;
    if constexpr (Drop::kOn) {
      keep = transposed_keep_bits<K>(p.dropout, cta.b * p.heads_q + h, q0 + th.q_col,
                                     cta.w.k0 + th.key_off + 16 * th.warp, th.lane / 4, th.quad);
    }
    // A step the block mask lists in part: which pairs it lists, as the keep bits.
    ListedBits<K> listed;
    if constexpr (Walk::kListed) {
      if (partial) listed = listed_bits<K>(p.block_mask, tiles.blocks, cta, th, h, q0);
    }
    mbar_wait(&sm.full[s], ph);

    constexpr int kSN = K::kSN;
    float st[kSN / 2], dpt[kSN / 2];
    issue_s_dp<K, T>(st, dpt, op.k_rows, op.v_rows, op.q_rows, op.do_rows, s);

    // Element e of accumulator tile i: key key_r + 8*(e>>1), query
    // q0 + q_col + 8i + 2*quad + (e&1). P = 0 where masked (softmax.cuh's NOTES).
    const bool full_tile = cta.mask.tile_fully_visible(q0, q0 + kBlockM, cta.w.k0, cta.w.k0 + kBlockN);
    const uint32_t row_off = 4u * (s * kBlockM + th.q_col + 2 * th.quad);
    uint32_t pa[kSN / 16][4], da[kSN / 16][4];

    // P^T (st) while dP^T runs; with kEarlyDv, dV's wgmmas then run while
    // dS^T is computed.
    if constexpr (K::Tune::kOverlapP) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    if (Mods::kSoftcapAlibi || alibi) {
      const AlibiScore alibi2{p.alibi_slope(cta.b, h) * kLog2e, cta.mask.diagonal_offset()};
      const auto logit2 = [&] {
        if constexpr (Mods::kSoftcapAlibi) {
          return SoftcapLogit2{ws.inv_softcap, ws.softcap_log2};
        } else {
          return PlainLogit2{scale_log2};
        }
      }();
      exp_scores_alibi<K>(st, op.lse_base + row_off, logit2, alibi2, cta.w.k0 + th.key_r,
                          q0 + th.q_col + 2 * th.quad, alibi_side<K>(q0, cta.w.k0, alibi2.diagonal_offset));
    } else if (softcap) {
      exp_scores_softcap<K>(st, op.lse_base + row_off, ws.inv_softcap, ws.softcap_log2);
    } else {
      exp_scores<K>(st, op.lse_base + row_off, scale_log2);
    }
    if (!full_tile) {
      int rel_lo[2], count[2];
      visible_spans(rel_lo, count, cta, th, q0);
      zero_invisible<K>(st, rel_lo, count);
    }
    if constexpr (Walk::kListed) {
      if (partial) zero_unlisted<K>(st, listed);
    }
    if constexpr (K::kSplitD) {
      p_frags<K, T, Drop>(st, keep, pa);
      store_transposed<K>(op.p_base, buf, pa, th);
      wgmma_wait<0>();
    } else if constexpr (K::Tune::kEarlyDv) {
      p_frags<K, T, Drop>(st, keep, pa);
      issue_update<K, T>(dv, pa, op.do_mn, s);
      wgmma_wait<1>();  // dP^T done (dV may still run)
    } else {
      wgmma_wait<0>();
    }
    dropout_dp<K, Drop>(dpt, keep);
    if constexpr (Mods::kSoftcapAlibi) {
      // The bias again, in units of th (softmax.cuh's ds_scores_softcap).
      const AlibiScore alibi2{p.alibi_slope(cta.b, h) * kLog2e, cta.mask.diagonal_offset()};
      const int side = alibi_side<K>(q0, cta.w.k0, alibi2.diagonal_offset);
      const AlibiBias2<K> bias(alibi2, cta.w.k0 + th.key_r, q0 + th.q_col + 2 * th.quad, side,
                               ws.inv_softcap_log2);
      if (side != 0) {
        ds_scores_softcap<K>(dpt, st, op.d_base + row_off, op.lse_base + row_off, ws.inv_softcap_log2,
                             [&](int i, int e) { return bias.linear(i, e); });
      } else {
        ds_scores_softcap<K>(dpt, st, op.d_base + row_off, op.lse_base + row_off, ws.inv_softcap_log2,
                             [&](int i, int e) { return bias.exact(i, e); });
      }
    } else if (softcap) {
      ds_scores_softcap<K>(dpt, st, op.d_base + row_off, op.lse_base + row_off, ws.inv_softcap_log2);
    } else {
      ds_scores<K>(dpt, st, op.d_base + row_off);
    }
    if constexpr (K::kSplitD) {
      to_frags<K, T>(dpt, da);
    } else if constexpr (K::Tune::kEarlyDv) {
      to_frags<K, T>(dpt, da);
      issue_update<K, T>(dk, da, op.q_mn, s);
    } else {
      // One group for both (two groups made ptxas serialize the wgmmas at d 64).
      p_frags<K, T, Drop>(st, keep, pa);
      to_frags<K, T>(dpt, da);
      issue_updates_together<K, T>(dv, dk, pa, da, op.do_mn, op.q_mn, s);
    }

    store_transposed<K>(op.ds_base, buf, da, th);
    fence_proxy_async_smem();
    if constexpr (K::kDqAlternate) {
      // Query tile it's dQ is warpgroup (it & 1)'s: it waits for the other's
      // half of dS^T; the other only arrives, and goes on to the next tile
      // once its dV, dK are done. Both wait for dV, dK first: the dQ
      // accumulator beside their fragments made ptxas serialize the wgmmas
      // at d 128 (C7512).
      const uint32_t ds_bar = (it & 1) ? K::kDsBarrierOdd : K::kDsBarrier;
      const bool mine = (it & 1) == cw;
      if (!mine) named_arrive(ds_bar, 128 * K::kConsumers);
      wgmma_wait<0>();
      fence_operands(pa);
      fence_operands(da);
      release_stage<K>(dv, dk, &sm.empty[s], th.lane);
      if (!mine) continue;
      named_sync(ds_bar, 128 * K::kConsumers);
    } else {
      named_sync(K::kDsBarrier, 128 * K::kConsumers);
    }

    // dQ partial = dS K (this warpgroup's share), then into the accumulator;
    // split-d: dV += P^T dO and dK += dS^T Q behind it, in their own group.
    float dq[K::kDqParts][K::kDqN / 2];
    issue_dq<K, T>(dq, op.ds_mn, op.k_mn, buf);
    if constexpr (K::kSplitD) {
      issue_split_d_updates<K, T>(dv, dk, op.p_t_rows, op.ds_t_rows, op.do_mn, op.q_mn, buf, s);
      wgmma_wait<1>();  // dQ done; dV, dK run on under its write-out
    } else {
      wgmma_wait<0>();
    }
#pragma unroll
    for (int r = 0; r < K::kDqParts; ++r) fence_operands(dq[r]);
    fence_operands(pa);
    fence_operands(da);
    if constexpr (!K::kSplitD && !K::kDqAlternate) release_stage<K>(dv, dk, &sm.empty[s], th.lane);

    write_dq<K, Walk>(dq, p, ws, cta, tiles, th, op.p_base, op.ds_base, it, buf, h, q0);
    if constexpr (K::kSplitD) {
      wgmma_wait<0>();
      release_stage<K>(dv, dk, &sm.empty[s], th.lane);
    }
  }

  store_dk_dv<K, T>(dk, dv, p, cta, th, ws.row_d, nonfinite::pairs_of<K::kBlockM, K::kBlockN>(tiles));
}

}  // namespace flashattn::cuda::sm90
