// The sm80 backward main kernel, one instantiation per (head dim, dtype) in hdim*.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::bwd {

// Main kernel for one kernel head dim and dtype (T = __half or __nv_bfloat16).
template <int D, typename T>
fa_status run_main(const AttentionParams& p, const Workspace& ws);

}  // namespace flashattn::cuda::bwd
