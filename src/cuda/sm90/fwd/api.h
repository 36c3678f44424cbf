// The Hopper (sm_90a) forward: wgmma + TMA + warp specialization. The sm80
// forward calls can_run_forward() first and falls back to its own kernels when
// it says no (other GPUs, head dims it has no kernel for, tensors TMA cannot
// describe) or when run_forward returns FA_ERROR_UNSUPPORTED.
#pragma once

#include <cstddef>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// True when the device of p is compute capability 9.0 and p is a shape/dtype
// this kernel handles (f16/bf16, head_dim a multiple of 8 up to 256, non-empty).
bool supports_forward(const AttentionParams& p);

// True when the environment variable FLASHATTN_DISABLE_SM90 is set to a
// non-zero value: every call then runs the sm80 kernels (tests, benchmarks).
bool disabled_by_env();

// supports_forward(p), unless disabled_by_env().
bool can_run_forward(const AttentionParams& p);

// Launches on p.stream. FA_ERROR_UNSUPPORTED means "use the fallback".
fa_status run_forward(const AttentionParams& p);

// Bytes run_forward(p) allocates from the stream-ordered pool (the split
// tail's partial states; 0 for most calls).
size_t forward_workspace_size(const AttentionParams& p);

}  // namespace flashattn::cuda::sm90
