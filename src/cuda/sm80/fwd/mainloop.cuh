// The sm80 forward's tensor-core steps on one K/V tile (mma.sync m16n8k16):
//   S = Q K_j^T     A = Q (shared memory or registers), B = K (ldmatrix)
//   O += P V_j      A = P straight from the S registers (C layout == A layout),
//                   B = V (ldmatrix.trans); with the pair split, then the
//                   partner warp's P (its keys) from shared memory
#pragma once

#include "cuda/common/mma.h"
#include "cuda/common/swizzle.h"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

// ldmatrix.x4 row addresses (a lane's part of them), fixed for the kernel.
// Q and V: matrix i = lane / 8 covers rows 8*(i%2)..+7 and chunk i/2 of a
// 16x16 block; Q gets the A fragment in order, V (keys x d, transposed) b0, b1
// of d-tile 0, then of d-tile 1. K (keys x d): matrix i covers keys
// 8*(i/2)..+7 and chunk i%2, so the registers are b0, b1 of n-tile 0, then of
// n-tile 1.
// NOTES: mma.sync takes its B operand as a pair of consecutive registers. With
// the Q pattern for K the pairs came out as (r0, r2), (r1, r3), and ptxas
// spent ~1.3 MOVs per mma re-pairing them (and registers to hold the copies).
struct FragLanes {
  SwizzleLane q;        // Q's A fragments (and, by the shared swizzle, any 16-row block)
  SwizzleLane k;        // K rows from this warp's first key
  SwizzleLane v_own;    // V rows from this warp's first key, columns from its first O column
  SwizzleLane v_other;  // the same from the partner's first key (pair split)

  // The K and V offsets are multiples of 8 rows and of whole 8-chunk blocks,
  // so they fold into the lane's base (the swizzle depends on row % 8 and
  // chunk % 8 only).
  template <class K>
  __device__ __forceinline__ void build(const FwdThread& th) {
    using KVTile = typename K::KVTile;
    const int lane = th.lane;
    q = K::QTile::lane(lane & 15, lane >> 4);
    k = KVTile::lane(((lane & 7) | ((lane >> 4) << 3)) + th.key_off, (lane >> 3) & 1);
    v_own = v_lane_at<K>(th, th.key_off);
    v_other = v_lane_at<K>(th, K::kWarpKeys - th.key_off);
  }
  template <class K>
  __device__ __forceinline__ static SwizzleLane v_lane_at(const FwdThread& th, int key0) {
    using KVTile = typename K::KVTile;
    auto l = KVTile::lane((th.lane & 15) + key0, th.lane >> 4);
    l.row_bytes += th.half * (K::kDT / KVTile::kAtom) * KVTile::kRows * KVTile::kAtom * 16;
    return l;
  }
};

template <class K>
using Scores = float[K::kMT][K::kNT][4];
template <class K>
using QFrags = uint32_t[K::kQInRegs ? K::kMT : 1][K::kQInRegs ? K::kKQ : 1][4];
template <class K>
using PFrags = uint32_t[K::kMT][K::kKP][4];
template <class K>
using OAcc = float[K::kMT][K::kDT][4];

// Q's A fragments into registers (kQInRegs), once Q has landed.
template <class K>
__device__ __forceinline__ void load_q_frags(QFrags<K>& q_frag, const SwizzleLane& q_lane, int warp_row) {
  const uint32_t sQ = smem_q();
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int kk = 0; kk < K::kKQ; ++kk)
      ldmatrix_x4(q_frag[mt][kk], sQ + K::QTile::at(q_lane, warp_row + mt * 16, kk * 2));
}

// S = Q K^T for the K tile in `slot`.
template <class K, typename T>
__device__ __forceinline__ void qk(Scores<K>& s, const QFrags<K>& q_frag, const FragLanes& lanes, int warp_row,
                                   int slot) {
  const uint32_t sQ = smem_q();
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < K::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < K::kKQ; ++kk) {
    uint32_t a[K::kMT][4];
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt) {
      if constexpr (K::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][kk][e];
      } else {
        ldmatrix_x4(a[mt], sQ + K::QTile::at(lanes.q, warp_row + mt * 16, kk * 2));
      }
    }
#pragma unroll
    for (int np = 0; np < K::kNT / 2; ++np) {
      uint32_t bk[4];
      ldmatrix_x4(bk, smem_k<K>(slot) + K::KVTile::at(lanes.k, np * 16, kk * 2));
#pragma unroll
      for (int mt = 0; mt < K::kMT; ++mt) {
        mma_m16n8k16<T>(s[mt][2 * np], a[mt], bk[0], bk[1]);
        mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
      }
    }
  }
}

// Pair split: this warp's P to shared memory, as rows of kWarpKeys 16-bit
// values (stride Pair::kPRowBytes: A-fragment stores and ldmatrix reads
// are both conflict-free), for the partner's P V.
template <class K>
__device__ __forceinline__ void share_p(const PFrags<K>& pk, const FwdThread& th) {
  using Pair = typename K::Pair;
  const uint32_t base = smem_q() + K::kPOff + th.warp * Pair::kPBytes + th.g * Pair::kPRowBytes + 4 * th.t;
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
    for (int kk = 0; kk < K::kKP; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st_shared_b32(base + (mt * 16 + (e & 1) * 8) * Pair::kPRowBytes + (kk * 16 + (e >> 1) * 8) * 2,
                      pk[mt][kk][e]);
}

// O += P V for the V tile in `slot`, P's keys from v_lane's first key.
template <class K, typename T>
__device__ __forceinline__ void pv_keys(OAcc<K>& acc, int slot, const SwizzleLane& v_lane, const PFrags<K>& a) {
#pragma unroll
  for (int kk = 0; kk < K::kKP; ++kk) {
#pragma unroll
    for (int dp = 0; dp < K::kDT / 2; ++dp) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, smem_v<K>(slot) + K::KVTile::at(v_lane, kk * 16, dp * 2));
#pragma unroll
      for (int mt = 0; mt < K::kMT; ++mt) {
        mma_m16n8k16<T>(acc[mt][2 * dp], a[mt][kk], bv[0], bv[1]);
        mma_m16n8k16<T>(acc[mt][2 * dp + 1], a[mt][kk], bv[2], bv[3]);
      }
    }
  }
}

// O += P V_j, P straight from the S accumulators (C layout == A layout);
// with the pair split, then the partner's P (its keys) from shared memory.
template <class K, typename T>
__device__ __forceinline__ void pv(OAcc<K>& acc, const PFrags<K>& pk, const FragLanes& lanes, const FwdThread& th,
                                   int slot) {
  using Pair = typename K::Pair;
  pv_keys<K, T>(acc, slot, lanes.v_own, pk);
  if constexpr (K::kPairSplit) {
    uint32_t other[K::kMT][K::kKP][4];
    const uint32_t base =
        smem_q() + K::kPOff + (th.warp ^ 1) * Pair::kPBytes + (th.lane & 15) * Pair::kPRowBytes + (th.lane >> 4) * 16;
#pragma unroll
    for (int mt = 0; mt < K::kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < K::kKP; ++kk)
        ldmatrix_x4(other[mt][kk], base + mt * 16 * Pair::kPRowBytes + kk * 32);
    pv_keys<K, T>(acc, slot, lanes.v_other, other);
  }
}

}  // namespace flashattn::cuda::sm80
