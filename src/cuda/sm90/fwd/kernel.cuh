// The Hopper forward kernel (FlashAttention-3's structure, our implementation).
//
// One persistent CTA per SM walks query tiles (kBlockM = 64 * kConsumers rows
// of one head of one sequence). Warpgroup 0 is the producer: one thread issues
// TMA loads of Q and of K/V tiles into a kStages-deep ring (full/empty
// mbarriers per stage; K and V have separate barriers because S = Q K^T needs
// K before P V needs V). Warpgroups 1..kConsumers are consumers, 64 query rows
// each, taking turns to issue their GEMMs (ping-pong): S = Q K^T with wgmma
// from shared memory, online softmax in registers (masking with the shared
// MaskPolicy, softcap), O += P V with wgmma taking P from registers. With two
// Q buffers a tile's last P V and the next tile's first S share one turn and
// the epilogue runs under that S (kCrossTile): the next tile starts primed.
// The epilogue normalizes O and stores it through shared memory with TMA where
// the tuning has room for that (kOTma; TMA clips rows past the sequence), or
// straight from registers (varlen, and d = 192 / 256: rows past the sequence
// are never written, which keeps variable-length batches safe), and writes
// the logsumexp.
//
// Head dims below D (any multiple of 8 up to D) run on the kernel of D: the
// tensor maps have the real head dim as their inner extent, so TMA zero-fills
// columns d..D-1 of every Q/K/V tile. S = Q K^T then sums zeros over them
// (exact), O's columns past d are P times zeros and are never stored, and the
// softmax scale comes from params (1/sqrt(real d) by default).
//
// Shared memory (1024-byte aligned, 128B-swizzled as TMA writes it and wgmma's
// SW128 descriptors read it): a tile of R rows x d columns is d/64 column blocks
// of R rows x 128 bytes.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/layout.h"
#include "attention/mask.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/mma.h"
#include "cuda/sm90/arch.h"
#include "cuda/sm90/fwd/launch.h"
#include "cuda/sm90/fwd/schedule.h"
#include "cuda/sm90/fwd/tma_store.h"
#include "cuda/sm90/fwd/trace.h"
#include "cuda/sm90/fwd/tuning.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"
#include "cuda/sm90/wgmma.h"

namespace flashattn::cuda::sm90 {

struct FwdArgs {
  TileOrder order;    // which query tile each CTA takes in each round (schedule.h)
  int num_steps;      // steps of a CTA's walk: rounds of whole tiles, or its split-tail segments
  SplitTail tail;     // the split-tail kernel's tiles, cut along the keys (schedule.h)
  float* part_o;      // split tail: each part's O, max and sum, [tail tile][part][warp] slots
  int* part_count;    // split tail: parts finished per (tail tile, consumer warp); zeroed by the main kernel
  float scale_log2;   // logit_scale * log2(e): exp(x) = exp2(x * log2 e)
  float logit_scale;  // logits = S * logit_scale after the optional tanh
  float softcap_in;   // 0: no softcap; else S -> tanh(S * softcap_in), softcap_in = scale / softcap
};

// C: consumer warpgroups (the tuning's kConsumers, or kCausalConsumers for the
// causal instantiation) and N: keys per K/V tile (kBlockN, or kLongBlockN for
// the long-key instantiation); the only template parameters besides head dim
// and dtype, because they change the register split and the shared-memory
// layout.
template <int D, typename T, int C = ForwardTuning<D>::kConsumers, int N = ForwardTuning<D>::kBlockN>
struct FwdTraits {
  using Tune = ForwardTuning<D>;
  static constexpr int kConsumers = C;  // warpgroups of 64 query rows
  static constexpr int kProducerRegs = sm90::kProducerRegs;
  static constexpr int kConsumerRegs = consumer_regs(C);
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = N;
  static constexpr int kStages = Tune::kStages;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kColBlocks = D / 64;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  static constexpr int kOBytes = 64 * D * 2;  // O staging: 64 rows x D per consumer warpgroup
  static constexpr int kMaxSmem = 232448;     // 227 KB, the most a CTA can have
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
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQStages * kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKVBytes;
  static constexpr int kOOff = kVOff + kStages * kKVBytes;
  static constexpr int kBarOff = kOOff + (kOTma ? kConsumers * kOBytes : 0);
  static constexpr int kNumBars = 2 * kQStages + 4 * kStages;
  static constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;
  static_assert(kSmemBytes == smem_bytes(kQStages, kOTma), "smem_bytes must follow the layout above");
  static_assert(D % 64 == 0, "head dim must be a multiple of 64 (128-byte swizzle atoms)");
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
};

// What one tile of the persistent walk covers. Producer and consumers compute
// it identically, so they agree on which tiles carry loads.
struct TileWork {
  SequenceInfo seq;
  int b, h, m0;
  int n_begin, n_end;  // K/V tile range [n_begin, n_end), walked from n_end - 1 down
  bool valid;          // a query tile (mb >= 0) with m0 < seqlen_q of this sequence
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileWork tile_work(const AttentionParams& p, const FwdArgs& a, int t) {
  TileWork w;
  int bh, mb;
  tile_of_rank(a.order, p.batch * p.heads_q, t, bh, mb);
  w.b = bh / p.heads_q;
  w.h = bh - w.b * p.heads_q;
  w.seq = sequence_info(p, w.b);
  w.m0 = mb * kBlockM;
  w.valid = mb >= 0 && w.m0 < w.seq.seqlen_q;
  w.n_begin = w.n_end = 0;
  if (w.valid) {
    const MaskPolicy mask = mask_for(p, w.seq);
    const int rows_end = min(w.m0 + kBlockM, w.seq.seqlen_q);
    const int kb = mask.key_begin(w.m0), ke = mask.key_end(rows_end);
    w.n_begin = kb / kBlockN;
    w.n_end = ke > kb ? (ke + kBlockN - 1) / kBlockN : w.n_begin;
  }
  return w;
}

// Step `step` of this CTA's walk: in the main kernel round `step` of whole
// tiles; in the split-tail kernel (kSplit) its segment `step` of the tail, a
// key range of a tail tile (seg). false: no tile at this step. Producer and
// consumers walk the same steps.
template <int kBlockM, int kBlockN, bool kSplit>
__device__ __forceinline__ bool work_at(const AttentionParams& p, const FwdArgs& a, int step, TileWork& w,
                                        SplitSegment& seg) {
  if constexpr (kSplit) {
    if (!split_segment(a.tail, gridDim.x, blockIdx.x, step, seg)) return false;
    w = tile_work<kBlockM, kBlockN>(p, a, a.tail.first_rank + seg.tile);
    w.n_end = min(w.n_end, w.n_begin + seg.key_hi);
    w.n_begin += seg.key_lo;
    return true;
  } else {
    const int t = rank_of(a.order, step, gridDim.x, blockIdx.x);
    if (t >= a.order.num_ranks) return false;
    w = tile_work<kBlockM, kBlockN>(p, a, t);
    return true;
  }
}

// tanh(x) = 1 - 2 / (2^(2x log2 e) + 1): one ex2 and one fast reciprocal, no
// branch. libm's tanhf branches on |x|: the softcap pass was 1026 SASS
// instructions per d128 key tile (385 now) and the kernel's register peak.
// +-inf -> +-1, NaN stays NaN, absolute error ~1e-7.
__device__ __forceinline__ float fast_tanh(float x) {
  return 1.0f - __fdividef(2.0f, fast_exp2(x * (2.0f * kLog2e)) + 1.0f);
}

// P's exponentials in online_softmax: exp2(x, i) for element i of s. The
// default is cuda::fast_exp2 (common/mma.h), one MUFU.EX2 that ignores i:
// exp2f adds a range check and a rescale per element for denormal results,
// ~4 extra instructions on the softmax's critical path; this flushes them to
// 0, and 2^-inf = 0. bench/sm90_softmax_beside_wgmma.cu passes a policy that
// moves some of them off the MUFU.
struct MufuExp2 {
  __device__ __forceinline__ float operator()(float x, int) const { return fast_exp2(x); }
};

// One online-softmax step on a warpgroup's S fragment (2 rows per thread):
// new row max, correction factor for the old O and l, P = exp(S - max) in place.
// NOTES: the row max and row sum are reduced through kAcc independent partials
// and both rows' shuffles are issued together: as one chain per row they were
// 32 dependent FMNMX (and FADD) per row, which ptxas kept in order (fmax and
// float adds are not reassociated), the first exponential of the tile waiting
// behind the whole max chain of row 0.
template <int kN, typename Exp2 = MufuExp2>
__device__ __forceinline__ void online_softmax(float (&s)[kN], float (&m)[2], float (&l)[2],
                                               float (&corr)[2], float scale_log2, Exp2 exp2 = {}) {
  constexpr int kPairs = kN / 4;  // (element pairs per row)
  constexpr int kAcc = kPairs % 4 == 0 ? 4 : (kPairs % 2 == 0 ? 2 : 1);
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float part[kAcc];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) part[a] = fmaxf(s[4 * a + 2 * r], s[4 * a + 2 * r + 1]);
#pragma unroll
    for (int i = kAcc; i < kPairs; ++i)
      part[i % kAcc] = fmaxf(part[i % kAcc], fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    // m_new = max(m, rowmax(S)) (this thread's quarter of the row, then the quad)
    mx[r] = m[r];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) mx[r] = fmaxf(mx[r], part[a]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // A row that has seen no visible key keeps max -inf: subtract 0 instead so
    // exp2(-inf - 0) = 0 rather than NaN.
    const float ms = mx[r] == -INFINITY ? 0.0f : mx[r] * scale_log2;
    corr[r] = fast_exp2(m[r] * scale_log2 - ms);  // exp(m_old - m_new)
    m[r] = mx[r];
    float sum[kAcc];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) sum[a] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // P = exp2(S * scale * log2 e - m_new * scale * log2 e)
        const float v = exp2(fmaf(s[4 * i + 2 * r + e], scale_log2, -ms), 4 * i + 2 * r + e);
        s[4 * i + 2 * r + e] = v;
        sum[i % kAcc] += v;
      }
    }
    float total = 0.0f;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) total += sum[a];
    // l_new = l * exp(m_old - m_new) + rowsum(P); per-thread partial sums, the
    // quad reduction happens once, in the epilogue.
    l[r] = l[r] * corr[r] + total;
  }
}

// 4x4 transpose of 32-bit values across the 4 lanes of a quad (t = lane % 4):
// on entry v[c] is element (t, c), on exit element (c, t). Two butterfly
// stages: across lane bit 0 the lanes swap the slots whose bit 0 differs from
// theirs, then the same across bit 1. Every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int lane) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = (lane & bit) != 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (c & bit) continue;  // the pair (c, c | bit)
      const uint32_t recv = __shfl_xor_sync(0xffffffff, upper ? v[c] : v[c | bit], bit);
      if (upper) {
        v[c] = recv;
      } else {
        v[c | bit] = recv;
      }
    }
  }
}

// Split tail (schedule.h): this warp's part of a tail tile (its 16 rows'
// unnormalized O, row max and row sum) goes to the part's slot; the warp that
// completes the tile's last part merges every part, in part order (so the
// result does not depend on which finished last), into o, m, l:
//   m = max_j m_j;  O = sum_j O_j 2^((m_j - m) scale_log2);  l likewise,
// and returns true. The others return false: their rows are not theirs to store.
// Slots: [tail tile][part][consumer warp][float4 i][lane], O then (m0, m1, l0, l1).
template <int D>
__device__ __forceinline__ bool merge_split_part(const FwdArgs& a, const SplitSegment& seg, int warp_slot,
                                                 int num_warps, int lane, float (&o)[D / 2],
                                                 float (&m)[2], float (&l)[2]) {
  constexpr int kVecs = D / 8;  // float4s of O per thread; the (m, l) one follows
  auto slot = [&](int part) {
    const size_t s = (static_cast<size_t>(seg.tile) * a.tail.max_parts + part) * num_warps + warp_slot;
    return reinterpret_cast<float4*>(a.part_o) + s * (kVecs + 1) * 32 + lane;
  };
  float4* mine = slot(seg.part);
#pragma unroll
  for (int i = 0; i < kVecs; ++i)
    __stcg(mine + i * 32, make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]));
  __stcg(mine + kVecs * 32, make_float4(m[0], m[1], l[0], l[1]));
  __threadfence();  // this part's slot is visible before the count says so
  __syncwarp();
  int finished = 0;
  if (lane == 0) {
    // The counters were zeroed by the main kernel: wait until it has completed
    // (a no-op without a programmatic launch, or once it has).
    grid_dependency_wait();
    finished = atomicAdd(&a.part_count[seg.tile * num_warps + warp_slot], 1);
  }
  finished = __shfl_sync(0xffffffff, finished, 0);
  if (finished != seg.parts - 1) return false;
  __threadfence();
  float mt[2] = {-INFINITY, -INFINITY};
  for (int j = 0; j < seg.parts; ++j) {
    const float4 ml = __ldcg(slot(j) + kVecs * 32);
    mt[0] = fmaxf(mt[0], ml.x);
    mt[1] = fmaxf(mt[1], ml.y);
  }
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  l[0] = l[1] = 0.0f;
  for (int j = 0; j < seg.parts; ++j) {
    const float4* src = slot(j);
    const float4 ml = __ldcg(src + kVecs * 32);
    // A part whose rows saw no key (max -inf) adds nothing.
    const float f0 = ml.x == -INFINITY ? 0.0f : fast_exp2((ml.x - mt[0]) * a.scale_log2);
    const float f1 = ml.y == -INFINITY ? 0.0f : fast_exp2((ml.y - mt[1]) * a.scale_log2);
    l[0] += ml.z * f0;
    l[1] += ml.w * f1;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const float4 v = __ldcg(src + i * 32);
      o[4 * i] += v.x * f0;
      o[4 * i + 1] += v.y * f0;
      o[4 * i + 2] += v.z * f1;
      o[4 * i + 3] += v.w * f1;
    }
  }
  m[0] = mt[0];
  m[1] = mt[1];
  return true;
}

template <int D, typename T, int C, int N, bool kSplit>
__global__ void __launch_bounds__(FwdTraits<D, T, C, N>::kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap tma_q,
                   const __grid_constant__ CUtensorMap tma_k,
                   const __grid_constant__ CUtensorMap tma_v,
                   const __grid_constant__ CUtensorMap tma_o,
                   const __grid_constant__ AttentionParams p, const FwdArgs a) {
#if FLASHATTN_SM90_DEVICE
  using K = FwdTraits<D, T, C, N>;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem + K::kQOff);
  T* sK = reinterpret_cast<T*>(smem + K::kKOff);
  T* sV = reinterpret_cast<T*>(smem + K::kVOff);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + K::kBarOff);
  uint64_t* full_q = bars;  // [kQStages]
  uint64_t* empty_q = bars + K::kQStages;
  uint64_t* full_k = bars + 2 * K::kQStages;
  uint64_t* empty_k = full_k + kStages;
  uint64_t* full_v = empty_k + kStages;
  uint64_t* empty_v = full_v + kStages;
  constexpr uint32_t kConsumerWarps = 4 * K::kConsumers;
  // The K/V ring stage of the i-th key tile walked, and its phase parity.
  auto ring_stage = [](int i) { return i % kStages; };
  auto ring_phase = [](int i) { return static_cast<uint32_t>(i / kStages) & 1; };

  const int wg = warpgroup_index();
  if constexpr (!kSplit) {
    // The split-tail kernel that may follow (launch_kernel) starts as this
    // grid's CTAs exit; its merges wait for this grid before they count parts.
    if (blockIdx.x == 0 && a.part_count != nullptr) {
      for (int i = threadIdx.x; i < a.tail.tiles * 4 * K::kConsumers; i += blockDim.x) a.part_count[i] = 0;
    }
    grid_launch_dependents();
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < K::kQStages; ++s) {
      mbar_init(&full_q[s], 1);
      mbar_init(&empty_q[s], kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty_k[s], kConsumerWarps);
      mbar_init(&empty_v[s], kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<K::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tma_q);
      tma_prefetch_map(&tma_k);
      tma_prefetch_map(&tma_v);
      const bool varlen = p.is_varlen();
      const int group = p.heads_q / p.heads_kv;
      int qt = 0;  // tiles with loads so far: Q buffer qt % kQStages
      int it = 0;
      // What a tile's loads need, and no more (the producer runs on kProducerRegs registers).
      struct Loads {
        int row_q, row_k0, h, bq, n_begin, n_end;
      };
      // The next tile of this CTA's walk that has loads, from step `step` on
      // (the consumers skip the same tiles: invalid, or no visible key).
      auto next_tile = [&](int& step, Loads& l) {
        for (; step < a.num_steps; ++step) {
          TileWork w;
          SplitSegment seg;
          if (!work_at<kBlockM, kBlockN, kSplit>(p, a, step, w, seg)) continue;
          if (!w.valid || w.n_end <= w.n_begin) continue;
          l.row_q = (varlen ? static_cast<int>(w.seq.row_q) : 0) + w.m0;
          l.row_k0 = varlen ? static_cast<int>(w.seq.row_k) : 0;
          l.h = w.h;
          l.bq = varlen ? 0 : w.b;
          l.n_begin = w.n_begin;
          l.n_end = w.n_end;
          return true;
        }
        return false;
      };
      auto issue_q = [&](const Loads& l) {
        const int qs = qt % K::kQStages;
        const uint32_t q_phase = (qt / K::kQStages) & 1;
        ++qt;
        mbar_wait(&empty_q[qs], q_phase ^ 1);
        mbar_arrive_expect_tx(&full_q[qs], K::kQBytes);
#pragma unroll
        for (int c = 0; c < K::kColBlocks; ++c)
          tma_load_4d(sQ + (qs * K::kColBlocks + c) * kBlockM * 64, &tma_q, &full_q[qs], c * 64,
                      l.row_q, l.h, l.bq);
      };
      // NOTES: with two Q buffers (and kEarlyQ), the next tile's Q is requested
      // right after the current tile's first kStages - 1 K/V tiles, not after
      // all of them. The last of those went into the stage of the previous
      // tile's second-to-last key tile: its V was released after that tile's
      // P V, which completes after the previous tile's last S = Q K^T (wgmma
      // groups complete in order), after which its Q buffer (the one the next
      // Q goes into) was released: so the Q wait below returns at once, and the
      // next Q gets most of a tile of lead instead of a couple of key tiles.
      // (ncu, d128 2k: the consumers' wait for Q at a tile's start was 0.75%
      // of warp samples, 1.2% causal; measured gain: none beyond the spread.)
      // One Q buffer: the next Q can only follow the current tile's last S,
      // after all its K/V loads (earlier, it would wait on K/V not yet
      // loaded: a deadlock).
      constexpr int kQLead = K::kQStages == 2 && K::Tune::kEarlyQ ? kStages - 1 : 1 << 30;
      int step = 0;
      Loads w;
      bool have = next_tile(step, w);
      if (have) issue_q(w);
      while (have) {
        int step_next = step + 1;
        Loads wn;
        const bool have_next = next_tile(step_next, wn);
        const int hk = w.h / group;
        int loaded = 0;
        // K or V of key tile n into the stage of the i-th key tile walked.
        auto load_kv = [&](bool is_k, int i, int n) {
          const int s = ring_stage(i);
          const uint32_t ph = ring_phase(i);
          uint64_t* full = is_k ? &full_k[s] : &full_v[s];
          mbar_wait(is_k ? &empty_k[s] : &empty_v[s], ph ^ 1);
          mbar_arrive_expect_tx(full, K::kKVBytes);
          T* dst = (is_k ? sK : sV) + s * K::kColBlocks * kBlockN * 64;
#pragma unroll
          for (int c = 0; c < K::kColBlocks; ++c)
            tma_load_4d(dst + c * kBlockN * 64, is_k ? &tma_k : &tma_v, full, c * 64,
                        w.row_k0 + n * kBlockN, hk, w.bq);
        };
        // NOTES (kKAhead): K of key tile n is requested before V of tile n + 1
        // (the one walked before it): K's stage frees when S = Q K^T of two
        // tiles back completes, V's only when that tile's P V has, so K no
        // longer waits behind V's release and gets about half a period more lead.
        for (int n = w.n_end - 1; n >= w.n_begin; --n, ++it) {
          load_kv(true, it, n);
          if (!K::Tune::kKAhead) {
            load_kv(false, it, n);
          } else if (n < w.n_end - 1) {
            load_kv(false, it - 1, n + 1);
          }
          if (++loaded == kQLead && have_next) issue_q(wn);
        }
        if (K::Tune::kKAhead && loaded > 0) load_kv(false, it - 1, w.n_begin);
        if (loaded < kQLead && have_next) issue_q(wn);
        w = wn;
        step = step_next;
        have = have_next;
      }
    }
  } else {
    // ------------------------------------------------------------ consumers
    setmaxnreg_inc<K::kConsumerRegs>();
    const int cw = wg - 1;  // consumer warpgroup: query rows cw*64 .. cw*64+63 of the tile
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;
    const bool varlen = p.is_varlen();
    constexpr bool kPingPong = K::Tune::kPingPong;
    constexpr uint32_t kTurnThreads = 256;
    // Ping-pong: the consumers issue their GEMMs in turn 0, 1, (2,) 0, ...; the
    // last one hands warpgroup 0 the first turn.
    const uint32_t my_turn = K::kTurnBarrier0 + cw;
    const uint32_t other_turn = K::kTurnBarrier0 + (cw + 1) % K::kConsumers;
    if (kPingPong && cw == K::kConsumers - 1) named_arrive(K::kTurnBarrier0, kTurnThreads);

    // Operand descriptors: built once from the buffers' bases, then moved by
    // byte offsets (desc_advance; the offsets below are compile-time but for
    // the stage and Q buffer).
    // NOTES: built per wgmma from the address, each took 7 uniform-datapath
    // instructions (add, two masks, shift, two R2UR, a move) issued inside the
    // ping-pong turn: 118 of the d 128 loop's ~566 instructions per key tile.
    const uint64_t q_desc0 = make_smem_desc_sw128(smem_addr(sQ) + cw * 64 * 128, 16, 1024);
    uint64_t q_desc = q_desc0;
    const uint64_t k_desc = make_smem_desc_sw128(smem_addr(sK), 16, 1024);
    const uint64_t v_desc = make_smem_desc_sw128(smem_addr(sV), kBlockN * 128, 1024);
    auto desc_q = [&](int kk) { return desc_advance(q_desc, (kk / 4) * kBlockM * 128 + (kk % 4) * 32); };
    auto desc_k = [&](int s, int kk) {
      return desc_advance(desc_advance(k_desc, s * K::kKVBytes), (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
    };
    auto desc_v = [&](int s, int kt) {
      return desc_advance(desc_advance(v_desc, s * K::kKVBytes), kt * 16 * 128);
    };

    // O of one tile through this warpgroup's shared-memory staging and a TMA
    // store (kOTma): po holds O / l as the stmatrix operands (bf16/fp16 pairs).
    // Row rr of the 64 at byte rr * 128 of each 64-column block; its 16-byte
    // chunk c sits at chunk c ^ (rr % 8) (the 128B swizzle). One stmatrix.x4
    // per 16 columns of the warp's 16 rows (8 at d128, instead of 32 4-byte
    // stores): matrix q = lane / 8 is rows 8 (q % 2) .. +7 at chunk i + q / 2;
    // i is even, so that chunk's swizzle is (i % 8) ^ x with x = (q / 2) ^
    // (rr % 8) fixed per lane.
    auto store_o_tma = [&](const uint32_t (&po)[D / 4], int wg_row0, int h, int b) {
      uint8_t* so = smem + K::kOOff + cw * K::kOBytes;
      const uint32_t o_bar = K::kOBarrier0 + cw;
      // The previous tile's store must have read the buffer.
      if (tid == 0) tma_store_wait_read();
      named_sync(o_bar, 128);
      const int q = lane / 8;
      const int rr = warp * 16 + (q % 2) * 8 + lane % 8;
      const uint32_t row_base = smem_addr(so) + rr * 128;
      const int x = (q / 2) ^ (lane % 8);
#pragma unroll
      for (int i = 0; i < D / 8; i += 2) {
        stmatrix_x4(row_base + (i / 8) * 64 * 128 + (((i % 8) ^ x) << 4), po[2 * i], po[2 * i + 1],
                    po[2 * i + 2], po[2 * i + 3]);
      }
      fence_proxy_async_smem();
      named_sync(o_bar, 128);
      if (tid == 0 && wg_row0 >= 0) {
#pragma unroll
        for (int c = 0; c < K::kColBlocks; ++c)
          if (c * 64 < p.head_dim) tma_store_4d(&tma_o, so + c * 64 * 128, c * 64, wg_row0, h, b);
        tma_store_commit();
      }
    };

    // A tile of the walk with what its softmax mask and epilogue need.
    struct Tile {
      TileWork w;
      SplitSegment seg;
      MaskPolicy mask;
      int row0;      // this thread's rows: row0, row0 + 8
      int rows_end;  // end of the tile's rows within the sequence
    };
    // The next valid tile from step `step` on (producer and consumers skip the same ones).
    auto next_tile = [&](int& step, Tile& t) {
      for (; step < a.num_steps; ++step) {
        if (!work_at<kBlockM, kBlockN, kSplit>(p, a, step, t.w, t.seg)) continue;
        if (!t.w.valid) continue;
        t.mask = mask_for(p, t.w.seq);
        t.row0 = t.w.m0 + cw * 64 + warp * 16 + lane / 4;
        t.rows_end = min(t.w.m0 + kBlockM, t.w.seq.seqlen_q);
        return true;
      }
      return false;
    };

    // kCrossTile: a tile's last P V and the next tile's first S = Q K^T are
    // issued in one turn, and the tile's epilogue runs under that S (tuning.h).
    // Needs the next tile's Q loaded during this one (two Q buffers).
    constexpr bool kCrossTile =
        K::Tune::kCrossTile && K::Tune::kIntraWgOverlap && K::kQStages == 2 && !kSplit;

    float o[D / 2];
    float m[2], l[2], corr[2];
    float sc[kBlockN / 2];
    uint32_t pa[kBlockN / 16][4];
    int qt = 0;  // tiles with loads so far, as the producer counts them
    uint64_t* q_empty = nullptr;

    // S = Q K(stage s)^T into sc (issue only).
    auto issue_s = [&](int s) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        WgmmaSS<kBlockN, T>::run(sc, desc_q(kk), desc_k(s, kk), kk > 0 ? 1 : 0);
      wgmma_commit();
    };
    // O += P V(stage s) (issue only).
    auto issue_pv = [&](int s) {
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kBlockN / 16; ++kt)
        WgmmaRS<D, T>::run(o, pa[kt], desc_v(s, kt), 1);
      wgmma_commit();
    };
    // Softcap, mask and online softmax of sc for key tile n of tile t;
    // returns the correction for O in corr.
    auto softmax = [&](const Tile& t, int n) {
      if (a.softcap_in != 0.0f) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) sc[i] = fast_tanh(sc[i] * a.softcap_in);
      }
      const int n0 = n * kBlockN;
      if (!t.mask.tile_fully_visible(t.w.m0, t.rows_end, n0, n0 + kBlockN)) {
        // visible(row, col) as one range per row: columns [lo, hi) of the
        // tile relative to this lane's first, n0 + 2 * (lane % 4), so each
        // element compares a compile-time column with two bounds.
        // NOTES: per-element visible() took ~6 instructions an element on
        // every masked (diagonal, window, ragged-end) tile; the ranges gave
        // causal +9-11% at 2k (d64, d128). Without a window only the ragged
        // end is cut, with row-independent bounds: computing per-row ones
        // there too cost the unmasked runs 2-5% (perf-notes).
        const int col0 = n0 + 2 * (lane % 4);
        int lo[2], hi[2];
        if (t.mask.window_left < 0 && t.mask.window_right < 0) {
          lo[0] = lo[1] = -col0;
          hi[0] = hi[1] = t.mask.seqlen_k - col0;
        } else {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            lo[r] = max(t.mask.first_key(t.row0 + 8 * r), 0) - col0;
            hi[r] = min(t.mask.end_key(t.row0 + 8 * r), t.mask.seqlen_k) - col0;
          }
        }
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = 8 * i + (e & 1), r = e >> 1;
            if (c < lo[r] || c >= hi[r]) sc[4 * i + e] = -INFINITY;
          }
        }
      }
      online_softmax(sc, m, l, corr, a.scale_log2);
    };
    auto rescale_o = [&]() {
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[4 * i + 0] *= corr[0];
        o[4 * i + 1] *= corr[0];
        o[4 * i + 2] *= corr[1];
        o[4 * i + 3] *= corr[1];
      }
    };
    // O *= exp(m_old - m_new) of the last softmax inside the turn, while S
    // runs and before the P V that adds to O (tuning.h, kRescaleInTurn).
    auto rescale_in_turn = [&]() {
      if constexpr (kRescaleInTurn) {
        rescale_o();
        fence_operands(o);
      }
    };
    auto convert_p = [&]() {
#pragma unroll
      for (int kt = 0; kt < kBlockN / 16; ++kt) {
        pa[kt][0] = pack2<T>(sc[8 * kt + 0], sc[8 * kt + 1]);
        pa[kt][1] = pack2<T>(sc[8 * kt + 2], sc[8 * kt + 3]);
        pa[kt][2] = pack2<T>(sc[8 * kt + 4], sc[8 * kt + 5]);
        pa[kt][3] = pack2<T>(sc[8 * kt + 6], sc[8 * kt + 7]);
      }
    };
    auto release = [&](uint64_t* bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };
    // The tile's Q buffer: the producer filled it for the qt-th tile with loads.
    auto claim_q = [&]() {
      const int qs = qt % K::kQStages;
      const uint32_t q_phase = (qt / K::kQStages) & 1;
      ++qt;
      q_desc = desc_advance(q_desc0, qs * K::kQBytes);
      q_empty = &empty_q[qs];
      mbar_wait(&full_q[qs], q_phase);
    };

    // ------------------------------------------------------------ epilogue
    // O / l (0 for rows that saw no key); lse = max logit + log l (-inf then).
    // NOTES: with kOTma (not varlen: a TMA box would spill into the next
    // sequence's rows), O goes to shared memory in the 128B-swizzled layout
    // of the O tensor map and one thread stores it with TMA, which clips rows
    // past seqlen_q and columns past head_dim; otherwise straight from
    // registers (16 bytes per lane after a quad transpose, below). Why TMA
    // where it fits: ncu of the earlier 4-byte register stores at d128 2k
    // showed the consumer warps stalled on them (long scoreboard on the
    // branch after the stores, ~1.5% of samples, none at 16k per unit of
    // work) and half-filled 32-byte sectors. Measured +1-3% at d128 / d64.
    int fused_trace_tile = -1;  // trace.h: the tile whose fused last turn is stamped
    auto finish = [&](const Tile& t) {
      const TileWork& w = t.w;
      float inv[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        l[r] = sum;
        inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      }
      // A part of a split tail tile: only the warp that merges the tile's last
      // part stores the rows (from registers: the other warps of its
      // warpgroup may have stored theirs or not yet).
      bool merged = false;
      if constexpr (kSplit) {
        if (t.seg.parts > 1) {
          if (!merge_split_part<D>(a, t.seg, cw * 4 + warp, 4 * K::kConsumers, lane, o, m, l)) return;
          merged = true;
#pragma unroll
          for (int r = 0; r < 2; ++r) inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        }
      }
      bool o_stored = false;
      if constexpr (K::kOTma) {
        if (!varlen && !merged) {
          o_stored = true;
          uint32_t po[D / 4];
#pragma unroll
          for (int i = 0; i < D / 8; i += 2) {
            po[2 * i] = pack2<T>(o[4 * i] * inv[0], o[4 * i + 1] * inv[0]);
            po[2 * i + 1] = pack2<T>(o[4 * i + 2] * inv[1], o[4 * i + 3] * inv[1]);
            po[2 * i + 2] = pack2<T>(o[4 * i + 4] * inv[0], o[4 * i + 5] * inv[0]);
            po[2 * i + 3] = pack2<T>(o[4 * i + 6] * inv[1], o[4 * i + 7] * inv[1]);
          }
          const int wg_row0 = w.m0 + cw * 64;
          trace_fused(fused_trace_tile, cw, tid, kFusedPacked);
          store_o_tma(po, wg_row0 < w.seq.seqlen_q ? wg_row0 : -1, w.h, w.b);
          trace_fused(fused_trace_tile, cw, tid, kFusedOStored);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = t.row0 + 8 * r;
        const bool row_ok = row < w.seq.seqlen_q;
        if (!o_stored) {
          // NOTES: the 4 lanes of a quad hold 8 consecutive columns of a row
          // (2 each); a quad transpose gives each lane all 8 of one group, so
          // a warp writes 8 rows x 64 bytes per 16-byte store (whole 32-byte
          // sectors) instead of 8 x 16 per 4-byte store. The trace (trace.h)
          // had the 4-byte stores' epilogue at 7.4k cycles of a d256 2k tile's
          // 80k, against 2.0k for d128's through TMA.
          T* orow = static_cast<T*>(p.out) + (row_ok ? row_offset(w.b, w.seq.row_q, row, w.h, p.o_batch_stride,
                                                                  p.o_row_stride, p.o_head_stride, varlen)
                                                      : 0);
#pragma unroll
          for (int b = 0; b < D / 32; ++b) {
            uint32_t v[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int i = 4 * b + c;
              v[c] = pack2<T>(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
            }
            quad_transpose(v, lane);
            // Columns 8g..8g+7 of group g = 4b + lane % 4 exist when 8g < head_dim (a multiple of 8).
            const int group = 4 * b + lane % 4;
            if (row_ok && 8 * group < p.head_dim)
              *reinterpret_cast<uint4*>(orow + 8 * group) = make_uint4(v[0], v[1], v[2], v[3]);
          }
        }
        if (row_ok && p.lse != nullptr && lane % 4 == 0) {
          p.lse[lse_offset(p, w.b, w.seq.row_q, row, w.h)] =
              l[r] > 0.0f ? m[r] * a.logit_scale + logf(l[r]) : -INFINITY;
        }
      }
    };
    // A new tile's row state; O is zeroed only where no wgmma is in flight
    // (ptxas serializes every wgmma otherwise, C7515).
    auto reset_rows = [&]() {
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.0f;
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    };

    int it = 0;      // K/V stages consumed so far, as the producer fills them
    int traced = 0;  // tiles so far (trace.h)
    int step = 0;
    Tile cur;
    bool have = next_tile(step, cur);
    // cur's first key tile already through S and the softmax (kCrossTile: by
    // the previous tile's last turn).
    bool primed = false;
    reset_rows();
    while (have) {
      const int ti = traced++;
      auto stamp = [&](TraceEvent e) {
        if constexpr (!kSplit) trace(ti, cw, tid, e);  // the main kernel's tiles only
      };
      auto stamp_step = [&](int j, TraceStep e) {
        if constexpr (!kSplit) trace_step(ti, cw, tid, j, e);
      };
      auto stamp_fused = [&](TraceFused e) {
        if constexpr (!kSplit) trace_fused(ti, cw, tid, e);
      };
      stamp(kTraceTileStart);
      const TileWork& w = cur.w;
      int step_next = step + 1;
      Tile nxt;
      bool have_next = false;
      bool fused = false;  // this tile's last turn issued the next tile's first S
      if (w.n_end > w.n_begin) {
        if constexpr (K::Tune::kIntraWgOverlap) {
          int n = w.n_end - 1;
          int s = ring_stage(it);
          uint32_t ph = ring_phase(it);
          if (!primed) {
            // Prologue: S and P of the first (highest) key tile.
            claim_q();
            stamp(kTraceQReady);
            mbar_wait(&full_k[s], ph);
            if (kPingPong) named_sync(my_turn, kTurnThreads);
            issue_s(s);
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            wgmma_wait<0>();
            fence_operands(sc);
            stamp(kTraceFirstS);
            release(&empty_k[s]);
            if (n == w.n_begin) release(q_empty);
            softmax(cur, n);
            convert_p();
          }
          // Steady state: S(n) runs on the tensor cores with P(n+1) V(n+1)
          // while the previous wait/softmax finishes; softmax(n) overlaps P V.
          for (--n; n >= w.n_begin; --n) {
            const int j = w.n_end - 2 - n;  // key tiles done so far, for the trace
            stamp_step(j, kStepTop);
            const int s_prev = s;
            const uint32_t ph_prev = ph;
            ++it;
            s = ring_stage(it);
            ph = ring_phase(it);
            mbar_wait(&full_k[s], ph);
            mbar_wait(&full_v[s_prev], ph_prev);
            stamp_step(j, kStepLoaded);
            if (kPingPong) named_sync(my_turn, kTurnThreads);
            stamp_step(j, kStepTurn);
            fence_operands(o);
            fence_operands(pa);
            issue_s(s);
            rescale_in_turn();
            issue_pv(s_prev);
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            stamp_step(j, kStepIssued);
            wgmma_wait<1>();
            fence_operands(sc);
            stamp_step(j, kStepSReady);
            release(&empty_k[s]);
            if (n == w.n_begin) release(q_empty);
            softmax(cur, n);
            stamp_step(j, kStepSoftmax);
            wgmma_wait<0>();
            fence_operands(o);
            fence_operands(pa);
            stamp_step(j, kStepPvReady);
            release(&empty_v[s_prev]);
            if constexpr (!kRescaleInTurn) rescale_o();
            convert_p();
          }
          // Last P V.
          stamp_fused(kFusedTop);
          if constexpr (kCrossTile) {
            have_next = next_tile(step_next, nxt);
            fused = have_next && nxt.w.n_end > nxt.w.n_begin;
          }
          stamp_fused(kFusedLookedUp);
          mbar_wait(&full_v[s], ph);
          stamp_fused(kFusedVReady);
          // The last turn's start: O rescaled and the last P V issued.
          auto take_turn_issue_last_pv = [&]() {
            if (kPingPong) named_sync(my_turn, kTurnThreads);
            fence_operands(o);
            fence_operands(pa);
            rescale_in_turn();
            issue_pv(s);
          };
          // NOTES: the fused and plain last turns are written out separately:
          // with the S issue and its wait under `if (fused)` inside one shared
          // sequence, S's accumulators are in flight across a merge of control
          // flow and ptxas serializes every wgmma of the kernel (C7515; 17-32%
          // slower, session9.md 5).
          if (fused) {
            // With the next tile's first S = Q K^T: its Q and K wait here.
            const int s_next = ring_stage(it + 1);
            const uint32_t ph_next = ring_phase(it + 1);
            claim_q();
            stamp_fused(kFusedQReady);
            mbar_wait(&full_k[s_next], ph_next);
            stamp_fused(kFusedKReady);
            take_turn_issue_last_pv();
            issue_s(s_next);
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            stamp_fused(kFusedIssued);
            wgmma_wait<1>();
            fence_operands(o);
            stamp(kTraceLoopEnd);
            stamp_fused(kFusedPvReady);
            release(&empty_v[s]);
            ++it;
            if constexpr (!kSplit) fused_trace_tile = ti;
            finish(cur);
            fused_trace_tile = -1;
            stamp_fused(kFusedFinished);
            wgmma_wait<0>();
            fence_operands(sc);
            stamp_fused(kFusedSReady);
            reset_rows();
            release(&empty_k[s_next]);
            if (nxt.w.n_end - 1 == nxt.w.n_begin) release(q_empty);
            softmax(nxt, nxt.w.n_end - 1);
            convert_p();
          } else {
            take_turn_issue_last_pv();
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            wgmma_wait<0>();
            fence_operands(o);
            stamp(kTraceLoopEnd);
            release(&empty_v[s]);
            ++it;
          }
        } else {
          // (Each key tile's S and softmax below repeat the overlapped walk's
          // prologue; one shared lambda changed the shipped kernels' SASS and
          // cost ~1% in an A/B, session15.md 12, so the variant keeps its copy.)
          claim_q();
          for (int n = w.n_end - 1; n >= w.n_begin; --n, ++it) {
            const int s = ring_stage(it);
            const uint32_t ph = ring_phase(it);
            mbar_wait(&full_k[s], ph);
            if (kPingPong) named_sync(my_turn, kTurnThreads);
            issue_s(s);
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            wgmma_wait<0>();
            fence_operands(sc);
            release(&empty_k[s]);
            if (n == w.n_begin) release(q_empty);
            softmax(cur, n);
            rescale_o();
            convert_p();
            mbar_wait(&full_v[s], ph);
            if (kPingPong) named_sync(my_turn, kTurnThreads);
            fence_operands(o);
            fence_operands(pa);
            issue_pv(s);
            if (kPingPong) named_arrive(other_turn, kTurnThreads);
            wgmma_wait<0>();
            fence_operands(o);
            release(&empty_v[s]);
          }
        }
      }
      // (A tile with no visible key stores O = 0 and logsumexp -inf.)
      if (!fused) {
        finish(cur);
        reset_rows();
        if (!kCrossTile || w.n_end <= w.n_begin) have_next = next_tile(step_next, nxt);
      }
      stamp(kTraceTileEnd);
      primed = fused;
      cur = nxt;
      step = step_next;
      have = have_next;
    }
    // Balance the ping-pong: the last warpgroup's final hand-over to warpgroup
    // 0 is consumed here, so no arrival is left pending on a hardware barrier.
    if (kPingPong && cw == 0) named_sync(K::kTurnBarrier0, kTurnThreads);
    // The last O stores must complete before the CTA's shared memory goes.
    if (K::kOTma && tid == 0) tma_store_wait_all();
  }
#endif
}

// The split-tail kernel, launched right after the main one with programmatic
// stream serialization: its CTAs take the SMs as the main kernel's exit (the
// tail does not read what the main kernel writes, except the part counters it
// zeroes: merge_split_part waits for the main grid before counting). Without
// that launch attribute (a driver or graph that refuses it), a plain launch.
template <int D, typename T, int C, int N>
cudaError_t launch_split_tail(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                              const CUtensorMap& mo, const AttentionParams& p, FwdArgs a, int grid) {
  using K = FwdTraits<D, T, C, N>;
  auto kernel = forward_kernel<D, T, C, N, true>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
  if (err != cudaSuccess) return err;
  a.num_steps = max_split_segments(a.tail, grid);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(K::kThreads);
  config.dynamicSmemBytes = K::kSmemBytes;
  config.stream = static_cast<cudaStream_t>(p.stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, kernel, mq, mk, mv, mo, p, a);
  if (err == cudaSuccess) return cudaSuccess;
  cudaGetLastError();
  kernel<<<grid, K::kThreads, K::kSmemBytes, config.stream>>>(mq, mk, mv, mo, p, a);
  return cudaGetLastError();
}

template <int D, typename T, int C, int N>
fa_status launch_kernel(const AttentionParams& p) {
  using K = FwdTraits<D, T, C, N>;
  if (p.head_dim > D || p.head_dim <= 0 || p.head_dim % 8 != 0)
    return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: head_dim does not fit this kernel");
  const bool varlen = p.is_varlen();
  // Tensor maps (d, rows, heads, batch); varlen: rows = all tokens, batch 1.
  // d is the real head dim: TMA zero-fills the box columns past it.
  auto make_map = [&](CUtensorMap* map, const void* base, int64_t rows, int heads,
                      int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                      uint32_t box_rows) {
    return make_attention_map(map, p, {base, rows, heads, row_stride, head_stride, batch_stride},
                              p.head_dim, box_rows);
  };
  CUtensorMap mq, mk, mv, mo;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = varlen ? p.total_k : p.seqlen_k;
  FA_RETURN_IF_ERROR(make_map(&mq, p.q, rows_q, p.heads_q, p.q_row_stride, p.q_head_stride,
                              p.q_batch_stride, K::kBlockM));
  FA_RETURN_IF_ERROR(make_map(&mk, p.k, rows_k, p.heads_kv, p.k_row_stride, p.k_head_stride,
                              p.k_batch_stride, K::kBlockN));
  FA_RETURN_IF_ERROR(make_map(&mv, p.v, rows_k, p.heads_kv, p.v_row_stride, p.v_head_stride,
                              p.v_batch_stride, K::kBlockN));
  // O, 64 rows per box (one consumer warpgroup's rows); only where the
  // kernel stores through TMA (not varlen), else an unused copy of Q's map.
  if (K::kOTma && !varlen) {
    FA_RETURN_IF_ERROR(make_map(&mo, p.out, rows_q, p.heads_q, p.o_row_stride, p.o_head_stride,
                                p.o_batch_stride, 64));
  } else {
    mo = mq;
  }

  FwdArgs a;
  const int num_m_blocks = (p.seqlen_q + K::kBlockM - 1) / K::kBlockM;
  const int64_t tiles = static_cast<int64_t>(num_m_blocks) * p.heads_q * p.batch;
  if (tiles == 0) return FA_OK;
  if (tiles > (1ll << 30)) return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: too many tiles");
  if (p.softcap > 0.0f) {
    a.softcap_in = p.scale / p.softcap;
    a.logit_scale = p.softcap;
  } else {
    a.softcap_in = 0.0f;
    a.logit_scale = p.scale;
  }
  a.scale_log2 = a.logit_scale * kLog2e;
  int sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device_index);
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sm90 forward: ") + cudaGetErrorString(err));
  int l2_bytes = 0;
  if (cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, p.device_index) != cudaSuccess) {
    cudaGetLastError();
    l2_bytes = 50 << 20;
  }
  // K and V bytes one query head walks (query heads of a GQA group share them).
  const double kv_per_head = 4.0 * p.seqlen_k * p.head_dim / p.group_size();
  const double fit = (l2_bytes / 2) / (kv_per_head > 1.0 ? kv_per_head : 1.0);
  const int num_bh = p.batch * p.heads_q;
  if (p.max_ctas > 0 && p.max_ctas < sms) sms = p.max_ctas;
  const int grid = static_cast<int>(tiles < sms ? tiles : sms);
  // Causal pairs need tile costs that pair up: a plain causal mask, fixed lengths.
  const bool plain_causal = !p.is_varlen() && p.window_right == 0 && p.window_left < 0;
  a.order = plan_tile_order(num_m_blocks, num_bh, grid, fit, p.has_mask(),
                            {kBalancedGroups, kCausalPairs && plain_causal, kHeadMajor});

  a.num_steps = a.order.num_rounds;

  // Split tail (schedule.h): where every tile costs the same (no mask, fixed
  // lengths), the main kernel walks the whole rounds and a second kernel the
  // last round's tiles cut along the keys over all CTAs, merging a tile's
  // parts through a workspace: [O, max and sum slots][part counters].
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  constexpr bool kHasSplitTail = K::Tune::kSplitTail && N == K::Tune::kLongBlockN;
  const int key_tiles = (p.seqlen_k + K::kBlockN - 1) / K::kBlockN;
  const bool uniform = !p.has_mask() && !varlen;
  SplitTail& tail = a.tail;
  tail = plan_split_tail(static_cast<int>(tiles), grid, key_tiles,
                         kHasSplitTail && uniform && p.seqlen_k >= kSplitTailMinKeys);
  a.part_o = nullptr;
  a.part_count = nullptr;
  void* workspace = nullptr;
  if (tail.tiles > 0) {
    const size_t warps = 4 * K::kConsumers;
    const size_t slot_bytes = warps * 32 * (D / 2 + 4) * sizeof(float);
    const size_t o_bytes = static_cast<size_t>(tail.tiles) * tail.max_parts * slot_bytes;
    const size_t count_bytes = static_cast<size_t>(tail.tiles) * warps * sizeof(int);
    if (cudaMallocAsync(&workspace, o_bytes + count_bytes, stream) == cudaSuccess) {
      a.part_o = static_cast<float*>(workspace);
      a.part_count = reinterpret_cast<int*>(static_cast<uint8_t*>(workspace) + o_bytes);
      a.num_steps = tail.first_rank / grid;
    } else {
      // No workspace (out of memory, no stream-ordered allocator): whole tiles only.
      cudaGetLastError();
      workspace = nullptr;
      tail.tiles = 0;
    }
  }

  auto kernel = forward_kernel<D, T, C, N, false>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
  if (err == cudaSuccess) {
    kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(mq, mk, mv, mo, p, a);
    err = cudaGetLastError();
  }
  if constexpr (kHasSplitTail) {
    if (err == cudaSuccess && tail.tiles > 0) err = launch_split_tail<D, T, C, N>(mq, mk, mv, mo, p, a, grid);
  }
  if (workspace != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(workspace, stream);
    if (err == cudaSuccess) err = free_err;
  }
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sm90 forward launch: ") + cudaGetErrorString(err));
  return FA_OK;
}

// NOTES: causal runs on kCausalConsumers warpgroups where the tuning asks for
// it (d = 64: 2 instead of 3): 192-row query tiles put more of each causal
// tile on the masked diagonal (perf-notes: 5-10% slower than 128-row tiles at
// 512-4k, equal at 8k/16k). Where the middle query row sees at least
// kLongKeys keys, kLongBlockN-key tiles where the tuning has them (tuning.h
// says why).
template <int D, typename T>
fa_status launch_forward(const AttentionParams& p) {
  using Tune = ForwardTuning<D>;
  if constexpr (Tune::kCausalConsumers != Tune::kConsumers) {
    if (p.window_right == 0) return launch_kernel<D, T, Tune::kCausalConsumers, Tune::kBlockN>(p);
  }
  if constexpr (Tune::kLongBlockN != Tune::kBlockN) {
    // The middle query row's keys: the length of a typical query tile's K/V
    // walk (seqlen_k without a mask, about half of it causal; varlen: of the
    // longest sequences).
    const MaskPolicy mask = mask_for(p, {p.seqlen_q, p.seqlen_k, 0, 0});
    if (mask.keys_of_row(p.seqlen_q / 2) >= Tune::kLongKeys)
      return launch_kernel<D, T, Tune::kConsumers, Tune::kLongBlockN>(p);
  }
  return launch_kernel<D, T, Tune::kConsumers, Tune::kBlockN>(p);
}

}  // namespace flashattn::cuda::sm90
