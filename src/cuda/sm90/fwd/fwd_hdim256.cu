// Hopper forward instantiations for head dim 256 (one file per head dim so they build in parallel).
#include "cuda/sm90/fwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template fa_status launch_forward<256, __half>(const AttentionParams&, const KvPages&);
template fa_status launch_forward<256, __nv_bfloat16>(const AttentionParams&, const KvPages&);
template size_t forward_workspace_bytes<256>(const AttentionParams&);
}  // namespace flashattn::cuda::sm90
