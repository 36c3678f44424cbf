// The Hopper backward's dQ write-out: a consumer's dQ partial tile of one query
// tile (dQ_partial = dS K, in wgmma accumulator layout) goes into the f32 dQ
// accumulator in one of three ways, fixed by the tuning:
//   kDqTma   into a shared-memory dQ buffer, added by the producer's reducer
//            warp with TMA reduce-adds (d 64, 128)
//   kSplitD  rows made contiguous through shared memory, then red.add.v4 along
//            dQ rows (d 256)
//   else     red.add.v2 straight from the accumulator fragment
#pragma once

#include "attention/mask.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/flags.h"
#include "cuda/sm90/bwd/traits.h"
#include "cuda/sm90/memory.h"
#include "cuda/sm90/sync.h"

namespace flashattn::cuda::sm90 {

template <class K>
struct DqWrite {
  static constexpr int D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  const AttentionParams& p;
  const bwd::Workspace& ws;
  const MaskPolicy& mask;
  const SequenceInfo& seq;
  uint8_t* smem;
  uint32_t p_base, ds_base;  // P^T / dS^T buffers (the split-d transpose scratch)
  int n_tile, b, cw, tid, warp, lane, quad;

  // Into dQ buffer qb (box c/32: rows x 128 bytes, 16-byte chunk index ^= row
  // % 8: the 8 rows of a store land in distinct banks), then the reducer warp
  // adds it into the accumulator.
  __device__ __forceinline__ void to_smem(int it, const float (&dq)[K::kDqN / 2]) const {
    const int dq_row0 = (K::kDqSplitM ? cw * 64 : 0) + warp * 16 + lane / 4;
    const int qb = it % K::kDqBufs;
    if (it >= K::kDqBufs) named_sync(K::kDqFree0 + qb, K::kDqBarThreads);
    // Column col = col_base + 8i + 2*quad (col_base = 0 or cw * kDqN): box
    // col / 32 = col_base / 32 + i / 4, chunk (col % 32) / 4 = 2 * (i % 4)
    // + quad / 2, byte (col % 4) * 4 = (quad % 2) * 8 in the chunk.
    const uint32_t rowb = smem_addr(smem + K::kDqOff + qb * K::kDqBytes) +
                          ((K::kDqSplitM ? 0 : cw * (K::kDqN / 32)) * kBlockM + dq_row0) * 128 + (quad % 2) * 8;
    const uint32_t swz = opaque(lane / 4);  // row % 8 of both rows stored
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int i = 0; i < K::kDqN / 8; ++i) {
        const uint32_t box = i / 4;
        const uint32_t chunk = (2 * (i % 4) + quad / 2) ^ swz;
        st_shared_v2(rowb + box * (kBlockM * 128) + r * 1024 + chunk * 16, dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
      }
    }
    fence_proxy_async_smem();
    named_arrive(K::kDqFull0 + qb, K::kDqBarThreads);
  }

  // Row-contiguous reduce-adds: 8 lanes cover 128 bytes of one dQ row, so each
  // red.v4 instruction is 4 L2 requests of 4 sectors. The accumulator fragment
  // gives a row's 32-column span to only 4 lanes (red.v2: 8 requests of 1
  // sector), and that request rate, not the bytes, saturated the L2 crossbar.
  // Each warp transposes its 16 rows x 32 columns (2 KB) at a time through
  // shared memory: the bytes its own store_t wrote into the P^T / dS^T buffers
  // [buf ^ 1] (its 16 key rows, this warpgroup's 4 chunks of each). Their last
  // readers, tile it - 1's wgmmas of both warpgroups, finished before either
  // reached this tile's kDsBarrier; their next writer is this warp's store_t of
  // tile it + 1. Scratch row r, unit u (16 bytes): P^T key row warp*16 + r for
  // u < 4, dS^T key row warp*16 + (r ^ 4) for u >= 4, chunk u % 4 of this
  // warpgroup's: the 8 units a quarter-warp loads then sit in 8 distinct bank
  // groups (k % 8 differs in bit 2), and the 8 rows a store covers too.
  __device__ __forceinline__ uint32_t scratch(int buf, int row, int unit) const {
    const bool ds_half = unit >= 4;
    const int k = warp * 16 + (ds_half ? row ^ 4 : row);
    const uint32_t base = (ds_half ? ds_base : p_base) + (buf ^ 1) * K::kDsBytes;
    return base + k * 128 + (((cw * 4 + unit % 4) ^ (k & 7)) << 4);
  }
  __device__ __forceinline__ void rows_split_d(int buf, int h, int q0, const float (&dq)[K::kDqN / 2]) const {
    float* dq_base =
        ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + seq.row_q + q0 + warp * 16) * D + cw * K::kDqN;
    const int rows_left = seq.seqlen_q - q0 - warp * 16;
    // Deterministic mode: key tile n+1, if it sees query tile m, has added its
    // share first (acquired by one thread, passed on by the barrier); ours is
    // published after every thread's adds are performed.
    int* const sem = p.deterministic ? ws.dq_semaphore(p, b, h, q0 / kBlockM) : nullptr;
    if (sem != nullptr) {
      if (cw == 0 && tid == 0) wait_dq_turn(sem, mask, q0 / kBlockM, n_tile, kBlockM, kBlockN, seq.seqlen_k);
      named_sync(K::kDqOrderBarrier, 128 * K::kConsumers);
    }
#pragma unroll
    for (int ch = 0; ch < K::kDqN / 32; ++ch) {
      // Fragment tiles 4ch .. 4ch+3 (columns 32ch .. 32ch+31): tile t's
      // columns 8t + 2*quad, +1 are unit 2t + quad/2, byte 8 * (quad % 2).
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          st_shared_v2(scratch(buf, lane / 4 + 8 * r, 2 * t + quad / 2) + 8 * (quad % 2),
                       dq[4 * (4 * ch + t) + 2 * r], dq[4 * (4 * ch + t) + 2 * r + 1]);
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = lane / 8 + 4 * j;
        const float4 v = ld_shared_v4(scratch(buf, row, lane % 8));
        if (row < rows_left) red_add_v4(dq_base + row * D + 32 * ch + 4 * (lane % 8), v);
      }
      __syncwarp();
    }
    if (sem != nullptr) {
      __threadfence();  // this thread's adds are performed before the semaphore moves
      named_sync(K::kDqOrderBarrier, 128 * K::kConsumers);
      if (cw == 0 && tid == 0) publish_dq_turn(sem, n_tile);
    }
  }

  __device__ __forceinline__ void from_fragment(int h, int q0, const float (&dq)[K::kDqN / 2]) const {
    const int dq_row0 = (K::kDqSplitM ? cw * 64 : 0) + warp * 16 + lane / 4;
    const int dq_col0 = (K::kDqSplitM ? 0 : cw * K::kDqN) + 2 * quad;
    float* dq_base = ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + seq.row_q + q0) * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = dq_row0 + 8 * r;
      if (q0 + row >= seq.seqlen_q) continue;
#pragma unroll
      for (int i = 0; i < K::kDqN / 8; ++i)
        red_add_v2(dq_base + row * D + dq_col0 + 8 * i, dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
    }
  }

  __device__ __forceinline__ void operator()(int it, int buf, int h, int q0, const float (&dq)[K::kDqN / 2]) const {
    if constexpr (K::kDqTma) {
      to_smem(it, dq);
    } else if constexpr (K::kSplitD) {
      rows_split_d(buf, h, q0, dq);
    } else {
      from_fragment(h, q0, dq);
    }
  }
};

}  // namespace flashattn::cuda::sm90
