// The Hopper backward's shared memory as BwdTraits lays it out: K and V of the
// key tile, the Q / dO ring with its lse and D rows, dS^T (and split-d P^T)
// double buffers, dQ partial tiles, and the mbarriers.
#pragma once

#include <cstdint>

#include "cuda/sm90/bwd/traits.h"

namespace flashattn::cuda::sm90 {

template <class K>
struct BwdSmem {
  uint8_t* base;
  float* lse;         // [kStages][kBlockM], log2 domain
  float* d;           // [kStages][kBlockM], D = rowsum(dO * O)
  uint64_t* full_kv;  // K and V landed
  uint64_t* full;     // [kStages]: Q, dO, lse, D of a query tile landed
  uint64_t* empty;    // [kStages]: the consumers are done with them
#if defined(__CUDACC__)
  __device__ __forceinline__ explicit BwdSmem(uint8_t* aligned) : base(aligned) {
    lse = reinterpret_cast<float*>(base + K::kLseOff);
    d = reinterpret_cast<float*>(base + K::kDOff);
    uint64_t* bars = reinterpret_cast<uint64_t*>(base + K::kBarOff);
    full_kv = bars;
    full = bars + 1;
    empty = full + K::kStages;
  }
#endif
};

}  // namespace flashattn::cuda::sm90
