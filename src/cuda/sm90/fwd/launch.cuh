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
#include "cuda/common/block_tiles.h"
#include "cuda/sm90/fwd/kernel.cuh"
#include "cuda/sm90/fwd/launch.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// The split-tail kernel, launched right after the main one with programmatic
// stream serialization: its CTAs take the SMs as the main kernel's exit (the
// tail does not read what the main kernel writes, except the part counters it
// zeroes: merge_split_part waits for the main grid before counting). Without
// that launch attribute (a driver or graph that refuses it), a plain launch.
template <class Tune, typename T, int C, int N, class Drop>
cudaError_t launch_split_tail(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                              const CUtensorMap& mo, const AttentionParams& p, FwdArgs a, int grid) {
  using K = FwdTraits<Tune, C, N>;
  auto kernel = forward_kernel<Tune, T, C, N, true, false, Drop>;
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

// One launch of a main (not split-tail) kernel of shape K.
template <class K, typename Kernel, typename... Args>
cudaError_t launch_main(Kernel kernel, int grid, cudaStream_t stream, const Args&... args) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(args...);
  return cudaGetLastError();
}

// The work plan of one call on the instantiation (Tune, C, N): the grid, the
// tile order and the split tail, and the bytes of the split tail's workspace
// (0 without one). The launch and the workspace query share it.
struct ForwardPlan {
  FwdArgs a{};
  int grid = 0;               // 0: nothing to do
  size_t workspace_bytes = 0; // [O, max and sum slots][part counters] of the split tail
  size_t o_bytes = 0;         // where the part counters start
};

template <class Tune, int C, int N>
fa_status plan_forward(const AttentionParams& p, ForwardPlan& plan) {
  using K = FwdTraits<Tune, C, N>;
  constexpr int D = K::kHeadDim;
  FwdArgs& a = plan.a;
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
  const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device_index);
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

  // Split tail (attention/work_plan.h): where every tile costs the same (no
  // mask, fixed lengths), the main kernel walks the whole rounds and a second
  // kernel the last round's tiles cut along the keys over all CTAs, merging a
  // tile's parts through the workspace.
  constexpr bool kHasSplitTail = Tune::kSplitTail && N == Tune::kLongBlockN;
  const int key_tiles = (p.seqlen_k + K::kBlockN - 1) / K::kBlockN;
  // (Per-sequence key counts, seqused_k, and block masks: tiles of unequal cost.)
  const bool uniform = !p.has_mask() && !p.is_varlen() && p.seqused_k == nullptr && !p.has_block_mask();
  a.tail = plan_split_tail(static_cast<int>(tiles), grid, key_tiles,
                           kHasSplitTail && uniform && p.seqlen_k >= kSplitTailMinKeys);
  a.part_o = nullptr;
  a.part_count = nullptr;
  if (a.tail.tiles > 0) {
    const size_t warps = 4 * K::kConsumers;
    const size_t slot_bytes = warps * 32 * (D / 2 + 4) * sizeof(float);
    plan.o_bytes = static_cast<size_t>(a.tail.tiles) * a.tail.max_parts * slot_bytes;
    plan.workspace_bytes = plan.o_bytes + static_cast<size_t>(a.tail.tiles) * warps * sizeof(int);
  }
  plan.grid = grid;
  return FA_OK;
}

// The K and V maps: over the call's K/V, boxes of a key tile; or, paged, over
// the pool's pages (d, page_size, heads_kv, num_pages as the batch), boxes of
// min(page_size, kBlockN) rows, the pieces of a key tile the producer loads.
template <int kBlockN>
fa_status make_kv_maps(CUtensorMap* mk, CUtensorMap* mv, const AttentionParams& p, const KvPages& pages) {
  if (pages.block_table == nullptr) {
    FA_RETURN_IF_ERROR(make_call_map(mk, p, CallTensor::kK, p.head_dim, kBlockN));
    return make_call_map(mv, p, CallTensor::kV, p.head_dim, kBlockN);
  }
  const int page = pages.page_size;  // api.h's pages_fit, for this instantiation's key tile
  if (page != 1 << pages.page_shift || page < 8 || (kBlockN % page != 0 && page % kBlockN != 0))
    return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: the page size does not fit the key tile");
  AttentionParams pool = p;
  pool.batch = pages.num_pages;
  const uint32_t box = static_cast<uint32_t>(page < kBlockN ? page : kBlockN);
  FA_RETURN_IF_ERROR(make_attention_map(
      mk, pool, {p.k, page, p.heads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride}, p.head_dim, box));
  return make_attention_map(
      mv, pool, {p.v, page, p.heads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride}, p.head_dim, box);
}

// Drop: NoDropout or PhiloxDropout (cuda/sm90/dropout.cuh); dropout never takes the
// KV-cache route (api.cu's supports_forward). Walk: DenseKeys, or ListedKeys
// for a block mask, with or without dropout (no KV cache: the KV-cache API
// refuses block masks).
template <class Tune, typename T, int C, int N, class Drop, class Walk = DenseKeys>
fa_status launch_kernel(const AttentionParams& p, const KvPages& pages) {
  using K = FwdTraits<Tune, C, N>;
  constexpr int D = K::kHeadDim;
  if (p.head_dim > D || p.head_dim <= 0 || p.head_dim % 8 != 0)
    return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: head_dim does not fit this kernel");
  const bool varlen = p.is_varlen();
  // Tensor maps (d, rows, heads, batch); varlen: rows = all tokens, batch 1.
  // d is the real head dim: TMA zero-fills the box columns past it.
  CUtensorMap mq, mk, mv, mo;
  FA_RETURN_IF_ERROR(make_call_map(&mq, p, CallTensor::kQ, p.head_dim, K::kBlockM));
  FA_RETURN_IF_ERROR(make_kv_maps<K::kBlockN>(&mk, &mv, p, pages));
  // O, 64 rows per box (one consumer warpgroup's rows); only where the
  // kernel stores through TMA (not varlen), else an unused copy of Q's map.
  if (K::kOTma && !varlen) {
    FA_RETURN_IF_ERROR(make_call_map(&mo, p, CallTensor::kOut, p.head_dim, 64));
  } else {
    mo = mq;
  }

  ForwardPlan plan;
  if (const fa_status s = plan_forward<Tune, C, N>(p, plan); s != FA_OK) return s;
  if (plan.grid == 0) return FA_OK;
  FwdArgs& a = plan.a;
  a.pages = pages;
  // A block mask's lists on this kernel's tiles, on the device until the
  // launch has read them (freed stream-ordered, block_tiles.h).
  BlockTileBuffer block_tiles;
  if constexpr (Walk::kListed) {
    FA_RETURN_IF_ERROR(block_tiles.build(p, K::kBlockM, K::kBlockN, BlockWalk::kForward, plan.grid));
    a.num_steps = block_tiles.view().schedule.steps;  // (the schedule's, not the tile order's rounds)
  }
  const int grid = plan.grid;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  // The split tail's workspace from the stream-ordered pool (reported by
  // forward_workspace_bytes, fa_forward_workspace_size's answer on CUDA).
  void* workspace = nullptr;
  if (plan.workspace_bytes > 0) {
    if (cudaMallocAsync(&workspace, plan.workspace_bytes, stream) == cudaSuccess) {
      a.part_o = static_cast<float*>(workspace);
      a.part_count = reinterpret_cast<int*>(static_cast<uint8_t*>(workspace) + plan.o_bytes);
      a.num_steps = a.tail.first_rank / grid;
    } else {
      // No workspace (out of memory, no stream-ordered allocator): whole tiles only.
      cudaGetLastError();
      workspace = nullptr;
      a.tail.tiles = 0;
    }
  }

  cudaError_t err = cudaSuccess;
  if constexpr (Walk::kListed) {
    err = launch_main<K>(block_sparse_forward_kernel<Tune, T, C, N, Drop>, grid, stream, mq, mk, mv, mo, p, a,
                         block_tiles.view());
  } else {
    // The KV-cache route (seqused_k set) runs the cache-source kernel (traits.h).
    auto kernel = forward_kernel<Tune, T, C, N, false, false, Drop>;
    if constexpr (!Drop::kOn) {
      if (p.seqused_k != nullptr) kernel = forward_kernel<Tune, T, C, N, false, true>;
    }
    err = launch_main<K>(kernel, grid, stream, mq, mk, mv, mo, p, a);
  }
  if constexpr (Tune::kSplitTail && N == Tune::kLongBlockN) {
    if (err == cudaSuccess && a.tail.tiles > 0) err = launch_split_tail<Tune, T, C, N, Drop>(mq, mk, mv, mo, p, a, grid);
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
// says why), except over pages (paged: pages_fit, api.cu, holds for kBlockN).
// visit_instantiation calls v.template run<Tune, C, N>() for the
// instantiation a call of head dim D takes.
// With dropout, kDropoutConsumers warpgroups (tuning.h) and kBlockN-key tiles:
// the Philox call covers 32 keys (fwd/dropout.cuh), which a 176-key tile
// splits, so every such tile makes one call whose half it drops.
// A block mask: kBlockSparseConsumers warpgroups, kBlockN-key tiles (with
// dropout too: those are dropout's shape, LaunchVisitor checks it).
template <int D, class Visitor>
fa_status visit_instantiation(const AttentionParams& p, Visitor& v, bool paged = false) {
  using Tune = ForwardTuning<D>;
  if (p.has_block_mask()) return v.template run<Tune, kBlockSparseConsumers, Tune::kBlockN>();
  if (p.has_dropout()) return v.template run<Tune, Tune::kDropoutConsumers, Tune::kBlockN>();
  if constexpr (Tune::kCausalConsumers != Tune::kConsumers) {
    if (p.window_right == 0) return v.template run<Tune, Tune::kCausalConsumers, Tune::kBlockN>();
  }
  if constexpr (Tune::kLongBlockN != Tune::kBlockN) {
    if (paged) return v.template run<Tune, Tune::kConsumers, Tune::kBlockN>();
    // The middle query row's keys: the length of a typical query tile's K/V
    // walk (seqlen_k without a mask, about half of it causal; varlen: of the
    // longest sequences).
    const MaskPolicy mask = mask_for(p, {p.seqlen_q, p.seqlen_k, 0, 0});
    if (mask.keys_of_row(p.seqlen_q / 2) >= Tune::kLongKeys)
      return v.template run<Tune, Tune::kConsumers, Tune::kLongBlockN>();
  }
  return v.template run<Tune, Tune::kConsumers, Tune::kBlockN>();
}

template <typename T>
struct LaunchVisitor {
  const AttentionParams& p;
  const KvPages& pages;
  // Dropout runs its own instantiation (cuda/sm90/dropout.cuh; only on
  // kDropoutConsumers warpgroups): the plain kernel is the one before it.
  template <class Tune, int C, int N>
  fa_status run() const {
    if constexpr (C == kBlockSparseConsumers && N == Tune::kBlockN) {
      static_assert(kBlockSparseConsumers == Tune::kDropoutConsumers, "a block mask with dropout: one shape");
      if (p.has_block_mask() && p.has_dropout()) return launch_kernel<Tune, T, C, N, PhiloxDropout, ListedKeys>(p, pages);
      if (p.has_block_mask()) return launch_kernel<Tune, T, C, N, NoDropout, ListedKeys>(p, pages);
    }
    if constexpr (C == Tune::kDropoutConsumers && N == Tune::kBlockN) {
      if (p.has_dropout()) return launch_kernel<Tune, T, C, N, PhiloxDropout>(p, pages);
    }
    if (p.has_dropout()) return fail(FA_ERROR_UNSUPPORTED, "sm90 forward: no dropout kernel for this shape");
    return launch_kernel<Tune, T, C, N, NoDropout>(p, pages);
  }
};

struct WorkspaceVisitor {
  const AttentionParams& p;
  size_t bytes = 0;
  template <class Tune, int C, int N>
  fa_status run() {
    ForwardPlan plan;
    const fa_status s = plan_forward<Tune, C, N>(p, plan);
    bytes = plan.workspace_bytes;
    return s;
  }
};

template <int D, typename T>
fa_status launch_forward(const AttentionParams& p, const KvPages& pages) {
  LaunchVisitor<T> v{p, pages};
  return visit_instantiation<D>(p, v, pages.block_table != nullptr);
}

template <int D>
size_t forward_workspace_bytes(const AttentionParams& p) {
  WorkspaceVisitor v{p};
  return visit_instantiation<D>(p, v) == FA_OK ? v.bytes : 0;
}

}  // namespace flashattn::cuda::sm90
