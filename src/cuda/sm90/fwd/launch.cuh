// The Hopper forward's launch (host): tensor maps, the work plan (tile order,
// split tail and its workspace), and the choice of instantiation per call.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "attention/mask.h"
#include "core/error.h"
#include "core/layout.h"
#include "core/numeric.h"
#include "core/params.h"
#include "cuda/sm90/fwd/kernel.cuh"
#include "cuda/sm90/fwd/launch.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// The split-tail kernel, launched right after the main one with programmatic
// stream serialization: its CTAs take the SMs as the main kernel's exit (the
// tail does not read what the main kernel writes, except the part counters it
// zeroes: merge_split_part waits for the main grid before counting). Without
// that launch attribute (a driver or graph that refuses it), a plain launch.
template <class Tune, typename T, int C, int N>
cudaError_t launch_split_tail(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                              const CUtensorMap& mo, const AttentionParams& p, FwdArgs a, int grid) {
  using K = FwdTraits<Tune, C, N>;
  auto kernel = forward_kernel<Tune, T, C, N, true>;
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

template <class Tune, typename T, int C, int N>
fa_status launch_kernel(const AttentionParams& p) {
  using K = FwdTraits<Tune, C, N>;
  constexpr int D = K::kHeadDim;
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
                            {kTileOrderRules.balanced_groups, kTileOrderRules.causal_pairs && plain_causal,
                             kTileOrderRules.head_major});

  a.num_steps = a.order.num_rounds;

  // Split tail (schedule.h): where every tile costs the same (no mask, fixed
  // lengths), the main kernel walks the whole rounds and a second kernel the
  // last round's tiles cut along the keys over all CTAs, merging a tile's
  // parts through a workspace: [O, max and sum slots][part counters].
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  constexpr bool kHasSplitTail = Tune::kSplitTail && N == Tune::kLongBlockN;
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

  auto kernel = forward_kernel<Tune, T, C, N, false>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
  if (err == cudaSuccess) {
    kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(mq, mk, mv, mo, p, a);
    err = cudaGetLastError();
  }
  if constexpr (kHasSplitTail) {
    if (err == cudaSuccess && tail.tiles > 0) err = launch_split_tail<Tune, T, C, N>(mq, mk, mv, mo, p, a, grid);
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
// tile on the masked diagonal (5-10% slower than 128-row tiles at 512-4k,
// equal at 8k/16k). Where the middle query row sees at least
// kLongKeys keys, kLongBlockN-key tiles where the tuning has them (tuning.h
// says why).
template <int D, typename T>
fa_status launch_forward(const AttentionParams& p) {
  using Tune = ForwardTuning<D>;
  if constexpr (Tune::kCausalConsumers != Tune::kConsumers) {
    if (p.window_right == 0) return launch_kernel<Tune, T, Tune::kCausalConsumers, Tune::kBlockN>(p);
  }
  if constexpr (Tune::kLongBlockN != Tune::kBlockN) {
    // The middle query row's keys: the length of a typical query tile's K/V
    // walk (seqlen_k without a mask, about half of it causal; varlen: of the
    // longest sequences).
    const MaskPolicy mask = mask_for(p, {p.seqlen_q, p.seqlen_k, 0, 0});
    if (mask.keys_of_row(p.seqlen_q / 2) >= Tune::kLongKeys)
      return launch_kernel<Tune, T, Tune::kConsumers, Tune::kLongBlockN>(p);
  }
  return launch_kernel<Tune, T, Tune::kConsumers, Tune::kBlockN>(p);
}

}  // namespace flashattn::cuda::sm90
