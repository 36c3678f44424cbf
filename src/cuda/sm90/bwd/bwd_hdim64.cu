// Hopper backward instantiations for head dim 64 (one file per head dim so they build in parallel).
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template fa_status launch_backward<64, __half>(const AttentionParams&, const bwd::Workspace&);
template fa_status launch_backward<64, __nv_bfloat16>(const AttentionParams&, const bwd::Workspace&);
}  // namespace flashattn::cuda::sm90
