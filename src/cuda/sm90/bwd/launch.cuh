// The Hopper backward's launch (host): tensor maps (Q, dO, K, V and the f32 dQ
// accumulator for the TMA reduce-adds) and one CTA per (key tile, kv head, sequence).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "core/params.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/block_tiles.h"
#include "cuda/sm90/bwd/kernel.cuh"
#include "cuda/sm90/bwd/launch.h"
#include "cuda/head_dims.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// Deterministic mode: the dQ turns follow the rotated walks (scheduler.cuh
// NOTES) when the mask lets every key tile see every query tile and a head's
// key_tiles CTAs can all be resident at once. A wait may then be on a key tile
// dispatched later, which comes once the CTAs before it end, as long as the
// kernel gets key_tiles SMs (one CTA per SM). Half the SM count leaves the
// other half to kernels beside this one (NCCL's, another stream's) that might
// hold SMs until it ends; p.max_ctas, when smaller, stands for the SM count
// (tests take the other order with it).
inline fa_status plan_dq_turns(const AttentionParams& p, int key_tiles, bwd::Workspace& ws) {
  ws.rotated_turns = 0;
  if (!p.deterministic || p.window_left >= 0 || p.window_right >= 0 || p.has_block_mask()) return FA_OK;
  int sms = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device_index);
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sm90 backward: ") + cudaGetErrorString(err));
  if (p.max_ctas > 0 && p.max_ctas < sms) sms = p.max_ctas;
  ws.rotated_turns = 2 * key_tiles <= sms ? 1 : 0;
  return FA_OK;
}

template <int D, typename T>
fa_status launch_backward(const AttentionParams& p, const bwd::Workspace& ws) {
  using K = BwdTraits<D, T>;
  if (BackwardHeadDims::kernel_for(p.head_dim) != D) return fail(FA_ERROR_UNSUPPORTED, "sm90 backward: head_dim mismatch");
  // Deterministic mode orders the dQ adds (TMA reduce-adds, or the split-d
  // red.global adds) on the sm80 semaphores, whose query tiles must be this
  // kernel's.
  if (p.deterministic && (!(K::kDqTma || K::kSplitD) || ws.dq_sem == nullptr ||
                          ws.q_tiles != (p.seqlen_q + K::kBlockM - 1) / K::kBlockM))
    return fail(FA_ERROR_UNSUPPORTED, "sm90 backward: deterministic mode needs matching dQ semaphores");
  const bool varlen = p.is_varlen();
  // Tensor maps (d, rows, heads, batch); varlen: rows = all tokens, batch 1.
  // Their width is the call's head dim: TMA zero-fills the kernel's columns
  // past it, so they add nothing to S, dP, dV, dK or dQ.
  CUtensorMap mq, mdq, mdo, mk, mv;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  FA_RETURN_IF_ERROR(make_call_map(&mq, p, CallTensor::kQ, p.head_dim, K::kBlockM));
  if constexpr (K::kDqTma) {
    // The f32 dQ accumulator [heads_q][total_q][D] as (D, rows, heads, batch).
    if (ws.accum_dim != D) return fail(FA_ERROR_UNSUPPORTED, "sm90 backward: dQ accumulator width");
    const int64_t row = D * 4;
    const uint64_t dims[4] = {static_cast<uint64_t>(D), static_cast<uint64_t>(rows_q),
                              static_cast<uint64_t>(p.heads_q),
                              static_cast<uint64_t>(varlen ? 1 : p.batch)};
    const uint64_t strides[3] = {static_cast<uint64_t>(row),
                                 static_cast<uint64_t>(p.heads_q == 1 ? row : p.total_q * row),
                                 static_cast<uint64_t>((varlen || p.batch == 1) ? row : p.seqlen_q * row)};
    const uint32_t box[4] = {32, static_cast<uint32_t>(K::kBlockM), 1, 1};
    FA_RETURN_IF_ERROR(make_tma_map_4d(&mdq, ws.dq_accum, FA_F32, dims, strides, box));
  } else {
    mdq = CUtensorMap{};
  }
  FA_RETURN_IF_ERROR(make_call_map(&mdo, p, CallTensor::kDout, p.head_dim, K::kBlockM));
  FA_RETURN_IF_ERROR(make_call_map(&mk, p, CallTensor::kK, p.head_dim, K::kBlockN));
  FA_RETURN_IF_ERROR(make_call_map(&mv, p, CallTensor::kV, p.head_dim, K::kBlockN));

  const dim3 grid((p.seqlen_k + K::kBlockN - 1) / K::kBlockN, p.heads_kv, p.batch);
  if (grid.x == 0 || grid.z == 0) return FA_OK;
  bwd::Workspace wk = ws;
  FA_RETURN_IF_ERROR(plan_dq_turns(p, grid.x, wk));
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaError_t err = cudaSuccess;
  if (p.has_block_mask()) {
    // The steps of the block mask on this kernel's tiles (UNSUPPORTED past
    // their bit fields or 2^31 steps: the sm80 kernel takes the call).
    BlockTileBuffer steps;
    FA_RETURN_IF_ERROR(steps.build(p, K::kBlockM, K::kBlockN, BlockWalk::kGroupSteps));
    auto kernel = p.has_dropout() ? block_sparse_backward_kernel<D, T, PhiloxDropout> : block_sparse_backward_kernel<D, T>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
    if (err == cudaSuccess) {
      kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(mq, mdq, mdo, mk, mv, p, wk, steps.view());
    }
  } else {
    // Dropout, and softcap with ALiBi (never with dropout here: api.cu), run
    // their own instantiations: the plain kernel is the one before them.
    auto kernel = p.has_dropout() ? backward_kernel<D, T, PhiloxDropout> : backward_kernel<D, T>;
    if (p.softcap > 0.0f && p.has_alibi()) kernel = backward_kernel<D, T, NoDropout, SoftcapAlibiMods>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
    if (err == cudaSuccess) kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(mq, mdq, mdo, mk, mv, p, wk);
  }
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sm90 backward: ") + cudaGetErrorString(err));
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sm90 backward launch: ") + cudaGetErrorString(err));
  return FA_OK;
}

}  // namespace flashattn::cuda::sm90
