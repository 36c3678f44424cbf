// FlashAttention-2 forward on sm_80+ tensor cores (mma.sync m16n8k16).
//
// One CTA owns kBlockM query rows of one (sequence, head); each warp owns
// kBlockM / kWarps of them (with kPairSplit, two warps share 2 * kBlockM /
// kWarps rows: S of half the keys and O of half the head dim each, P and the
// row maxima crossing through shared memory). The CTA walks the K/V tiles its rows can see
// (MaskPolicy::key_begin/key_end), through kStages shared-memory slots filled
// by cp.async (see the pipeline note in the kernel):
//   S = Q K_j^T; mask and softcap (boundary tiles only); online softmax in
//   registers; O += P V_j with P straight from the S registers
// and writes O / l and the logsumexp once at the end.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/layout.h"
#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/launch_env.h"
#include "cuda/common/mma.h"
#include "cuda/common/named_barrier.h"
#include "cuda/common/swizzle.h"
#include "cuda/sm80/fwd/tile_copy.cuh"
#include "cuda/sm80/fwd/tuning.h"
#include "cuda/sm80/fwd/epilogue.cuh"
#include "cuda/sm80/fwd/loads.cuh"
#include "cuda/sm80/fwd/mainloop.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/softmax.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {


// The forward kernel for kernel head dim kD (>= p.head_dim), element type T,
// tile shape Cfg: ForwardTuning<kD> in the library (launch_forward below);
// a benchmark can instantiate others to compare shapes in one process.
template <int kD, typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kWarps * 32, Cfg::kMinBlocksPerSm)
    forward_kernel(const AttentionParams p, int m_blocks) {
  constexpr int kM = Cfg::kBlockM, kN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kThreads = Cfg::kWarps * 32;
  // kPairSplit (tuning.h): two warps share a row block, each holding S for
  // half the keys and O for half the head dim.
  using Pair = PairSplit<Cfg>;
  constexpr int kSplit = Pair::kWarpsPerRows;
  constexpr int kWarpRows = Pair::kWarpRows;
  constexpr int kWarpKeys = kN / kSplit;  // columns of S in this warp
  constexpr int kMT = kWarpRows / 16;     // m16 tiles per warp
  constexpr int kNT = kWarpKeys / 8;      // n8 tiles of S
  constexpr int kDT = kD / kSplit / 8;    // n8 tiles of O
  constexpr int kKQ = kD / 16;            // k16 steps of Q K^T
  constexpr int kKP = kWarpKeys / 16;     // k16 steps of P V per warp's P
  static_assert(kWarpRows % 16 == 0 && kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  static_assert(!(Cfg::kPairSplit && Cfg::kQInRegs), "pair split: Q from shared memory");
  using QTile = SwizzledTile<kM, kD>;
  using KVTile = SwizzledTile<kN, kD>;
  using Mma = MmaType<T>;

    const uint32_t sQ = smem_addr(smem);
  const uint32_t sKV = sQ + QTile::kBytes;  // slot s: K at 2s, V at 2s+1 tiles
  auto sK = [&](int slot) { return sKV + (2 * slot) * KVTile::kBytes; };
  auto sV = [&](int slot) { return sKV + (2 * slot + 1) * KVTile::kBytes; };
  // Pair split only: each warp's P and row maxima (or sums), after the K/V slots.
  const uint32_t sP = sKV + 2 * kStages * KVTile::kBytes;
  float* const s_rows = reinterpret_cast<float*>(smem + (sP - sQ) + Cfg::kWarps * Pair::kPBytes);

  // NOTES: blocks of one (sequence, head) are adjacent in launch order so they
  // share K/V in L2; inside it the last query block goes first, since with a
  // bottom-right mask it sees the most keys (heaviest work first, light tail).
  using K = FwdTraits<kD, Cfg>;
  FwdCta<T> cta;
  cta.template place<K>(p, m_blocks);
  if (cta.past_sequence()) return;
  cta.template plan<K>(p);
  const SequenceInfo seq = cta.seq;
  const MaskPolicy mask = cta.mask;
  const int b = cta.b, h = cta.h, m0 = cta.m0, rows_valid = cta.rows_valid, n_first = cta.n_first, n_tiles = cta.n_tiles;
  const bool varlen = cta.varlen;
  const T* q = cta.q;
  const T* k = cta.k;
  const T* v = cta.v;

  FwdThread th;
  th.place<K>();
  const int tid = th.tid, warp = th.warp, lane = th.lane, g = th.g, t = th.t, half = th.half;
  const int warp_row = th.warp_row, key_off = th.key_off;
  const int d_valid = p.head_dim;         // columns past it are zero-filled

  const QCopy<K> q_copy(tid);
  const KVCopy<K> kv_copy(tid);
  load_first_tiles<K>(q_copy, kv_copy, p, cta, d_valid);

  // Scores go to base 2: exp(scale*s - m) = 2^(s*scale_log2 - m*scale_log2).
  // With a softcap, s -> softcap * tanh(s * scale / softcap) is already scaled.
  const bool softcap = p.softcap > 0.0f;
  const float scale_log2 = softcap ? kLog2e : p.scale * kLog2e;

  FragLanes lanes;
  lanes.build<K>(th);

  float acc[kMT][kDT][4];
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  QFrags<K> q_frag;

  // The four steps of a K/V tile, as lambdas so the two loops below share them:
  //   qk: S = Q K^T for the K tile in `slot`
  //   mask_scores: softcap and the per-element mask (boundary tiles, softcap)
  //   softmax: online softmax over S, P left in pk as 16-bit A fragments
  //   pv: O += P V for the V tile in `slot`
  uint32_t pk[kMT][kKP][4];
  if constexpr (Cfg::kQInRegs) {
    if (n_tiles > 0) {
      cp_async_wait<K::kPending>();  // Q (with K_0) landed
      __syncthreads();
      load_q_frags<K>(q_frag, lanes.q, warp_row);
    }
  }

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = (n_first + j) * kN;
    const int slot = j % kStages;
    await_tile<K>(kv_copy, p, cta, j, d_valid);

    // Two bodies, chosen once per tile: the plain one has no branch between
    // the first mma and the last exp2, so the compiler interleaves freely.
    // NOTES: a runtime `if` around the mask inside one body split it into
    // basic blocks; two bodies measured faster (docs/performance.md).
    Scores<K> s;
    if (needs_mask<K>(p, cta, softcap, n0)) {
      qk<K, T>(s, q_frag, lanes, warp_row, slot);
      mask_scores<K>(s, p, cta, th, softcap, n0 + key_off);
      online_softmax<K, T>(s, row_max, row_sum, acc, pk, scale_log2, th);
    } else {
      qk<K, T>(s, q_frag, lanes, warp_row, slot);
      online_softmax<K, T>(s, row_max, row_sum, acc, pk, scale_log2, th);
    }
    if constexpr (Cfg::kPairSplit) share_p<K>(pk, th);

    await_v<K>(kv_copy, p, cta, j, warp, d_valid);
    pv<K, T>(acc, pk, lanes, th, slot);
  }

  write_out<K>(acc, row_max, row_sum, p, cta, th, q_copy, scale_log2, d_valid);
}

}  // namespace flashattn::cuda::sm80
