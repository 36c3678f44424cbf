// The Hopper forward's configuration as types: the kernel's arguments
// (FwdArgs), its shape and shared-memory layout (FwdTraits), and the carve-up
// of shared memory into Q buffers, the K/V ring, O staging and mbarriers
// (FwdSmem). Everything here is fixed by the tuning type and the two template
// values that change register and shared-memory layout (consumers, keys per tile).
#pragma once

#include <cstdint>

#include "attention/work_plan.h"
#include "cuda/sm90/fwd/api.h"
#include "cuda/sm90/fwd/tuning.h"

namespace flashattn::cuda::sm90 {

struct FwdArgs {
  TileOrder order;    // which query tile each CTA takes in each round (attention/work_plan.h)
  int num_steps;      // steps of a CTA's walk: rounds of whole tiles, or its split-tail segments
  SplitTail tail;     // the split-tail kernel's tiles, cut along the keys (attention/work_plan.h)
  float* part_o;      // split tail: each part's O, max and sum, [tail tile][part][warp] slots
  int* part_count;    // split tail: parts finished per (tail tile, consumer warp); zeroed by the main kernel
  float scale_log2;   // logit_scale * log2(e): exp(x) = exp2(x * log2 e)
  float logit_scale;  // logits = S * logit_scale after the optional tanh
  float softcap_in;   // 0: no softcap; else S -> tanh(S * softcap_in), softcap_in = scale / softcap
  KvPages pages;      // K/V through a block table (api.h); block_table null: dense
};

// Tune: a tuning type (tuning.h's ForwardTuning<D> or a benchmark's own).
// C: consumer warpgroups (Tune::kConsumers, or kCausalConsumers for the causal
// instantiation) and N: keys per K/V tile (kBlockN, or kLongBlockN for the
// long-key instantiation): they change the register split and the
// shared-memory layout, so they are template values. Cache: the K/V source
// is a KV cache (the KV-cache route: per-sequence key counts in
// p.seqused_k, pages in FwdArgs::pages), a kernel of its own so the call
// tensors' kernel keeps its code.
template <class Tune, int C = Tune::kConsumers, int N = Tune::kBlockN, bool Cache = false>
struct FwdTraits {
  static constexpr bool kCache = Cache;
  static constexpr int kHeadDim = Tune::kHeadDim;
  static constexpr int kConsumers = C;  // warpgroups of 64 query rows
  static constexpr int kProducerRegs = sm90::kProducerRegs;
  static constexpr int kConsumerRegs = consumer_regs(C);
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = N;
  static constexpr int kStages = Tune::kStages;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kOBytes = 64 * kHeadDim * 2;  // O staging: 64 rows x D per consumer warpgroup
  static constexpr int kMaxSmem = 232448;            // 227 KB, the most a CTA can have
  // Q buffers, the K/V ring, O staging, mbarriers (2 per Q buffer, 4 per stage)
  // and + 1024: the dynamic shared memory base is rounded up to 1024 bytes in the kernel.
  static constexpr int smem_bytes(int q_stages, bool o_tma) {
    return q_stages * kQBytes + 2 * kStages * kKVBytes + (o_tma ? kConsumers * kOBytes : 0) +
           (2 * q_stages + 4 * kStages) * 8 + 1024;
  }
  // The tuning's second Q buffer and O staging, where they fit (the wide
  // long-key tiles leave room for neither).
  static constexpr int kQStages = Tune::kQStages == 2 && smem_bytes(2, false) <= kMaxSmem ? 2 : 1;
  static constexpr bool kOTma = Tune::kOTma && smem_bytes(kQStages, true) <= kMaxSmem;
  // With two Q buffers a tile's last P V and the next tile's first S share one
  // turn, and the tile's epilogue runs under that S.
  static constexpr bool kCrossTile = kQStages == 2;
  // The producer requests the next tile's Q after the current tile's first
  // kStages - 1 K/V tiles (two Q buffers: producer.cuh says why that never
  // waits), else after all of them.
  static constexpr int kQLead = kQStages == 2 ? kStages - 1 : 1 << 30;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQStages * kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKVBytes;
  static constexpr int kOOff = kVOff + kStages * kKVBytes;
  static constexpr int kBarOff = kOOff + (kOTma ? kConsumers * kOBytes : 0);
  static constexpr int kNumBars = 2 * kQStages + 4 * kStages;
  static constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;
  static_assert(kSmemBytes == smem_bytes(kQStages, kOTma), "smem_bytes must follow the layout above");
  static_assert(kHeadDim % 64 == 0, "head dim must be a multiple of 64 (128-byte swizzle atoms)");
  static_assert(kBlockN % 16 == 0, "kBlockN is the K of P V: a multiple of 16");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles must stay 1024-byte aligned");
  static_assert(kSmemBytes <= kMaxSmem, "over the 227 KB of shared memory a CTA can have");
  static_assert(kBlockM <= 256, "a TMA box has at most 256 rows");
  static_assert(kQStages == 1 || kQStages == 2, "one Q buffer, or two (next tile's Q prefetched)");
  static_assert(kStages >= 2, "the producer's early Q needs a K/V ring of at least two stages");
  // setmaxnreg only moves registers the CTA got at launch (65536 / kThreads,
  // rounded down to 8, per thread): a consumer asking for more than the
  // producer gave up waits forever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs,
                "setmaxnreg budget over the registers the CTA launches with");
  // Barrier ids for the ping-pong (0 is __syncthreads): consumer c waits on
  // kTurnBarrier0 + c, which consumer c-1 (mod kConsumers) arrives on.
  static constexpr uint32_t kTurnBarrier0 = 1;
  // Consumer c's 128 threads meet on kOBarrier0 + c around its O staging.
  static constexpr uint32_t kOBarrier0 = kTurnBarrier0 + kConsumers;
  static_assert(kOBarrier0 + kConsumers <= 16, "16 hardware barriers");
  static constexpr uint32_t kConsumerWarps = 4 * kConsumers;

  // The K/V ring stage of the i-th key tile walked, and its phase parity.
  static constexpr int ring_stage(int i) { return i % kStages; }
  static constexpr uint32_t ring_phase(int i) { return static_cast<uint32_t>(i / kStages) & 1; }
};

// Shared memory as the traits lay it out: a tile of R rows x d columns is d/64
// column blocks of R rows x 128 bytes (1024-byte aligned, 128B-swizzled as TMA
// writes it and wgmma's SW128 descriptors read it). Full/empty mbarriers per Q
// buffer and per ring stage; K and V have their own (S needs K before P V needs V).
template <class K, typename T>
struct FwdSmem {
  uint8_t* base;
  T* q;
  T* k;
  T* v;
  uint64_t* full_q;  // [kQStages]
  uint64_t* empty_q;
  uint64_t* full_k;  // [kStages]
  uint64_t* empty_k;
  uint64_t* full_v;
  uint64_t* empty_v;
#if defined(__CUDACC__)
  __device__ __forceinline__ explicit FwdSmem(uint8_t* aligned) : base(aligned) {
    q = reinterpret_cast<T*>(base + K::kQOff);
    k = reinterpret_cast<T*>(base + K::kKOff);
    v = reinterpret_cast<T*>(base + K::kVOff);
    uint64_t* bars = reinterpret_cast<uint64_t*>(base + K::kBarOff);
    full_q = bars;
    empty_q = bars + K::kQStages;
    full_k = bars + 2 * K::kQStages;
    empty_k = full_k + K::kStages;
    full_v = empty_k + K::kStages;
    empty_v = full_v + K::kStages;
  }
  // Consumer warpgroup cw's O staging buffer (kOTma).
  __device__ __forceinline__ uint8_t* o_staging(int cw) const { return base + K::kOOff + cw * K::kOBytes; }
#endif
};

}  // namespace flashattn::cuda::sm90
