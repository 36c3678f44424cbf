// The sm80 FlashAttention-2 backward kernel (mma.sync, runs on sm_80 and later).
//
// One CTA owns a key tile (BN keys of one kv head) and keeps its dK and dV in
// registers while it walks the query tiles that can see the tile (the mask's
// query_begin/query_end) for every query head of its group. Per query tile:
//   S  = Q K^T            (registers)      dP = dO V^T   (registers)
//   P  = exp(S - lse)     dS = P * (dP - D) * softcap'(S)
//   (dropout: P z into the P tile, dS = P (z dP - D) * softcap'(S))
//   P, dS -> shared memory (16-bit)
//   dV += P^T dO          dK += dS^T Q     (registers, all iterations)
//   dQ_part = dS K        -> added into the f32 dQ accumulator in the workspace
// The pre-pass (passes.cu) computed D = rowsum(dO * O) and zeroed the
// accumulator; the post-pass converts it into dq.
//
// NOTES:
// - GQA/MQA: the CTA loops over the query heads of its group itself, so dK/dV
//   are summed in registers and written once. The alternative (a CTA per query
//   head with f32 dK/dV accumulators in the workspace and a reducing post-pass)
//   costs group_size x (total_k x D x 8 bytes) of workspace and a second pass
//   over it; the loop only costs parallelism when batch * heads_kv * key tiles
//   is under a wave or two, which is not the regime where backward time matters.
// - Deterministic mode: every (sequence, query head, query tile) has a
//   semaphore; key tiles add their dQ share in decreasing key-tile order, each
//   waiting for the next-higher key tile that sees the same query tile to
//   publish. Decreasing order makes the causal case a wavefront (key tile n
//   starts at query tile ~n, which tile n+1 never touches) instead of making
//   every tile wait for tile 0's walk. The grid is launched with the highest
//   key tile first (blockIdx.x reversed), so a waiting CTA's predecessor was
//   dispatched before it and the chain cannot deadlock.
// - Masks are runtime (no template per mask): a (query tile, key tile) pair
//   that MaskPolicy::tile_fully_visible() clears runs no per-element test;
//   others first set the scores outside each row's visible key range
//   [first_key, end_key) (from the same MaskPolicy) to -inf.
// - Block masks (common/block_sparse.cuh): a key tile walks only the query
//   tiles that list it (per query head of its group), and a pair not full in
//   the lists also takes the per-element test, which then drops the keys of
//   blocks the row's query block does not list. A key tile no query tile
//   lists loads nothing and writes dK = dV = 0.
// - dQ shares are added with red (fire-and-forget) reductions, two floats per
//   instruction on sm_90; the accumulator is [heads_q][total_q][kernel dim].
// - The softmax scale is applied to dK here (epilogue) and to dQ in the
//   post-pass, not folded into dS: scaled dS values (P * (dP - D) / sqrt(d))
//   reach fp16's subnormal range, where they lose bits that the tolerance
//   (2x the error of naive fp16 attention) does not allow.
// - Rows whose lse is -inf (they see no key) get P = 0: lse is replaced by
//   +inf, so exp2(s - inf) = 0 and nothing downstream sees a NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/layout.h"
#include "attention/mask.h"
#include "attention/score_mod.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/common/flags.h"
#include "cuda/common/launch_env.h"
#include "cuda/common/mma.h"
#include "cuda/common/block_tiles.h"
#include "cuda/common/nonfinite.cuh"
#include "cuda/sm80/bwd/config.h"
#include "cuda/sm80/bwd/launch.h"
#include "cuda/sm80/bwd/query_walk.cuh"
#include "cuda/sm80/dropout.cuh"

namespace flashattn::cuda::bwd {

// ---------------------------------------------------------------- warp GEMM

// acc[MT][NT] (a warp tile of MT*16 x NT*8, mma C fragments) += A * B over KDIM,
// operands in shared memory (16-bit, row strides in elements):
//   A (m x k): A_KMAJOR ? stored [k][m] : stored [m][k]
//   B (k x n): B_KMAJOR ? stored [k][n] : stored [n][k]
// a/b are shared-memory byte addresses of the warp tile's origin. K-major
// operands are read with ldmatrix.trans, which delivers the transposed
// fragment, so every product of the backward reads its operands in place.
//
// NP = 2 runs two products of one shape in the same k-loop (acc0 += A0 B0,
// acc1 += A1 B1). NOTES: a warp tile of MT x NT accumulators has only MT*NT
// independent mma.sync per k-step before the next k-step depends on them; at
// 1 x 4 (S and dP at D 128) that is shorter than the mma latency and the warp
// stalls (ncu "wait"). S with dP, and dV with dK, interleaved double it.
// Fragments are software-pipelined one step ahead: the ldmatrix of the next
// B pair (and, at a k-step boundary, the next A fragments) is issued before
// the current step's mma.sync, so the shared-memory latency overlaps math.
template <int NP, int MT, int NT, int KDIM, bool A_KMAJOR, bool B_KMAJOR, typename T>
__device__ __forceinline__ void warp_gemm_n(float (&acc0)[MT][NT][4], float (&acc1)[MT][NT][4],
                                            uint32_t a0, uint32_t a1, int a_stride, uint32_t b0,
                                            uint32_t b1, int b_stride, int lane) {
  static_assert(NP == 1 || NP == 2, "one or two products");
  static_assert(NT % 2 == 0, "B fragments are loaded for 16 columns at a time");
  static_assert(KDIM % 16 == 0, "k-steps of 16");
  constexpr int KS = KDIM / 16, NJ = NT / 2;
  // Per-lane row/column of the 8x8 matrix this lane addresses (see mma.h).
  const int a_row = A_KMAJOR ? (lane & 7) + ((lane >> 4) << 3) : (lane & 15);
  const int a_col = A_KMAJOR ? ((lane >> 3) & 1) * 8 : (lane >> 4) * 8;
  const int b_row = B_KMAJOR ? (lane & 7) + ((lane >> 3) & 1) * 8 : (lane & 7) + ((lane >> 4) << 3);
  const int b_col = B_KMAJOR ? (lane >> 4) * 8 : ((lane >> 3) & 1) * 8;
  const uint32_t a_off = 2u * (a_row * a_stride + a_col);
  const uint32_t b_off = 2u * (b_row * b_stride + b_col);
  const uint32_t a_base[2] = {a0 + a_off, a1 + a_off};
  const uint32_t b_base[2] = {b0 + b_off, b1 + b_off};
  uint32_t af[2][NP][MT][4];  // [k-step parity][product][m tile]
  uint32_t bf[2][NP][4];      // [step parity][product]: B of n tiles 2nj, 2nj+1
  auto load_a = [&](int k, int buf) {
#pragma unroll
    for (int pr = 0; pr < NP; ++pr)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        if constexpr (A_KMAJOR) {
          ldmatrix_x4_trans(af[buf][pr][mi], a_base[pr] + 2u * (k * 16 * a_stride + mi * 16));
        } else {
          ldmatrix_x4(af[buf][pr][mi], a_base[pr] + 2u * (mi * 16 * a_stride + k * 16));
        }
      }
  };
  auto load_b = [&](int k, int nj, int buf) {
#pragma unroll
    for (int pr = 0; pr < NP; ++pr) {
      if constexpr (B_KMAJOR) {
        ldmatrix_x4_trans(bf[buf][pr], b_base[pr] + 2u * (k * 16 * b_stride + nj * 16));
      } else {
        ldmatrix_x4(bf[buf][pr], b_base[pr] + 2u * (nj * 16 * b_stride + k * 16));
      }
    }
  };
  load_a(0, 0);
  load_b(0, 0, 0);
#pragma unroll
  for (int k = 0; k < KS; ++k) {
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj) {
      const int step = k * NJ + nj;
      if (nj + 1 < NJ) {
        load_b(k, nj + 1, (step + 1) & 1);
      } else if (k + 1 < KS) {
        load_a(k + 1, (k + 1) & 1);
        load_b(k + 1, 0, (step + 1) & 1);
      }
      const int ab = k & 1, bb = step & 1;
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma_m16n8k16<T>(acc0[mi][2 * nj], af[ab][0][mi], bf[bb][0][0], bf[bb][0][1]);
        if constexpr (NP == 2) mma_m16n8k16<T>(acc1[mi][2 * nj], af[ab][NP - 1][mi], bf[bb][NP - 1][0], bf[bb][NP - 1][1]);
        mma_m16n8k16<T>(acc0[mi][2 * nj + 1], af[ab][0][mi], bf[bb][0][2], bf[bb][0][3]);
        if constexpr (NP == 2) mma_m16n8k16<T>(acc1[mi][2 * nj + 1], af[ab][NP - 1][mi], bf[bb][NP - 1][2], bf[bb][NP - 1][3]);
      }
    }
  }
}

template <int MT, int NT, int KDIM, bool A_KMAJOR, bool B_KMAJOR, typename T>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], uint32_t a, int a_stride,
                                          uint32_t b, int b_stride, int lane) {
  warp_gemm_n<1, MT, NT, KDIM, A_KMAJOR, B_KMAJOR, T>(acc, acc, a, a, a_stride, b, b, b_stride, lane);
}

template <int MT, int NT, int KDIM, bool A_KMAJOR, bool B_KMAJOR, typename T>
__device__ __forceinline__ void warp_gemm2(float (&acc0)[MT][NT][4], float (&acc1)[MT][NT][4],
                                           uint32_t a0, uint32_t a1, int a_stride, uint32_t b0,
                                           uint32_t b1, int b_stride, int lane) {
  warp_gemm_n<2, MT, NT, KDIM, A_KMAJOR, B_KMAJOR, T>(acc0, acc1, a0, a1, a_stride, b0, b1, b_stride, lane);
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;
}

// ---------------------------------------------------------------- loads

// ROWS x D tile of 16-bit rows into shared memory (row stride kRowStride);
// rows >= rows_valid and columns >= d are zero-filled.
template <int ROWS, int D, int STRIDE, typename T>
__device__ __forceinline__ void load_rows_async(T* smem, const T* g, int64_t row_stride,
                                                int rows_valid, int d, int tid) {
  constexpr int kChunks = D / 8;
  if constexpr (kThreads % kChunks == 0 && ROWS % (kThreads / kChunks) == 0) {
    // Each thread keeps one 16-byte column and steps down the rows.
    constexpr int kRowStep = kThreads / kChunks;
    const int c = tid % kChunks, r0 = tid / kChunks;
    const bool col_ok = c * 8 < d;
    const T* src = g + r0 * row_stride + c * 8;
    const int64_t step = kRowStep * row_stride;
    const uint32_t dst = smem_addr(smem + r0 * STRIDE + c * 8);
#pragma unroll
    for (int j = 0; j < ROWS / kRowStep; ++j) {
      const bool valid = col_ok && r0 + j * kRowStep < rows_valid;
      cp_async_16(dst + 2u * j * kRowStep * STRIDE, valid ? src + j * step : g, valid);
    }
  } else {
#pragma unroll 1
    for (int i = tid; i < ROWS * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool valid = r < rows_valid && c * 8 < d;
      const T* src = valid ? g + r * row_stride + c * 8 : g;
      cp_async_16(smem_addr(smem + r * STRIDE + c * 8), src, valid);
    }
  }
}

// 4 bytes global -> shared (L1-cached), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// dst[0..1] += (a, b) without returning the old values. NOTES: atomicAdd on a
// float2 compiles to atom.global.add.v2.f32, which returns the old values: the
// warp then waits on the scoreboard for 16 L2 round trips per query tile (ncu:
// long-scoreboard stalls 2.4 cycles per instruction vs 0.8 for FA2). red does
// not return. sm_90 has the two-wide form; sm_80 takes two scalar reds.
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b));
#else
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(dst), "f"(a));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(dst + 1), "f"(b));
#endif
}


// Deterministic dQ: block until key tile n+1 has added its share of query tile
// m (when it sees that tile at all), then let the whole CTA go on.
__device__ __forceinline__ void wait_for_predecessor(const AttentionParams& p, const Workspace& ws,
                                                  const MaskPolicy& mask, int b, int h, int m,
                                                  int n_tile, int block_m, int block_n,
                                                  int seqlen_k) {
  if (threadIdx.x == 0) wait_dq_turn(ws.dq_semaphore(p, b, h, m), mask, m, n_tile, block_m, block_n, seqlen_k);
  __syncthreads();
}

// ---------------------------------------------------------------- P and dS

struct ScoreArgs {
  float softcap, inv_cap, scale_log2;
  AlibiScore alibi_log2;  // ALiBi with its slope times log2 e (slope 0 when off)
  uint32_t lse, row_d;  // shared addresses: per-row lse and D of the tile
  uint32_t p, ds;       // shared addresses: P and dS tiles
  int m0, n0, g, t;  // warp tile origin, lane coordinates
  int q0, k0, seqlen_q, seqlen_k;
  MaskPolicy mask;
  Dropout drop;  // attention/dropout.h (kDropout only)
};

// Which score modifiers the per-element code applies: none, softcap, any
// (softcap when a.softcap > 0, and ALiBi), or any with dropout: the first two
// keep their own bodies, so runs without ALiBi or dropout execute the same
// instructions as before them.
enum class ScoreMode { kPlain, kSoftcap, kAny, kDropout };

// P = exp(S - lse), dS = P * (dP - D) * softcap'(S) from the S and dP
// accumulators of one warp, stored as 16-bit into the shared P and dS tiles.
// ALiBi adds its bias to the logit (its derivative is 1: dS is unchanged).
// Dropout (z = keep / (1 - p)): the P tile holds P z (dV += (P z)^T dO) and
// dS = P (z dP - D) (attention/dropout.h).
// full: every (row, key) of the tile is visible; else each row's visible keys
// [lo, hi) come from the MaskPolicy, and pairs drops those a block mask does
// not list (query_walk.cuh; none without one). keep: the dropout keep bits of
// rows g, g + 8 of each m16 tile (dropout.cuh; read by kDropout only).
template <ScoreMode kMode, int PS, typename T, int MT, int NT, class Pairs>
__device__ __forceinline__ void scores_to_p_ds(float (&acc_s)[MT][NT][4],
                                               const float (&acc_dp)[MT][NT][4],
                                               const ScoreArgs& a, bool full, const uint32_t (&keep)[MT][2],
                                               const Pairs& pairs) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = a.m0 + mi * 16 + a.g + half * 8;  // row in the tile
      const float lse = ld_shared_f32(a.lse + 4u * r);
      // lse = -inf: the row sees no key; +inf makes every P of it 0.
      const float lse_log2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      const float row_d = ld_shared_f32(a.row_d + 4u * r);
      // Partly visible tiles: invisible scores become -inf first (P = 0,
      // dS = 0), so fully visible tiles, the common case, test nothing.
      if (!full) {
        const int i = a.q0 + r;
        // Visible keys of this row, relative to the tile: [lo, hi).
        const int lo = max(a.mask.first_key(i), 0) - a.k0;
        const int hi = i < a.seqlen_q ? min(a.mask.end_key(i), a.seqlen_k) - a.k0 : lo;
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = a.n0 + ni * 8 + 2 * a.t + e;
            if (c < lo || c >= hi || !pairs.listed(mi, half, 2 * ni + e)) acc_s[mi][ni][half * 2 + e] = -INFINITY;
          }
      }
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        const int c = a.n0 + ni * 8 + 2 * a.t;  // key in the tile
        float pv[2], dsv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = acc_s[mi][ni][half * 2 + e];
          float pr, dcap = 1.0f;
          if constexpr (kMode == ScoreMode::kSoftcap) {
            const float th = tanhf(x * a.inv_cap);
            pr = x == -INFINITY ? 0.0f : fast_exp2(a.softcap * th * kLog2e - lse_log2);
            dcap = 1.0f - th * th;
          } else if constexpr (kMode == ScoreMode::kAny || kMode == ScoreMode::kDropout) {
            // logit * log2 e = softcap(scale x) log2 e + bias log2 e
            float logit2 = x * a.scale_log2;
            if (a.softcap > 0.0f) {
              const float th = tanhf(x * a.inv_cap);
              logit2 = a.softcap * th * kLog2e;
              dcap = 1.0f - th * th;
            }
            logit2 = a.alibi_log2(logit2, a.q0 + r, a.k0 + c + e);
            pr = x == -INFINITY ? 0.0f : fast_exp2(logit2 - lse_log2);
          } else {
            pr = fast_exp2(x * a.scale_log2 - lse_log2);  // exp2(-inf) = 0 where masked
          }
          float dp = acc_dp[mi][ni][half * 2 + e];
          pv[e] = pr;
          if constexpr (kMode == ScoreMode::kDropout) {
            const float z = sm80::dropout_factor(keep[mi][half], 2 * ni + e, a.drop.scale);
            pv[e] = pr * z;
            dp *= z;
          }
          dsv[e] = pr * (dp - row_d) * dcap;
        }
        st_shared_b32(a.p + 2u * (r * PS + c), MmaType<T>::pack(pv[0], pv[1]));
        st_shared_b32(a.ds + 2u * (r * PS + c), MmaType<T>::pack(dsv[0], dsv[1]));
      }
    }
  }
}

// ---------------------------------------------------------------- kernel

template <int D>
struct SharedLayout {
  using C = Config<D>;
  static constexpr int kKV = C::kBlockN * C::kRowStride;  // elements, K or V
  static constexpr int kP = C::kBlockM * C::kPStride;     // elements, P or dS
  static constexpr int kQ = C::kBlockM * C::kRowStride;   // elements, Q or dO
  // Bytes: K, V, P, dS, then per stage Q, dO (16-bit) and lse, D (f32).
  static constexpr int kFixedBytes = 2 * (2 * kKV + 2 * kP);
  static constexpr int kStageBytes = 2 * 2 * kQ + 2 * 4 * C::kBlockM;
  static constexpr int bytes(int stages) { return kFixedBytes + stages * kStageBytes; }
};

// Drop: sm80::NoDropout or sm80::PhiloxDropout (dropout.cuh); Walk:
// DenseQueries, or ListedQueries with a block mask (query_walk.cuh; `tiles`,
// else unread). Both chosen at launch.
template <int D, typename T, class Drop, class Walk>
__global__ void __launch_bounds__(kThreads, 1)
    backward_main_kernel(const __grid_constant__ AttentionParams p, const Workspace ws, int stages,
                         const typename Walk::Tiles tiles) {
  using C = Config<D, Walk::kListed>;
  using L = SharedLayout<D>;
  constexpr int BM = C::kBlockM, BN = C::kBlockN, RS = C::kRowStride, PS = C::kPStride;
  // Warp tiles of the three output shapes.
  constexpr int kSdpWM = C::kSdpWarpsM, kSdpWN = kWarps / kSdpWM;
  constexpr int kSdpCols = BN / kSdpWN / C::kSdpSplits;  // warp tile columns per slice
  constexpr int kSdpMT = BM / kSdpWM / 16, kSdpNT = kSdpCols / 8;
  constexpr int kKvWM = C::kDkvWarpsM, kKvWN = kWarps / kKvWM;
  constexpr int kKvMT = BN / kKvWM / 16, kKvNT = D / kKvWN / 8;
  constexpr int kDqWM = C::kDqWarpsM, kDqWN = kWarps / kDqWM, kDqCols = D / C::kDqSplits;
  constexpr int kDqMT = BM / kDqWM / 16, kDqNT = kDqCols / kDqWN / 8;
  static_assert(kSdpMT >= 1 && kKvMT >= 1 && kDqMT >= 1, "warp tiles of at least 16 rows");

  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + L::kKV;
  T* sP = sV + L::kKV;
  T* sdS = sP + L::kP;
  unsigned char* stage_base = smem + L::kFixedBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // Deterministic mode dispatches the highest key tile first (see NOTES); the
  // atomic mode the lowest, which under a causal mask is the longest walk, so
  // the long CTAs start first and the short ones fill the tail.
  const int n_tile = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int hk = blockIdx.y, b = blockIdx.z;
  const SequenceInfo seq = sequence_info(p, b);
  const int k0 = n_tile * BN;
  if (k0 >= seq.seqlen_k) return;
  const MaskPolicy mask = mask_for(p, seq);
  const int kv_rows = min(BN, seq.seqlen_k - k0);
  const bool varlen = p.is_varlen();
  const int group = p.group_size();
  const int m_begin = mask.query_begin(k0) / BM;
  const int m_end = (mask.query_end(k0 + kv_rows) + BM - 1) / BM;
  // The (query head, query tile) steps of this key tile (query_walk.cuh).
  const typename Walk::Cta walk(p, tiles, WalkPlace{b, hk, group, n_tile, m_begin, m_end});
  const int iters = walk.count();

  const T* gq = static_cast<const T*>(p.q);
  const T* gdo = static_cast<const T*>(p.dout);
  // K and V of this tile: loaded once (with a block mask, not at all when no
  // query tile lists it).
  if (!Walk::kListed || iters > 0) {
    load_rows_async<BN, D, RS>(sK,
                               static_cast<const T*>(p.k) +
                                   row_offset(b, seq.row_k, k0, hk, p.k_batch_stride,
                                              p.k_row_stride, p.k_head_stride, varlen),
                               p.k_row_stride, kv_rows, p.head_dim, tid);
    load_rows_async<BN, D, RS>(sV,
                               static_cast<const T*>(p.v) +
                                   row_offset(b, seq.row_k, k0, hk, p.v_batch_stride,
                                              p.v_row_stride, p.v_head_stride, varlen),
                               p.v_row_stride, kv_rows, p.head_dim, tid);
  }
  cp_async_commit();

  // Issues the loads of step `it` (query head, query tile) into `stage`.
  auto load_stage = [&](int it, int stage) {
    const QueryStep s = walk.step(it);
    const int h = s.h;
    const int q0 = s.m * BM;
    const int rows = min(BM, seq.seqlen_q - q0);
    unsigned char* base = stage_base + stage * L::kStageBytes;
    T* sQ = reinterpret_cast<T*>(base);
    T* sdO = sQ + L::kQ;
    float* sLse = reinterpret_cast<float*>(sdO + L::kQ);
    float* sD = sLse + BM;
    load_rows_async<BM, D, RS>(
        sQ, gq + row_offset(b, seq.row_q, q0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride, varlen),
        p.q_row_stride, rows, p.head_dim, tid);
    load_rows_async<BM, D, RS>(
        sdO, gdo + row_offset(b, seq.row_q, q0, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride, varlen),
        p.do_row_stride, rows, p.head_dim, tid);
    if (tid < BM) {
      const bool valid = tid < rows;
      const float* src = valid ? p.lse + lse_offset(p, b, seq.row_q, q0 + tid, h) : p.lse;
      cp_async_4(smem_addr(sLse + tid), src, valid);
    } else if (tid < 2 * BM) {
      const int r = tid - BM;
      const bool valid = r < rows;
      const float* src = valid ? ws.row_d + static_cast<int64_t>(h) * p.total_q + seq.row_q + q0 + r : ws.row_d;
      cp_async_4(smem_addr(sD + r), src, valid);
    }
  };

  float acc_dk[kKvMT][kKvNT][4], acc_dv[kKvMT][kKvNT][4];
  zero(acc_dk);
  zero(acc_dv);

  if (iters > 0) load_stage(0, 0);
  cp_async_commit();

  const float scale_log2 = ws.scale_log2;
  const bool softcap = p.softcap > 0.0f;
  const float inv_cap = ws.inv_softcap;
  // ALiBi of query head h in base 2 (the walk visits the group's query heads).
  const bool alibi = p.has_alibi();
  auto alibi_log2 = [&](int h) {
    return AlibiScore{alibi ? p.alibi_slope(b, h) * kLog2e : 0.0f, seq.seqlen_k - seq.seqlen_q};
  };

  // This warp's tile origins.
  const int sdp_m0 = (warp / kSdpWN) * (BM / kSdpWM), sdp_n0 = (warp % kSdpWN) * (BN / kSdpWN);
  const int kv_m0 = (warp / kKvWN) * (BN / kKvWM), kv_n0 = (warp % kKvWN) * (D / kKvWN);
  const int dq_m0 = (warp / kDqWN) * (BM / kDqWM), dq_n0 = (warp % kDqWN) * (kDqCols / kDqWN);
  const uint32_t aK = smem_addr(sK), aV = smem_addr(sV), aP = smem_addr(sP), adS = smem_addr(sdS);

  for (int it = 0; it < iters; ++it) {
    // NOTES: two barriers per query tile. With two stages the prefetch of tile
    // it+1 is issued after this barrier, into the stage tile it-1 used, which
    // every warp has finished with once it is here; P/dS are rewritten only
    // after the next barrier too. One stage (small shared memory) has to load
    // tile it here, after the barrier that closed tile it-1.
    const int stage = stages == 2 ? (it & 1) : 0;
    if (stages == 1 && it > 0) {
      load_stage(it, 0);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
    if (stages == 2 && it + 1 < iters) {
      load_stage(it + 1, (it + 1) & 1);
      cp_async_commit();
    }

    const QueryStep here = walk.step(it);
    const int h = here.h;
    const int m = here.m;
    const int q0 = m * BM;
    unsigned char* base = stage_base + stage * L::kStageBytes;
    T* sQ = reinterpret_cast<T*>(base);
    T* sdO = sQ + L::kQ;
    const uint32_t aQ = smem_addr(sQ), adO = smem_addr(sdO);
    const uint32_t aLse = adO + 2u * L::kQ, aD = aLse + 4u * BM;

    // S = Q K^T, dP = dO V^T, in kSdpSplits column slices of the warp tile
    // (see config.h), each turned into P and dS before the next.
    const bool full = mask.tile_fully_visible(q0, q0 + BM, k0, k0 + BN) && here.full;
    // Deterministic mode: the key tile whose dQ share of (h, m) this one's
    // follows (see NOTES; with a block mask the next-higher one listing it,
    // found here, before the products' registers are live).
    const int n_before = walk.key_tile_before(h, m, n_tile, (seq.seqlen_k + BN - 1) / BN);
#pragma unroll
    for (int split = 0; split < C::kSdpSplits; ++split) {
      const int n0 = sdp_n0 + split * kSdpCols;
      float acc_s[kSdpMT][kSdpNT][4], acc_dp[kSdpMT][kSdpNT][4];
      uint32_t keep[kSdpMT][2];  // dropout's keep bits (below)
      // With a block mask, which of the slice's pairs it lists: also before S and dP.
      const auto pairs =
          walk.template slice_pairs<kSdpMT, kSdpNT>(h, q0 + sdp_m0 + g, k0 + n0 + 2 * t, here.full, seq);
      zero(acc_s);
      zero(acc_dp);
      warp_gemm2<kSdpMT, kSdpNT, D, false, false, T>(acc_s, acc_dp, aQ + 2u * sdp_m0 * RS,
                                                     adO + 2u * sdp_m0 * RS, RS, aK + 2u * n0 * RS,
                                                     aV + 2u * n0 * RS, RS, lane);
      // Dropout keep bits of the slice (dropout.cuh), after S and dP (before
      // them, the d 256 kernel spilled 76 bytes with one call per 32 keys).
      if constexpr (Drop::kOn) {
#pragma unroll
        for (int mi = 0; mi < kSdpMT; ++mi)
          sm80::dropout_keep_bits<kSdpNT>(p.dropout, b * p.heads_q + h, q0 + sdp_m0 + mi * 16 + g, k0 + n0, t,
                                          keep[mi]);
      }
      // Masking, softcap and ALiBi are runtime options; the per-element code
      // is specialized by ScoreMode (plain, softcap, any with ALiBi) only;
      // dropout is the kernel's Drop policy (kDropout, softcap and ALiBi at run time).
      const ScoreArgs sa{p.softcap, inv_cap, scale_log2, alibi_log2(h), aLse, aD, aP, adS, sdp_m0, n0,
                         g, t, q0, k0, seq.seqlen_q, seq.seqlen_k, mask, p.dropout};
      if constexpr (Drop::kOn) scores_to_p_ds<ScoreMode::kDropout, PS, T>(acc_s, acc_dp, sa, full, keep, pairs);
      else if (alibi) scores_to_p_ds<ScoreMode::kAny, PS, T>(acc_s, acc_dp, sa, full, keep, pairs);
      else if (softcap) scores_to_p_ds<ScoreMode::kSoftcap, PS, T>(acc_s, acc_dp, sa, full, keep, pairs);
      else scores_to_p_ds<ScoreMode::kPlain, PS, T>(acc_s, acc_dp, sa, full, keep, pairs);
    }
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q: A = P^T / dS^T (P, dS stored [query][key]),
    // B = dO / Q (stored [query][dim]): both operands k-major.
    warp_gemm2<kKvMT, kKvNT, BM, true, true, T>(acc_dv, acc_dk, aP + 2u * kv_m0, adS + 2u * kv_m0, PS,
                                                 adO + 2u * kv_n0, aQ + 2u * kv_n0, RS, lane);

    // dQ share = dS K: A = dS stored [query][key], B = K stored [key][dim];
    // added into the f32 accumulator with atomics (rows of this sequence only).
    {
      float* dq_base = ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + seq.row_q + q0) * D;
      const int rows_valid = min(BM, seq.seqlen_q - q0);
#pragma unroll
      for (int split = 0; split < C::kDqSplits; ++split) {
        const int col0 = split * kDqCols + dq_n0;
        float acc_dq[kDqMT][kDqNT][4];
        zero(acc_dq);
        warp_gemm<kDqMT, kDqNT, BN, false, true, T>(acc_dq, adS + 2u * dq_m0 * PS, PS,
                                                    aK + 2u * col0, RS, lane);
        // Deterministic mode: the same atomics in a fixed order (see NOTES):
        // wait for the next-higher key tile that sees this query tile to publish
        // (the wait is for "the tile after" n_before).
        if (split == 0 && p.deterministic) wait_for_predecessor(p, ws, mask, b, h, m, n_before, BM, BN, seq.seqlen_k);
#pragma unroll
        for (int mi = 0; mi < kDqMT; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = dq_m0 + mi * 16 + g + half * 8;
            if (r < rows_valid) {
#pragma unroll
              for (int ni = 0; ni < kDqNT; ++ni) {
                float* dst = dq_base + r * D + col0 + ni * 8 + 2 * t;
                red_add_f32x2(dst, acc_dq[mi][ni][half * 2], acc_dq[mi][ni][half * 2 + 1]);
              }
            }
          }
      }
      if (p.deterministic) {
        // The adds precede the barrier, the barrier thread 0's release store:
        // the release is cumulative, no fence per thread (sm90/bwd/dq.cuh NOTES).
        __syncthreads();
        if (tid == 0) publish_dq_turn(ws.dq_semaphore(p, b, h, m), n_tile);
      }
    }
    if (stages == 1) __syncthreads();  // the single stage is reloaded next
  }

  // dK, dV: f32 registers -> 16-bit rows (columns < head_dim, keys < kv_rows);
  // rows stored Inf or NaN are recomputed exactly (common/nonfinite.cuh).
  T* gdk = static_cast<T*>(p.dk) + row_offset(b, seq.row_k, k0, hk, p.dk_batch_stride,
                                              p.dk_row_stride, p.dk_head_stride, varlen);
  T* gdv = static_cast<T*>(p.dv) + row_offset(b, seq.row_k, k0, hk, p.dv_batch_stride,
                                              p.dv_row_stride, p.dv_head_stride, varlen);
  uint32_t bits = 0;  // nonfinite::nonfinite_bits of every value stored
#pragma unroll
  for (int mi = 0; mi < kKvMT; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kv_m0 + mi * 16 + g + half * 8;
      if (r < kv_rows) {
#pragma unroll
        for (int ni = 0; ni < kKvNT; ++ni) {
          const int c = kv_n0 + ni * 8 + 2 * t;
          if (c < p.head_dim) {
            const uint32_t dk2 = MmaType<T>::pack(acc_dk[mi][ni][half * 2] * p.scale,
                                                  acc_dk[mi][ni][half * 2 + 1] * p.scale);
            const uint32_t dv2 = MmaType<T>::pack(acc_dv[mi][ni][half * 2], acc_dv[mi][ni][half * 2 + 1]);
            bits |= nonfinite::nonfinite_bits<T>(dk2) | nonfinite::nonfinite_bits<T>(dv2);
            *reinterpret_cast<uint32_t*>(gdk + r * p.dk_row_stride + c) = dk2;
            *reinterpret_cast<uint32_t*>(gdv + r * p.dv_row_stride + c) = dv2;
          }
        }
      }
    }
  if (__syncthreads_or(bits != 0))  // rare: the whole CTA, after every thread's stores
    nonfinite::fix_dkdv_tile<T>(p, nonfinite::pairs_of<C::kBlockM, C::kBlockN>(tiles), ws.row_d, b, hk, k0, kv_rows);
}

// Launches backward_main_kernel<D, T, Drop, Walk> over `grid` on p.stream.
template <int D, typename T, class Drop, class Walk>
fa_status launch_main(const AttentionParams& p, const Workspace& ws, dim3 grid, int stages, int bytes,
                      const typename Walk::Tiles& tiles) {
  auto kernel = backward_main_kernel<D, T, Drop, Walk>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    return fail(FA_ERROR_DEVICE, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err));
  }
  kernel<<<grid, kThreads, bytes, static_cast<cudaStream_t>(p.stream)>>>(p, ws, stages, tiles);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(FA_ERROR_DEVICE, std::string("backward kernel launch: ") + cudaGetErrorString(err));
  }
  return FA_OK;
}

template <int D, typename T>
fa_status run_main(const AttentionParams& p, const Workspace& ws) {
  using C = Config<D>;
  const int optin = current_device_smem_optin();
  // NOTES: FLASHATTN_BWD_SINGLE_STAGE=1 forces the single-buffered path that
  // devices with less shared memory (A100: 163 KB) take, so that path is
  // tested on any GPU (tests/gpu/test_cuda_backward.cpp); it is no tuning knob.
  const bool force_single = env_switch("FLASHATTN_BWD_SINGLE_STAGE");
  const int stages = !force_single && SharedLayout<D>::bytes(2) <= optin ? 2 : 1;
  const int bytes = SharedLayout<D>::bytes(stages);
  if (bytes > optin) {
    return fail(FA_ERROR_UNSUPPORTED, "the backward kernel for head dim " + std::to_string(D) +
                                          " needs " + std::to_string(bytes) +
                                          " bytes of shared memory; the device has " +
                                          std::to_string(optin));
  }
  const dim3 grid((p.seqlen_k + C::kBlockN - 1) / C::kBlockN, p.heads_kv, p.batch);
  if (grid.x == 0 || grid.z == 0) return FA_OK;
  // Dropout and block masks run their own instantiations: the kernel without
  // them is unchanged. Both together run a third (the Hopper backward sends
  // them here: supports_backward).
  if (p.has_block_mask()) {
    BlockTileBuffer block_tiles;
    FA_RETURN_IF_ERROR(block_tiles.build(p, C::kBlockM, C::kBlockN, BlockWalk::kBackward));
    if (p.has_dropout()) {
      return launch_main<D, T, sm80::PhiloxDropout, ListedQueries>(p, ws, grid, stages, bytes, block_tiles.view());
    }
    return launch_main<D, T, sm80::NoDropout, ListedQueries>(p, ws, grid, stages, bytes, block_tiles.view());
  }
  if (p.has_dropout()) return launch_main<D, T, sm80::PhiloxDropout, DenseQueries>(p, ws, grid, stages, bytes, {});
  return launch_main<D, T, sm80::NoDropout, DenseQueries>(p, ws, grid, stages, bytes, {});
}

}  // namespace flashattn::cuda::bwd
