// Forward kernel instantiations for head dim 64 (one file per head dim so the
// build compiles them in parallel).
#include "cuda/sm80/fwd/launch.cuh"

namespace flashattn::cuda::sm80 {
template fa_status launch_forward<64, __half>(const AttentionParams&);
template fa_status launch_forward<64, __nv_bfloat16>(const AttentionParams&);
}  // namespace flashattn::cuda::sm80
