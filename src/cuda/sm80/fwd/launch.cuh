// The sm80 forward's launch (host): grid, shared memory, and the choice
// between the tuned tile shape and its plain-layout fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/params.h"
#include "cuda/common/launch_env.h"
#include "cuda/common/block_tiles.h"
#include "cuda/sm80/fwd/kernel.cuh"
#include "cuda/sm80/fwd/tuning.h"

namespace flashattn::cuda::sm80 {

// Launches the kernel for head dim kD (>= p.head_dim) with tile shape Cfg,
// dropout policy Drop (dropout.cuh) and key walk Walk (key_walk.cuh) on p.stream.
template <int kD, typename T, class Cfg, class Drop, class Walk>
fa_status launch_forward_kernel(const AttentionParams& p, const typename Walk::Tiles& tiles) {
  const int m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t ctas = static_cast<int64_t>(m_blocks) * p.heads_q * p.batch;
  if (ctas == 0) return FA_OK;
  if (ctas > 0x7fffffff) return fail(FA_ERROR_UNSUPPORTED, "too many query blocks for one launch");
  constexpr int kSmem = forward_smem_bytes<Cfg>(kD) + Walk::template smem_bytes<Cfg>();
  auto kernel = forward_kernel<kD, T, Cfg, Drop, Walk>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(FA_ERROR_DEVICE, std::string("forward kernel (head dim ") + std::to_string(kD) +
                                     ") needs " + std::to_string(kSmem) +
                                     " bytes of shared memory: " + cudaGetErrorString(err));
  }
  kernel<<<static_cast<unsigned>(ctas), Cfg::kWarps * 32, kSmem,
           static_cast<cudaStream_t>(p.stream)>>>(p, m_blocks, tiles);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(FA_ERROR_DEVICE, std::string("forward kernel launch: ") + cudaGetErrorString(err));
  }
  return FA_OK;
}

// ListedKeys: the block mask's tile lists for this tile shape go to the
// device first (freed, stream-ordered, after the launch) and the kernel walks them.
template <int kD, typename T, class Cfg, class Drop, class Walk>
fa_status launch_forward_with(const AttentionParams& p) {
  if constexpr (Walk::kListed) {
    BlockTileBuffer tiles;
    FA_RETURN_IF_ERROR(tiles.build(p, Cfg::kBlockM, Cfg::kBlockN, BlockWalk::kForward));
    return launch_forward_kernel<kD, T, Cfg, Drop, Walk>(p, tiles.view());
  } else {
    return launch_forward_kernel<kD, T, Cfg, Drop, Walk>(p, typename Walk::Tiles{});
  }
}

// A tile shape with its warps in the plain layout (no pair split).
template <class Cfg>
struct WithoutPairSplit : Cfg {
  static constexpr bool kPairSplit = false;
};

// Tile shape Cfg, or its plain layout where the pair split does not fit.
template <int kD, typename T, class Cfg, class Drop, class Walk>
fa_status launch_forward_shape(const AttentionParams& p) {
  if constexpr (Cfg::kPairSplit) {
    // NOTES: the pair split's P exchange takes d 256 past the 99 KB of shared
    // memory a CTA gets on sm_86 / sm_89 (RTX 30/40, L40S); those run the
    // plain layout. FLASHATTN_FWD_NO_PAIR_SPLIT=1 forces it, so that it is
    // tested on any GPU (tests/gpu/test_cuda_forward.cpp); it is no tuning knob.
    if (env_switch("FLASHATTN_FWD_NO_PAIR_SPLIT") || forward_smem_bytes<Cfg>(kD) > current_device_smem_optin()) {
      return launch_forward_with<kD, T, WithoutPairSplit<Cfg>, Drop, Walk>(p);
    }
  }
  return launch_forward_with<kD, T, Cfg, Drop, Walk>(p);
}

// Dropout and block masks run their own instantiations (DropoutTuning's and
// BlockSparseTuning's shapes): the kernel without them is the same code as
// before they existed. Both together take BlockSparseDropoutTuning's shapes
// (the Hopper forward sends them here: supports_forward).
template <int kD, typename T>
fa_status launch_forward(const AttentionParams& p) {
  if (p.has_block_mask()) {
    if (p.has_dropout()) return launch_forward_shape<kD, T, BlockSparseDropoutTuning<kD>, PhiloxDropout, ListedKeys>(p);
    return launch_forward_shape<kD, T, BlockSparseTuning<kD>, NoDropout, ListedKeys>(p);
  }
  if (p.has_dropout()) return launch_forward_shape<kD, T, DropoutTuning<kD>, PhiloxDropout, DenseKeys>(p);
  return launch_forward_shape<kD, T, ForwardTuning<kD>, NoDropout, DenseKeys>(p);
}

}  // namespace flashattn::cuda::sm80
