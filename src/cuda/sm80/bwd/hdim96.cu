// The sm80 backward kernel at head dim 96 (head dims up to 96 that no smaller kernel takes).
#include "cuda/sm80/bwd/kernel.cuh"

namespace flashattn::cuda::bwd {
template fa_status run_main<96, __half>(const AttentionParams&, const Workspace&);
template fa_status run_main<96, __nv_bfloat16>(const AttentionParams&, const Workspace&);
}  // namespace flashattn::cuda::bwd
