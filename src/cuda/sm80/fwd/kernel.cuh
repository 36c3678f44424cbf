// FlashAttention-2 forward on sm_80+ tensor cores (mma.sync m16n8k16),
// assembled from its parts:
//   traits.h       warp layout, fragment counts, shared-memory layout, pipeline (tuning.h)
//   scheduler.cuh  block -> query tile and key-tile range; thread -> its place in the tile
//   loads.cuh      cp.async of Q and of the K/V slots, the pipeline's waits
//   mainloop.cuh   S = Q K^T and O += P V (mma.sync, ldmatrix)
//   softmax.cuh    score modifiers, the mask, online softmax, the pair exchange
//   epilogue.cuh   O / l and the logsumexp out
//   launch.cuh     the launch (host)
//
// One CTA owns kBlockM query rows of one (sequence, head); each warp owns
// kBlockM / kWarps of them (with kPairSplit, two warps share 2 * kBlockM /
// kWarps rows: S of half the keys and O of half the head dim each, P and the
// row maxima crossing through shared memory). The CTA walks the K/V tiles its rows can see
// (MaskPolicy::key_begin/key_end; with a block mask only the listed ones,
// key_walk.cuh), through kStages shared-memory slots filled
// by cp.async (see the pipeline note in traits.h):
//   S = Q K_j^T; mask and softcap (boundary tiles only); online softmax in
//   registers; O += P V_j with P straight from the S registers
// and writes O / l and the logsumexp once at the end.
//
// NOTES: the parts are force-inlined functions that take what they use as
// arguments (or fill a small struct in place) and keep no state between
// calls: the kernel compiles to the same SASS as the one-function kernel it
// was cut from, for every instantiation (cuobjdump -sass, sm_80 and sm_90a).
// The K/V loop stays here: a loop moved into a function of its own (or a
// lambda) changed the machine code in the Hopper backward.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/block_sparse.cuh"
#include "cuda/sm80/dropout.cuh"
#include "cuda/sm80/fwd/epilogue.cuh"
#include "cuda/sm80/fwd/flat_fix.cuh"
#include "cuda/sm80/fwd/key_walk.cuh"
#include "cuda/sm80/fwd/loads.cuh"
#include "cuda/sm80/fwd/mainloop.cuh"
#include "cuda/sm80/fwd/scheduler.cuh"
#include "cuda/sm80/fwd/softmax.cuh"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

// The forward kernel for kernel head dim kD (>= p.head_dim), element type T,
// tile shape Cfg: ForwardTuning<kD> in the library (launch.cuh);
// a benchmark can instantiate others to compare shapes in one process.
// Drop: NoDropout or PhiloxDropout (dropout.cuh), chosen at launch.
// Walk: DenseKeys, or ListedKeys with a block mask (`tiles`, else unread).
template <int kD, typename T, class Cfg, class Drop = NoDropout, class Walk = DenseKeys>
__global__ void __launch_bounds__(Cfg::kWarps * 32, Cfg::kMinBlocksPerSm)
    forward_kernel(const __grid_constant__ AttentionParams p, int m_blocks, const typename Walk::Tiles tiles) {
  using K = FwdTraits<kD, Cfg>;
  constexpr int kMT = K::kMT, kDT = K::kDT, kStages = K::kStages;
  // NOTES: the exit sits between place() and plan() as it did in the
  // one-function kernel; one call that returned false for it moved the
  // operand pointers' arithmetic (different PTX). The head dim is read once
  // here: read from p inside the loads, it was loaded again at each tile.
  FwdCta<T> cta;
  cta.template place<K>(p, m_blocks);
  if (cta.past_sequence()) return;
  cta.template plan<K>(p);
  Walk::template plan<K>(p, tiles, cta);
  FwdThread th;
  th.place<K>();
  const int d_valid = p.head_dim;  // columns past it are zero-filled

  const QCopy<K> q_copy(th.tid);
  const KVCopy<K> kv_copy(th.tid);
  load_first_tiles<K, Walk>(q_copy, kv_copy, p, cta, tiles, d_valid);

  // Scores go to base 2: exp(scale*s - m) = 2^(s*scale_log2 - m*scale_log2).
  // With a softcap, s -> softcap * tanh(s * scale / softcap) is already scaled.
  const bool softcap = p.softcap > 0.0f;
  const float scale_log2 = softcap ? kLog2e : p.scale * kLog2e;

  FragLanes lanes;
  lanes.build<K>(th);

  OAcc<K> acc;
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
  PFrags<K> pk;  // P of the tile as 16-bit A fragments (online_softmax)

  if constexpr (K::kQInRegs) {
    if (cta.n_tiles > 0) {
      cp_async_wait<K::kPending>();  // Q (with K_0) landed
      __syncthreads();
      load_q_frags<K>(q_frag, lanes.q, th.warp_row);
    }
  }

  for (int j = 0; j < cta.n_tiles; ++j) {
    const int n0 = Walk::tile(tiles, cta, j) * K::kN;
    const int slot = j % kStages;
    Walk::template mark_listed<K>(p, tiles, cta, th.tid, j, n0);
    await_tile<K, Walk>(kv_copy, p, cta, tiles, j, d_valid);

    // Two bodies, chosen once per tile: the plain one has no branch between
    // the first mma and the last exp2, so the compiler interleaves freely.
    // NOTES: a runtime `if` around the mask inside one body split it into
    // basic blocks; two bodies measured faster (docs/performance.md).
    // With dropout, both take the tile's keep bits (computed before S is live).
    const auto z =
        Drop::template tile<K>(p.dropout, cta.b * p.heads_q + cta.h, cta.m0 + th.warp_row + th.g, n0 + th.key_off, th.t);
    // NOTES: with the flat fix, V's lane offset is taken as new each tile
    // (the empty asm): ptxas then keeps fewer of its derived addresses across
    // the loop (the d128 kernel spilled 12 bytes without, sm_90a).
    FragLanes tile_lanes = lanes;
    if constexpr (K::kNonfiniteFix == NonfiniteFix::kFlatInline) asm volatile("" : "+r"(tile_lanes.v_own.row_bytes));
    Scores<K> s;
    if (needs_mask<K>(p, cta, softcap, n0) || (Walk::kListed && Walk::partial(tiles, cta, j))) {
      qk<K, T>(s, q_frag, lanes, th.warp_row, slot);
      mask_scores<K>(s, p, cta, th, softcap, n0 + th.key_off);
      if (Walk::kListed && Walk::partial(tiles, cta, j)) Walk::template drop_unlisted<K>(s, th, j);
      online_softmax<K, T>(s, row_max, row_sum, acc, pk, scale_log2, th, z);
    } else {
      qk<K, T>(s, q_frag, lanes, th.warp_row, slot);
      online_softmax<K, T>(s, row_max, row_sum, acc, pk, scale_log2, th, z);
    }
    if constexpr (K::kPairSplit) share_p<K>(pk, th);

    await_v<K, Walk>(kv_copy, p, cta, tiles, j, th.warp, d_valid);
    pv<K, T>(acc, pk, tile_lanes, th, slot);
  }

  uint32_t warp_rows = 0;  // the flat fix's: this warp's rows stored non-finite
  const bool stored_nonfinite =
      write_out<K>(acc, row_max, row_sum, p, cta, th, q_copy, scale_log2, d_valid, &warp_rows);
  if (stored_nonfinite) {  // rare
    if constexpr (K::kNonfiniteFix == NonfiniteFix::kFlatInline) {
      static_assert(std::is_same_v<Drop, NoDropout> && !Walk::kListed, "the flat fix walks the mask's keys only");
      static_assert(!K::kPairSplit && K::kWarpRows <= 32, "a warp's own rows, one bit each");
      fix_nonfinite_flat<K, T>(p, cta, th.warp_row, warp_rows);
    } else {
      fix_nonfinite_tile<K, T>(p, m_blocks, nonfinite::pairs_of<K::kM, K::kN>(tiles));
    }
  }
}

}  // namespace flashattn::cuda::sm80
