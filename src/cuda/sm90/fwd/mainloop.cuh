// The Hopper forward's consumers (the mainloop): each consumer warpgroup owns
// 64 query rows of the tile and walks its key tiles from the highest down:
//   S = Q K^T (wgmma, both operands in shared memory)
//   S -> softcap, mask, online softmax: m_new = max(m, rowmax(S)),
//        P = exp(S - m_new), l = l exp(m - m_new) + rowsum(P)
//   O = O exp(m - m_new) + P V (wgmma, P from registers)
// S of key tile n-1 is issued with P V of tile n (intra-warpgroup overlap), and
// the consumers take turns issuing their wgmmas (ping-pong on named barriers),
// so one warpgroup's softmax runs under the other's tensor-core work.
#pragma once

#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/fwd/dropout.cuh"
#include "cuda/sm90/fwd/epilogue.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/softmax.cuh"
#include "cuda/sm90/fwd/traits.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

// Drop: NoDropout or PhiloxDropout (cuda/sm90/dropout.cuh); Walk: DenseKeys or
// ListedKeys (scheduler.cuh).
template <class K, typename T, bool kSplit, class Drop = NoDropout, class Walk = DenseKeys>
struct Consumer {
  static_assert(!(Walk::kListed && K::kCache), "block masks: no KV-cache instantiation");
  static constexpr int D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  static constexpr uint32_t kTurnThreads = 256;
  // A tile's last P V and the next tile's first S in one turn (traits.h).
  static constexpr bool kCrossTile = K::kCrossTile && !kSplit;

  const AttentionParams& p;
  const FwdArgs& a;
  const typename Walk::Tiles& blocks;
  const FwdSmem<K, T>& sm;
  const Epilogue<K, T, kSplit>& epi;
  const int cw, warp, lane;        // consumer warpgroup: query rows cw*64 .. cw*64+63 of the tile
  const uint32_t my_turn, other_turn;
  // Operand descriptors: built once from the buffers' bases, then moved by
  // byte offsets (desc_advance).
  // NOTES: built per wgmma from the address, each took 7 uniform-datapath
  // instructions issued inside the ping-pong turn: 118 of the d 128 loop's
  // ~566 instructions per key tile.
  const uint64_t q_desc0, k_desc, v_desc;
  uint64_t q_desc;

  float o[D / 2];
  float m[2], l[2], corr[2];
  float sc[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  TileKeep<Drop, kBlockN> keep;  // dropout's flags for the next convert_p
  int qt = 0;  // tiles with loads so far, as the producer counts them
  int it = 0;  // K/V stages consumed so far, as the producer fills them
  uint64_t* q_empty = nullptr;
  bool nonfinite = false;  // an epilogue of this warp stored an Inf or NaN (Epilogue::fix_after_walk)

  __device__ __forceinline__ Consumer(const AttentionParams& p_, const FwdArgs& a_,
                                      const typename Walk::Tiles& blocks_, const FwdSmem<K, T>& sm_,
                                      const Epilogue<K, T, kSplit>& epi_, int cw_, int tid)
      : p(p_), a(a_), blocks(blocks_), sm(sm_), epi(epi_), cw(cw_), warp(tid / 32), lane(tid % 32),
        my_turn(K::kTurnBarrier0 + cw_), other_turn(K::kTurnBarrier0 + (cw_ + 1) % K::kConsumers),
        q_desc0(make_smem_desc_sw128(smem_addr(sm_.q) + cw_ * 64 * 128, 16, 1024)),
        k_desc(make_smem_desc_sw128(smem_addr(sm_.k), 16, 1024)),
        v_desc(make_smem_desc_sw128(smem_addr(sm_.v), kBlockN * 128, 1024)),
        q_desc(q_desc0) {}

  __device__ __forceinline__ uint64_t desc_q(int kk) const {
    return desc_advance(q_desc, (kk / 4) * kBlockM * 128 + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t desc_k(int s, int kk) const {
    return desc_advance(desc_advance(k_desc, s * K::kKVBytes), (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t desc_v(int s, int kt) const {
    return desc_advance(desc_advance(v_desc, s * K::kKVBytes), kt * 16 * 128);
  }

  // S = Q K(stage s)^T into sc (issue only).
  __device__ __forceinline__ void issue_s(int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) WgmmaSS<kBlockN, T>::run(sc, desc_q(kk), desc_k(s, kk), kk > 0 ? 1 : 0);
    wgmma_commit();
  }
  // O += P V(stage s) (issue only).
  __device__ __forceinline__ void issue_pv(int s) {
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < kBlockN / 16; ++kt) WgmmaRS<D, T>::run(o, pa[kt], desc_v(s, kt), 1);
    wgmma_commit();
  }
  // Softcap, ALiBi, mask and online softmax of sc for key tile k.n of tile t;
  // the correction for O goes to corr.
  __device__ __forceinline__ void softmax(const RowTile& t, const typename Walk::Step& k) {
    const int n = k.n;
    if (a.softcap_in != 0.0f) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) sc[i] = SoftcapScore::unscaled(sc[i], a.softcap_in);
    }
    RowShift shift;
    if (p.has_alibi()) alibi_key_tile<kBlockN>(sc, shift, t, n, lane);
    mask_key_tile<kBlockN>(sc, t, n, lane);
    if constexpr (Walk::kListed) {
      if (k.partial) drop_unlisted_keys<kBlockN>(sc, p, blocks, t, n, lane);
    }
    online_softmax(sc, m, l, corr, a.scale_log2, MufuExp2{}, shift);
  }
  // O *= exp(m_old - m_new), inside the turn: between issuing S = Q K^T and
  // O += P V (which needs it) the warp would wait on the tensor pipe's queue
  // anyway, and off the chain from S through the softmax to the next turn.
  __device__ __forceinline__ void rescale_in_turn() {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[4 * i + 0] *= corr[0];
      o[4 * i + 1] *= corr[0];
      o[4 * i + 2] *= corr[1];
      o[4 * i + 3] *= corr[1];
    }
    fence_operands(o);
  }
  // P of key tile n to 16 bits; dropout zeroes the dropped ones there (after
  // the row sum: l stays the one before dropout), by the flags keep.draw made.
  __device__ __forceinline__ void convert_p(int n) {
#pragma unroll
    for (int kt = 0; kt < kBlockN / 16; ++kt) {
      pa[kt][0] = pack2<T>(sc[8 * kt + 0], sc[8 * kt + 1]);
      pa[kt][1] = pack2<T>(sc[8 * kt + 2], sc[8 * kt + 3]);
      pa[kt][2] = pack2<T>(sc[8 * kt + 4], sc[8 * kt + 5]);
      pa[kt][3] = pack2<T>(sc[8 * kt + 6], sc[8 * kt + 7]);
    }
    keep.mask(pa, n);
  }
  __device__ __forceinline__ void release(uint64_t* bar) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  }
  // NOTES (keys past a sequence's count): with seqused_k (the KV-cache route)
  // a sequence's last key tile may run past its keys into cache rows that
  // hold anything, NaN included. The mask sets their scores to -inf, so P is
  // 0 there, but 0 * NaN in P V is NaN: the rows of V past the count are
  // zeroed in shared memory before P V reads the stage. Every consumer
  // warpgroup zeroes them before its own P V (the same value, so the order
  // among warpgroups does not matter), whole 128-byte rows (the swizzle
  // permutes 16-byte chunks within a row), then a proxy fence for wgmma.
  __device__ __forceinline__ void clear_v_past_keys(const RowTile& t, int n, int s) const {
    if constexpr (!K::kCache) return;
    const int first = max(t.w.seq.seqlen_k - n * kBlockN, 0);
    if (first >= kBlockN) return;
    constexpr int kChunksPerRow = 128 / sizeof(uint4);
    const int chunks = (kBlockN - first) * kChunksPerRow;
    T* stage = sm.v + s * K::kColBlocks * kBlockN * 64;
#pragma unroll
    for (int c = 0; c < K::kColBlocks; ++c) {
      uint4* rows = reinterpret_cast<uint4*>(stage + (c * kBlockN + first) * 64);
      for (int i = warp * 32 + lane; i < chunks; i += 128) rows[i] = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_smem();
    named_sync(K::kOBarrier0 + cw, 128);
  }
  // The tile's Q buffer: the producer filled it for the qt-th tile with loads.
  __device__ __forceinline__ void claim_q() {
    const int qs = qt % K::kQStages;
    const uint32_t q_phase = (qt / K::kQStages) & 1;
    ++qt;
    q_desc = desc_advance(q_desc0, qs * K::kQBytes);
    q_empty = &sm.empty_q[qs];
    mbar_wait(&sm.full_q[qs], q_phase);
  }
  // A new tile's row state; O is zeroed only where no wgmma is in flight
  // (ptxas serializes every wgmma otherwise, C7515).
  __device__ __forceinline__ void reset_rows() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  }
  // The next valid tile from step `step` on (producer and consumers skip the same ones).
  __device__ __forceinline__ bool next_tile(int& step, RowTile& t) const {
    for (; step < a.num_steps; ++step) {
      if (!work_at<kBlockM, kBlockN, kSplit, K::kCache, Walk>(p, a, blocks, step, t.w, t.seg)) continue;
      if (!t.w.valid) continue;
      t.mask = mask_for(p, t.w.seq);
      t.row0 = t.w.m0 + cw * 64 + warp * 16 + lane / 4;
      t.rows_end = min(t.w.m0 + kBlockM, t.w.seq.seqlen_q);
      if (p.has_alibi()) t.alibi = AlibiScore{p.alibi_slope(t.w.b, t.w.h) / a.logit_scale, t.mask.diagonal_offset()};
      return true;
    }
    return false;
  }

  // S and P of the tile's first (highest) key tile k.n, in stage s.
  __device__ __forceinline__ void first_key_tile(const RowTile& t, const typename Walk::Step& k, int s, uint32_t ph) {
    const int n = k.n;
    claim_q();
    mbar_wait(&sm.full_k[s], ph);
    named_sync(my_turn, kTurnThreads);
    issue_s(s);
    named_arrive(other_turn, kTurnThreads);
    keep.draw(p, t, n, lane);
    wgmma_wait<0>();
    fence_operands(sc);
    release(&sm.empty_k[s]);
    if (n == t.w.n_begin) release(q_empty);
    softmax(t, k);
    convert_p(n);
  }

  // Steady state, key tile n = k.n in stage s: S(n) runs on the tensor cores
  // with P V of the tile walked before it (Walk::above(k), stage s_prev) while the
  // softmax of n follows S's wait.
  __device__ __forceinline__ void key_tile(const RowTile& t, const typename Walk::Step& k, int s, uint32_t ph,
                                           int s_prev, uint32_t ph_prev) {
    const int n = k.n;
    mbar_wait(&sm.full_k[s], ph);
    mbar_wait(&sm.full_v[s_prev], ph_prev);
    clear_v_past_keys(t, Walk::above(k), s_prev);
    named_sync(my_turn, kTurnThreads);
    fence_operands(o);
    fence_operands(pa);
    issue_s(s);
    rescale_in_turn();
    issue_pv(s_prev);
    named_arrive(other_turn, kTurnThreads);
    keep.draw(p, t, n, lane);
    wgmma_wait<1>();
    fence_operands(sc);
    release(&sm.empty_k[s]);
    if (n == t.w.n_begin) release(q_empty);
    softmax(t, k);
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pa);
    release(&sm.empty_v[s_prev]);
    convert_p(n);
  }

  // The last turn's start: O rescaled and the last P V (stage s) issued.
  __device__ __forceinline__ void take_turn_issue_last_pv(int s) {
    named_sync(my_turn, kTurnThreads);
    fence_operands(o);
    fence_operands(pa);
    rescale_in_turn();
    issue_pv(s);
  }

  // The last P V of tile t (stage s) with the next tile's first S = Q K^T in
  // the same turn; t's epilogue runs while that S is on the tensor cores, then
  // nxt starts primed (its first key tile through the softmax).
  __device__ __forceinline__ void last_turn_fused(const RowTile& t, const RowTile& nxt, int s) {
    const int s_next = K::ring_stage(it + 1);
    const uint32_t ph_next = K::ring_phase(it + 1);
    claim_q();
    mbar_wait(&sm.full_k[s_next], ph_next);
    take_turn_issue_last_pv(s);
    issue_s(s_next);
    named_arrive(other_turn, kTurnThreads);
    const typename Walk::Step k = Walk::first(blocks, nxt.w);
    keep.draw(p, nxt, k.n, lane);
    wgmma_wait<1>();
    fence_operands(o);
    release(&sm.empty_v[s]);
    ++it;
    dropout_scale_out<Drop>(o, p);
    nonfinite |= epi.finish(t, o, m, l);
    wgmma_wait<0>();
    fence_operands(sc);
    reset_rows();
    release(&sm.empty_k[s_next]);
    if (k.n == nxt.w.n_begin) release(q_empty);
    softmax(nxt, k);
    convert_p(k.n);
  }

  // The last P V of a tile (stage s) alone.
  __device__ __forceinline__ void last_turn(int s) {
    take_turn_issue_last_pv(s);
    named_arrive(other_turn, kTurnThreads);
    wgmma_wait<0>();
    fence_operands(o);
    release(&sm.empty_v[s]);
    ++it;
  }

  // The walk over this CTA's tiles.
  // NOTES: the fused and plain last turns are separate functions: with the S
  // issue and its wait under `if (fused)` inside one shared sequence, S's
  // accumulators are in flight across a merge of control flow and ptxas
  // serializes every wgmma of the kernel (C7515; 17-32% slower).
  __device__ __forceinline__ void run() {
    // Ping-pong: the consumers issue their GEMMs in turn 0, 1, (2,) 0, ...;
    // the last one hands warpgroup 0 the first turn.
    if (cw == K::kConsumers - 1) named_arrive(K::kTurnBarrier0, kTurnThreads);
    int step = 0;
    RowTile cur;
    bool have = next_tile(step, cur);
    bool primed = false;  // cur's first key tile already through S and the softmax
    reset_rows();
    while (have) {
      const TileWork& w = cur.w;
      int step_next = step + 1;
      RowTile nxt;
      bool have_next = false;
      bool fused = false;  // this tile's last turn issued the next tile's first S
      if (w.n_end > w.n_begin) {
        typename Walk::Step k = Walk::first(blocks, w);
        int s = K::ring_stage(it);
        uint32_t ph = K::ring_phase(it);
        if (!primed) first_key_tile(cur, k, s, ph);
        for (Walk::advance(blocks, w, k); k.n >= w.n_begin; Walk::advance(blocks, w, k)) {
          const int s_prev = s;
          const uint32_t ph_prev = ph;
          ++it;
          s = K::ring_stage(it);
          ph = K::ring_phase(it);
          key_tile(cur, k, s, ph, s_prev, ph_prev);
        }
        if constexpr (kCrossTile) {
          have_next = next_tile(step_next, nxt);
          fused = have_next && nxt.w.n_end > nxt.w.n_begin;
        }
        mbar_wait(&sm.full_v[s], ph);
        clear_v_past_keys(cur, w.n_begin, s);
        if (fused) {
          last_turn_fused(cur, nxt, s);
        } else {
          last_turn(s);
        }
      }
      // (A tile with no visible key stores O = 0 and logsumexp -inf.)
      if (!fused) {
        dropout_scale_out<Drop>(o, p);
        nonfinite |= epi.finish(cur, o, m, l);
        reset_rows();
        if (!kCrossTile || w.n_end <= w.n_begin) have_next = next_tile(step_next, nxt);
      }
      primed = fused;
      cur = nxt;
      step = step_next;
      have = have_next;
    }
    // Balance the ping-pong: the last warpgroup's final hand-over to warpgroup
    // 0 is consumed here, so no arrival is left pending on a hardware barrier.
    if (cw == 0) named_sync(K::kTurnBarrier0, kTurnThreads);
    // The last O stores must complete before the CTA's shared memory goes.
    if (K::kOTma && warp == 0 && lane == 0) tma_store_wait_all();
  }
};

}  // namespace flashattn::cuda::sm90
