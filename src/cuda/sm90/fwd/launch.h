// The Hopper forward's launchers, one instantiation per (head dim, dtype) in fwd_hdim*.cu.
// launch_forward<D> takes any head_dim that is a multiple of 8 and at most D.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "core/params.h"
#include "cuda/sm90/fwd/api.h"

namespace flashattn::cuda::sm90 {

// Instantiated in fwd_hdim*.cu (head_dims.h's list); the definition is not
// visible elsewhere, so nothing else instantiates it.
template <int kD, typename T>
fa_status launch_forward(const AttentionParams& p, const KvPages& pages);

// Bytes of the stream-ordered workspace launch_forward<kD, T> allocates for p
// (the split tail's partial states; 0 for most calls).
template <int kD>
size_t forward_workspace_bytes(const AttentionParams& p);

}  // namespace flashattn::cuda::sm90
