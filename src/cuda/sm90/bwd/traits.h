// The Hopper backward's configuration as a type: tile shape, shared-memory
// layout, barrier ids (from tuning.h).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include "cuda/common/mma.h"
#endif

#if defined(__CUDACC__)
#include "cuda/common/mma.h"
#endif

#include "cuda/sm90/bwd/tuning.h"

namespace flashattn::cuda::sm90 {

template <int D, typename T>
struct BwdTraits {
  using Tune = BackwardTuning<D>;
  static constexpr int kHeadDim = D;
  static constexpr int kConsumers = 2;
  // Split-d mode (d 256): both consumers take the same 64 keys and split the
  // work without repeating any of it: S^T and dP^T along the queries (kSN
  // columns each), dK, dV and dQ along d (kDvN columns each: d/2 * 2 regs of
  // dK + dV). P^T and dS^T go through shared memory, where each warpgroup
  // reads the other's half; the wgmmas of dV and dK take them from there.
  static constexpr bool kSplitD = Tune::kSplitD;
  static constexpr int kBlockN = kSplitD ? 64 : 64 * kConsumers;  // keys per CTA
  static constexpr int kDvN = kSplitD ? D / 2 : D;  // dK/dV columns per consumer
  static constexpr int kBlockM = Tune::kBlockM;    // queries per tile
  static constexpr int kSN = kSplitD ? kBlockM / 2 : kBlockM;  // S^T columns per consumer
  static constexpr int kStages = Tune::kStages;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kColBlocks = D / 64;
  static constexpr int kKVBytes = kBlockN * D * 2;
  static constexpr int kQBytes = kBlockM * D * 2;
  // dS^T (and in split-d mode P^T) tiles, double-buffered, shared by both consumers.
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  // A consumer's share of a tile's dQ = dS K: with kDqAlternate all of it
  // (the two in turn); otherwise half, along the queries (kDqSplitRows,
  // kBlockM 128: rows 64 cw ..) or along d (kDqSplitCols, kBlockM 64, split-d:
  // columns cw kDqN ..). Each runs m64 x n kDqN wgmmas.
  static constexpr bool kDqAlternate = Tune::kDqAlternate;
  static constexpr bool kDqSplitRows = kBlockM == 128 && !kDqAlternate;
  static constexpr bool kDqSplitCols = kBlockM == 64 && !kDqAlternate;
  static constexpr int kDqN = kDqSplitCols ? D / 2 : D;
  // m64 row blocks of dQ one consumer computes per tile (kDqAlternate with
  // 128-query tiles: both).
  static constexpr int kDqParts = kDqAlternate ? kBlockM / 64 : 1;
  static constexpr int kKOff = 0;
  static constexpr int kVOff = kKOff + kKVBytes;
  static constexpr int kQOff = kVOff + kKVBytes;
  static constexpr int kDoOff = kQOff + kStages * kQBytes;
  static constexpr int kDsOff = kDoOff + kStages * kQBytes;
  // dQ partial tiles (f32, kBlockM x D) for the TMA reduce-add: D/32 boxes of
  // kBlockM rows x 128 bytes, 128B-swizzled; kDqBufs of them.
  static constexpr bool kDqTma = Tune::kDqTma;
  static constexpr int kDqBufs = kDqTma ? Tune::kDqBufs : 0;
  static constexpr int kDqBytes = kBlockM * D * 4;
  static constexpr int kPOff = kDsOff + 2 * kDsBytes;
  static constexpr int kDqOff = kPOff + (kSplitD ? 2 * kDsBytes : 0);
  static constexpr int kLseOff = kDqOff + kDqBufs * kDqBytes;
  static constexpr int kDOff = kLseOff + kStages * kBlockM * 4;
  static constexpr int kBarOff = kDOff + kStages * kBlockM * 4;
  static constexpr int kNumBars = 1 + 2 * kStages;
  // + 1024: the dynamic shared memory base is rounded up to 1024 bytes in the kernel.
  static constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;
  // full[s] completes on the TMA bytes plus the arrivals of the producer warp's
  // 32 lanes (lane 0 arrives twice: expect_tx, then with its lse/D stores).
  static constexpr uint32_t kFullArrivals = 1 + 32;
  // Named barrier of the 256 consumer threads once both halves of dS^T are
  // stored; kDqAlternate: kDsBarrierOdd for odd query tiles (the warpgroup
  // that computes a tile's dQ waits there, the other arrives and goes on, so
  // two tiles in a row need two barriers).
  static constexpr uint32_t kDsBarrier = 1, kDsBarrierOdd = 7;
  // dQ buffer b: written by the consumers (kDqFull0 + b), drained by the reducer
  // warp (kDqFree0 + b); the consumer threads that stage a tile (both
  // warpgroups, or with kDqAlternate the tile's one) + 32.
  static constexpr uint32_t kDqFull0 = 2, kDqFree0 = 4;
  static constexpr uint32_t kDqBarThreads = 128 * (kDqAlternate ? 1 : kConsumers) + 32;
  // Split-d deterministic mode: the turn warp (dq.cuh, order_dq_turns) lets
  // the 256 consumer threads add a query tile's dQ (kDqTurnReady) and waits
  // for their adds before it publishes them (kDqTurnDone).
  static constexpr uint32_t kDqTurnReady = 6, kDqTurnDone = 8;
  static constexpr uint32_t kDqTurnThreads = 128 * kConsumers + 32;
  static_assert(D % 64 == 0, "head dim must be a multiple of 64 (128-byte swizzle atoms)");
  static_assert(kBlockM == 64 || kBlockM == 128, "S^T is m64 x n kBlockM; dQ is split for 64 or 128");
  static_assert(kDqN == 64 || kDqN == 128, "dQ wgmmas are m64n64 or m64n128 (WgmmaSSTT)");
  static_assert(!kSplitD || (kBlockM == 64 && kDqSplitCols && !Tune::kEarlyDv),
                "split-d: 64 x 64 tiles, dQ split along d, dV issued after the P^T exchange");
  static_assert(kDqBufs <= 2, "two dQ barrier pairs");
  static_assert(!kDqAlternate || (kDqTma && !kSplitD),
                "alternating dQ: whole tiles staged for the TMA reducer");
  static_assert(!kSplitD || kDqTma || (kBlockN == 64 && kDqN == 128),
                "split-d dQ write-out: a warp's 2 KB scratch is its 16 key rows x 4 chunks of P^T and dS^T");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0,
                "tiles must stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "over the 227 KB of shared memory a CTA can have");
  static_assert(128 * (Tune::kProducerRegs + kConsumers * Tune::kConsumerRegs) <= 65536,
                "setmaxnreg budget over the register file");
};

#if defined(__CUDACC__)
// The kernel's dynamic shared memory; its base rounded up to 1024 bytes (the
// 128B-swizzle atom) is smem_raw + smem_align_pad().
// NOTES: each part forms that base itself, in the function that adds tile
// offsets to it. A base passed in as an argument, or returned by a helper,
// had its offsets folded before the base was known: re-associated address
// arithmetic and machine code different from the one-function kernel's.
extern __shared__ uint8_t smem_raw[];
__device__ __forceinline__ uint32_t smem_align_pad() { return (1024 - (smem_addr(smem_raw) & 1023)) & 1023; }
#endif

// Shared memory as the traits lay it out: from the 1024-byte aligned base, K,
// V, the kStages ring of Q and dO, the dS^T (and split-d P^T) buffers, the dQ
// staging buffers, the ring's lse and D rows, then the mbarriers. The parts
// address the tiles from the base and share these pointers.
template <class K>
struct BwdSmem {
  float* lse;         // [kStages][kBlockM]: log2-domain lse of the stage's query rows
  float* d;           // [kStages][kBlockM]: D = rowsum(dO * O) of the same rows
  uint64_t* full_kv;  // K and V of the key tile have landed
  uint64_t* full;     // [kStages]: Q, dO (TMA bytes) and lse, D (the producer warp's arrivals)
  uint64_t* empty;    // [kStages]: every consumer warp is done with the stage
#if defined(__CUDACC__)
  __device__ __forceinline__ BwdSmem() {
    uint8_t* const smem = smem_raw + smem_align_pad();
    lse = reinterpret_cast<float*>(smem + K::kLseOff);
    d = reinterpret_cast<float*>(smem + K::kDOff);
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + K::kBarOff);
    full_kv = bars;
    full = bars + 1;
    empty = full + K::kStages;
  }
#endif
};

// A consumer thread's place in the tile, fixed for the kernel. Keys are the
// M dimension of S^T, dP^T, dV and dK: element e of accumulator n8 tile i
// belongs to key key_r + 8 * (e >> 1) and to query (S^T, dP^T) or column
// (dV, dK) 8i + 2*quad + (e & 1) of this consumer's span.
struct ConsumerThread {
  int cw;       // consumer warpgroup (warpgroup cw + 1)
  int tid;      // thread of the warpgroup
  int warp, lane, quad;
  int key_off;  // this consumer's first key of the tile
  int q_col;    // this consumer's first query of S^T
  int key_r;    // this thread's keys (accumulator rows): key_r and key_r + 8 of the tile
#if defined(__CUDACC__)
  // Split-d: both consumers take the tile's 64 keys and half of its queries;
  // otherwise consumer cw takes keys cw*64 .. cw*64+63 and all queries.
  template <class K>
  __device__ __forceinline__ void place(int cw_) {
    cw = cw_;
    tid = threadIdx.x % 128;
    warp = tid / 32;
    lane = tid % 32;
    quad = lane % 4;
    key_off = K::kSplitD ? 0 : cw * 64;
    q_col = K::kSplitD ? cw * K::kSN : 0;
    key_r = key_off + warp * 16 + lane / 4;
  }
#endif
};

}  // namespace flashattn::cuda::sm90
