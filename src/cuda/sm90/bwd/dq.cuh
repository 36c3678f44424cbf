// The Hopper backward's dQ reduction: each consumer's dQ partial (dS K over
// its share of the tile) is added into the f32 dQ accumulator, one of three ways:
//   kDqTma   staged in shared memory (stage_dq), added by TMA reduce-adds
//            issued by the producer warpgroup's second warp (reduce_dq);
//   split-d  (d 256) transposed through shared memory by each warp, then
//            red.global.add.v4.f32 along dQ rows (red_dq_rows);
//   else     red.global.add.v2.f32 from the fragment (red_dq_frags).
// The shared pre-pass (cuda/bwd/passes.cu) zeroed the accumulator; the
// post-pass scales it into dq.
//
// NOTES:
// - Deterministic mode: the reducer warp (split-d: the consumers, between two
//   barriers with the turn warp, order_dq_turns) adds key tile n's dQ share of
//   query tile m only after key tile n+1 (if it sees m) has published its own (a counter
//   per (sequence, query head, query tile), release/acquire, as the sm80
//   kernel orders its atomics); the highest key tile is dispatched first so
//   that the chain cannot deadlock. With rotated walks (scheduler.cuh NOTES)
//   the key tile before n is the one that met m a step earlier, and the
//   launcher allows that order only where a head's key tiles all run at once.
//   Split-d publishes without a fence per
//   thread: each thread's red.global adds are ordered before the consumers'
//   barrier, the barrier before the publishing thread's st.release.gpu, and
//   a release is cumulative, so the next key tile's acquire sees them all (the
//   pattern of CUTLASS's semaphore). A __threadfence() in every thread, which
//   waited for its own adds' round trip each step, made the mode cost
//   +36-50% (non-causal) at d 256 against +15-29% without it
//   (docs/performance.md section 3.3). Varlen batches: the TMA boxes of the
//   query tile that ends a sequence also add its rows past the sequence (dS =
//   0 there) into the next sequence's rows, outside that sequence's turns.
//   The reducer writes those rows as -0.0f first (negative_zero_rows): x +
//   (-0) = x for every x, +0 and -0 included, so these adds change no bit in
//   any order (a +0 would turn a -0 into +0, and an f32 reduction makes a -0
//   when it flushes a negative subnormal result). Split-d adds only rows
//   inside the sequence.
// - dQ without TMA (d 256): the L2 counts requests, not bytes. A thread's
//   accumulator fragment holds 2 adjacent columns per 8, so red.v2 from the
//   fragment makes one 1-sector L2 request per instruction and lane; ncu on
//   the d 256 kernel showed L2 at 82-87% of peak, 66% of it tag lookups, and
//   30% of warp stalls on the reds. Rows made contiguous first (8 lanes x 16
//   bytes = one 128-byte row segment) cut requests 4x: +12..32% backward
//   TFLOP/s (docs/performance.md).
#pragma once

#include <cuda.h>

#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/common/named_barrier.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// Rows [rows, kBlockM) of a staged dQ tile (every 32-column box) set to
// -0.0f by the reducer warp, then made visible to its TMA reads.
template <class K>
__device__ __forceinline__ void negative_zero_rows(uint8_t* staged, int rows, int lane) {
  const uint32_t base = smem_addr(staged);
  for (int unit = rows * 8 + lane; unit < K::kBlockM * 8; unit += 32) {  // 16-byte units, 8 a row
#pragma unroll 1
    for (int box = 0; box < K::kHeadDim / 32; ++box) {
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + box * K::kBlockM * 128 + unit * 16),
                   "r"(0x80000000u)
                   : "memory");
    }
  }
  fence_proxy_async_smem();
  __syncwarp();
}

// The reducer warp: adds each finished dQ tile into the f32 accumulator with
// one TMA reduce per 32-column box (rows past the tensor are skipped; rows
// past a varlen sequence hold zeros: dS = 0 there; -0.0f in deterministic
// mode, NOTES).
template <class K, class Walk>
__device__ __forceinline__ void reduce_dq(const CUtensorMap* tma_dq, const AttentionParams& p,
                                          const bwd::Workspace& ws, const BwdCta& cta,
                                          const typename Walk::Tiles& tiles, int lane, int bq, int row_q0) {
  uint8_t* const smem = smem_raw + smem_align_pad();
  for (int it = 0; it < cta.w.iters; ++it) {
    const int qb = it % (K::kDqBufs > 0 ? K::kDqBufs : 1);
    int h, m;
    Walk::step(tiles, cta, it, h, m);
    const int q0 = m * K::kBlockM;
    int* sem = p.deterministic ? ws.dq_semaphore(p, cta.b, h, m) : nullptr;
    if (sem != nullptr && lane == 0) {
      // The key tile before this one in query tile m's turns adds its share first.
      // NOTES: the turn is found here, not once before the loop: held across
      // the loop on this warp's 24 registers it spilled (12 bytes, plain d 128).
      const DqTurn turn = Walk::template dq_turn<K::kBlockM, K::kBlockN>(ws, cta);
      Walk::template wait_turn<K::kBlockM, K::kBlockN>(sem, tiles, turn, cta, it, m);
      fence_proxy_async_global();  // its adds (seen by the acquire) before ours
    }
    named_sync(K::kDqFull0 + qb, K::kDqBarThreads);
    if (sem != nullptr && cta.varlen && q0 + K::kBlockM > cta.seq.seqlen_q) {
      negative_zero_rows<K>(smem + K::kDqOff + qb * K::kDqBytes, cta.seq.seqlen_q - q0, lane);
    }
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < K::kHeadDim / 32; ++c)
        tma_reduce_add_4d(tma_dq, smem + K::kDqOff + qb * K::kDqBytes + c * K::kBlockM * 128, c * 32,
                          row_q0 + q0, h, bq);
      bulk_commit();
      if (sem != nullptr) {
        bulk_wait<0>();  // the adds are performed, then published
        fence_proxy_async_global();
        publish_dq_turn(sem, cta.n_tile);
      } else {
        bulk_wait_read<0>();
      }
    }
    __syncwarp();
    // The consumers wait for this buffer only if they will fill it again.
    if (it + K::kDqBufs < cta.w.iters) named_arrive(K::kDqFree0 + qb, K::kDqBarThreads);
  }
  if (lane == 0) bulk_wait<0>();
}

// Into dQ buffer it % kDqBufs (box c/32: rows x 128 bytes, 16-byte chunk index
// ^= row % 8: the 8 rows of a store land in distinct banks), then the reducer
// warp adds it into the accumulator.
template <class K>
__device__ __forceinline__ void stage_dq(const float (&dq)[K::kDqParts][K::kDqN / 2], const ConsumerThread& th,
                                         int it, int dq_row0) {
  uint8_t* const smem = smem_raw + smem_align_pad();
  const int qb = it % K::kDqBufs;
  if (it >= K::kDqBufs) named_sync(K::kDqFree0 + qb, K::kDqBarThreads);
  // Column col = col_base + 8i + 2*quad (col_base = 0 or cw * kDqN): box
  // col / 32 = col_base / 32 + i / 4, chunk (col % 32) / 4 = 2 * (i % 4)
  // + quad / 2, byte (col % 4) * 4 = (quad % 2) * 8 in the chunk.
  const uint32_t rowb = smem_addr(smem + K::kDqOff + qb * K::kDqBytes) +
                        ((K::kDqSplitCols ? th.cw * (K::kDqN / 32) : 0) * K::kBlockM + dq_row0) * 128 +
                        (th.quad % 2) * 8;
  const uint32_t swz = opaque(th.lane / 4);  // row % 8 of both rows stored
#pragma unroll
  for (int part = 0; part < K::kDqParts; ++part)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int i = 0; i < K::kDqN / 8; ++i) {
        const uint32_t box = i / 4;
        const uint32_t chunk = (2 * (i % 4) + th.quad / 2) ^ swz;
        st_shared_v2(rowb + box * (K::kBlockM * 128) + part * 64 * 128 + r * 1024 + chunk * 16,
                     dq[part][4 * i + 2 * r], dq[part][4 * i + 2 * r + 1]);
      }
    }
  fence_proxy_async_smem();
  named_arrive(K::kDqFull0 + qb, K::kDqBarThreads);
}

// Split-d scratch for the dQ transpose, scratch row `row`, 16-byte unit
// `unit`: P^T key row warp*16 + row for unit < 4, dS^T key row warp*16 +
// (row ^ 4) for unit >= 4, chunk unit % 4 of this warpgroup's, in buffers
// [buf ^ 1]: the 8 units a quarter-warp loads then sit in 8 distinct bank
// groups (k % 8 differs in bit 2), and the 8 rows a store covers too.
template <class K>
__device__ __forceinline__ uint32_t dq_scratch(uint32_t p_base, uint32_t ds_base, int buf, const ConsumerThread& th,
                                               int row, int unit) {
  const bool ds_half = unit >= 4;
  const int k = th.warp * 16 + (ds_half ? row ^ 4 : row);
  const uint32_t base = (ds_half ? ds_base : p_base) + (buf ^ 1) * K::kDsBytes;
  return base + k * 128 + (((th.cw * 4 + unit % 4) ^ (k & 7)) << 4);
}

// Split-d: row-contiguous reduce-adds. 8 lanes cover 128 bytes of one dQ row,
// so each red.v4 instruction is 4 L2 requests of 4 sectors. The accumulator
// fragment gives a row's 32-column span to only 4 lanes (red.v2: 8 requests
// of 1 sector), and that request rate, not the bytes, was what saturated the
// L2 crossbar (NOTES). Each warp transposes its 16 rows x 32 columns (2 KB) at
// a time through shared memory: the bytes its own store_transposed wrote into
// the P^T / dS^T buffers [buf ^ 1] (its 16 key rows, this warpgroup's 4 chunks
// of each). Their last readers, tile it - 1's wgmmas of both warpgroups,
// finished before either reached this tile's kDsBarrier; their next writer is
// this warp's store_transposed of tile it + 1.
template <class K, class Walk>
__device__ __forceinline__ void red_dq_rows(const float (&dq)[K::kDqN / 2], const AttentionParams& p,
                                            const bwd::Workspace& ws, const BwdCta& cta,
                                            const typename Walk::Tiles& tiles, const ConsumerThread& th,
                                            uint32_t p_base, uint32_t ds_base, int it, int buf, int h, int q0) {
  constexpr int D = K::kHeadDim;
  float* dq_base = ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + cta.seq.row_q + q0 + th.warp * 16) * D +
                   th.cw * K::kDqN;
  const int rows_left = cta.seq.seqlen_q - q0 - th.warp * 16;
  // Deterministic mode: the turn warp has acquired the query tile's turn
  // (order_dq_turns) and publishes our adds once every thread has made them.
  if (p.deterministic) named_sync(K::kDqTurnReady, K::kDqTurnThreads);
#pragma unroll
  for (int ch = 0; ch < K::kDqN / 32; ++ch) {
    // Fragment tiles 4ch .. 4ch+3 (columns 32ch .. 32ch+31): tile t's
    // columns 8t + 2*quad, +1 are unit 2t + quad/2, byte 8 * (quad % 2).
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        st_shared_v2(dq_scratch<K>(p_base, ds_base, buf, th, th.lane / 4 + 8 * r, 2 * t + th.quad / 2) +
                         8 * (th.quad % 2),
                     dq[4 * (4 * ch + t) + 2 * r], dq[4 * (4 * ch + t) + 2 * r + 1]);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = th.lane / 8 + 4 * j;
      const float4 v = ld_shared_v4(dq_scratch<K>(p_base, ds_base, buf, th, row, th.lane % 8));
      if (row < rows_left) red_add_v4(dq_base + row * D + 32 * ch + 4 * (th.lane % 8), v);
    }
    __syncwarp();
  }
  // Every consumer thread's adds precede its arrival, which the turn warp's
  // release store follows (cumulativity: NOTES).
  if (p.deterministic) named_arrive(K::kDqTurnDone, K::kDqTurnThreads);
}

// Split-d deterministic mode: warp 1 of the producer warpgroup (idle there)
// passes the query tiles' turns on for the consumers. Per step it waits for
// the turn, lets the consumers add (kDqTurnReady), waits for their adds
// (kDqTurnDone) and publishes them, so the release store's wait for the adds
// to be performed falls on this warp, beside the consumers' next tile, and not
// on a consumer thread that the next barrier would make every consumer wait for.
template <class K, class Walk>
__device__ __forceinline__ void order_dq_turns(const AttentionParams& p, const bwd::Workspace& ws,
                                               const BwdCta& cta, const typename Walk::Tiles& tiles, int lane) {
  for (int it = 0; it < cta.w.iters; ++it) {
    int h, m;
    Walk::step(tiles, cta, it, h, m);
    int* const sem = ws.dq_semaphore(p, cta.b, h, m);
    if (lane == 0) {
      const DqTurn turn = Walk::template dq_turn<K::kBlockM, K::kBlockN>(ws, cta);
      Walk::template wait_turn<K::kBlockM, K::kBlockN>(sem, tiles, turn, cta, it, m);
    }
    __syncwarp();
    named_arrive(K::kDqTurnReady, K::kDqTurnThreads);
    named_sync(K::kDqTurnDone, K::kDqTurnThreads);
    if (lane == 0) publish_dq_turn(sem, cta.n_tile);
  }
}

// red.global.add.v2 of the fragment: rows dq_row0, dq_row0 + 8 of the tile
// (those inside the sequence), columns dq_col0 + 8i, +1.
template <class K>
__device__ __forceinline__ void red_dq_frags(const float (&dq)[K::kDqN / 2], const AttentionParams& p,
                                             const bwd::Workspace& ws, const BwdCta& cta, int h, int q0,
                                             int dq_row0, int dq_col0) {
  constexpr int D = K::kHeadDim;
  float* dq_base = ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + cta.seq.row_q + q0) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = dq_row0 + 8 * r;
    if (q0 + row >= cta.seq.seqlen_q) continue;
#pragma unroll
    for (int i = 0; i < K::kDqN / 8; ++i)
      red_add_v2(dq_base + row * D + dq_col0 + 8 * i, dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
  }
}

// This consumer's dQ partial of iteration it (query tile q0 of head h) into
// the accumulator, the configuration's way.
template <class K, class Walk>
__device__ __forceinline__ void write_dq(const float (&dq)[K::kDqParts][K::kDqN / 2], const AttentionParams& p,
                                         const bwd::Workspace& ws, const BwdCta& cta,
                                         const typename Walk::Tiles& tiles, const ConsumerThread& th,
                                         uint32_t p_base, uint32_t ds_base, int it,
                                         int buf, int h, int q0) {
  const int dq_row0 = (K::kDqSplitRows ? th.cw * 64 : 0) + th.warp * 16 + th.lane / 4;
  const int dq_col0 = (K::kDqSplitCols ? th.cw * K::kDqN : 0) + 2 * th.quad;
  if constexpr (K::kDqTma) {
    stage_dq<K>(dq, th, it, dq_row0);
  } else if constexpr (K::kSplitD) {
    red_dq_rows<K, Walk>(dq[0], p, ws, cta, tiles, th, p_base, ds_base, it, buf, h, q0);
  } else {
    red_dq_frags<K>(dq[0], p, ws, cta, h, q0, dq_row0, dq_col0);
  }
}

}  // namespace flashattn::cuda::sm90
