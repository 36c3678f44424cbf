// The sm80 forward's configuration as a type: the warp layout and fragment
// counts of a tile shape (tuning.h), the shared-memory layout and the cp.async
// pipeline it implies.
#pragma once

#include <cstdint>

#include "cuda/common/mma.h"
#include "cuda/common/named_barrier.h"
#include "cuda/common/swizzle.h"
#include "cuda/sm80/fwd/tuning.h"

namespace flashattn::cuda::sm80 {

// kD: the kernel's head dim (>= p.head_dim); Cfg: a tile shape (tuning.h's
// ForwardTuning<kD> or a benchmark's own).
template <int kD, class Cfg>
struct FwdTraits {
  using Tune = Cfg;
  static constexpr int kHeadDim = kD;
  static constexpr int kM = Cfg::kBlockM, kN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kThreads = kWarps * 32;
  // kPairSplit (tuning.h): two warps share a row block, each holding S for
  // half the keys and O for half the head dim.
  using Pair = PairSplit<Cfg>;
  static constexpr bool kPairSplit = Cfg::kPairSplit;
  static constexpr NonfiniteFix kNonfiniteFix = Cfg::kNonfiniteFix;  // tuning.h
  static constexpr bool kQInRegs = Cfg::kQInRegs;
  static constexpr int kSplit = Pair::kWarpsPerRows;
  static constexpr int kWarpRows = Pair::kWarpRows;
  static constexpr int kWarpKeys = kN / kSplit;  // columns of S in this warp
  static constexpr int kMT = kWarpRows / 16;     // m16 tiles per warp
  static constexpr int kNT = kWarpKeys / 8;      // n8 tiles of S
  static constexpr int kDT = kD / kSplit / 8;    // n8 tiles of O
  static constexpr int kKQ = kD / 16;            // k16 steps of Q K^T
  static constexpr int kKP = kWarpKeys / 16;     // k16 steps of P V per warp's P
  static_assert(kWarpRows % 16 == 0 && kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  static_assert(!(Cfg::kPairSplit && Cfg::kQInRegs), "pair split: Q from shared memory");
  using QTile = SwizzledTile<kM, kD>;
  using KVTile = SwizzledTile<kN, kD>;
  static_assert(QTile::kAtom == KVTile::kAtom, "Q and K/V tiles share the swizzle");
  static_assert(!Cfg::kPairSplit || kDT % KVTile::kAtom == 0, "pair split: O halves of whole swizzle blocks");

  // Shared memory: Q (also O's staging in the epilogue), then kStages K/V
  // slots (slot s: K at tile 2s, V at tile 2s + 1), then, with the pair split
  // only, each warp's P and a float per row of each warp (row maxima or sums).
  static constexpr uint32_t kKVOff = QTile::kBytes;
  static constexpr uint32_t kPOff = kKVOff + 2 * kStages * KVTile::kBytes;
  static constexpr uint32_t kRowsOff = kPOff + kWarps * Pair::kPBytes;

  // Two pipelines (cp.async groups are committed even when empty, so the wait
  // counts stay the same on every tile):
  //  kStages == 1: K and V in separate groups; V_j loads during Q K_j^T and
  //    K_{j+1} during P V_j; two barriers per tile (FlashAttention-2's scheme,
  //    least shared memory).
  //  kStages >= 2: K_j and V_j in one group, kStages - 1 tiles ahead; one
  //    barrier per tile.
  static constexpr bool kSplitKV = kStages == 1;
  static constexpr int kPending = kSplitKV ? 0 : kStages - 2;  // groups allowed in flight at a wait

  // Not at kNT >= 16 (d64's 128-key S): ptxas then spilled 8 bytes in the K/V loop.
  static constexpr bool kFastOStaging = kFastStores && kNT < 16;
};

#if defined(__CUDACC__)
// The kernel's dynamic shared memory, laid out as FwdTraits says.
// NOTES: each part forms its shared-memory addresses from this symbol, in
// the function that adds the tile offsets, as the Hopper backward does (there
// a base passed in as an argument re-associated the address arithmetic and
// changed the machine code; see sm90/bwd/traits.h).
extern __shared__ __align__(128) uint8_t smem[];

__device__ __forceinline__ uint32_t smem_q() {
  return smem_addr(smem);
}
// K and V of slot `slot`.
template <class K>
__device__ __forceinline__ uint32_t smem_k(int slot) {
  return smem_addr(smem) + K::kKVOff + (2 * slot) * K::KVTile::kBytes;
}
template <class K>
__device__ __forceinline__ uint32_t smem_v(int slot) {
  return smem_addr(smem) + K::kKVOff + (2 * slot + 1) * K::KVTile::kBytes;
}

// Named barrier 1 + pair for the two warps of a pair (pair split).
__device__ __forceinline__ void pair_sync(int pair) { named_sync(1 + pair, 64); }
#endif

}  // namespace flashattn::cuda::sm80
