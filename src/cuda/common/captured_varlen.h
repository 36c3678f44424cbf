// Variable-length calls captured into a CUDA graph. Their cu_seqlens were not
// checked on the host (nothing can be copied back during capture, and each
// replay may bring new values), so the call's first kernel writes a checked
// copy into stream-ordered memory and every kernel of the call reads that:
//   out[0] = 0,  out[b + 1] = clamp(cu[b + 1], out[b], min(out[b] + max_seqlen, total))
// Valid offsets are copied unchanged; bad ones give wrong rows for their
// sequences, never an access outside the tensors.
// NOTES: a copy rather than clamps in the kernels' sequence_info: clamping
// there changed the register allocation of kernels at their limit (the sm80
// d256 backward spilled 8 bytes, the Hopper d128 dropout backward 40 more),
// and every eager call would have paid for what only captured calls need.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {

class CapturedVarlen {
 public:
  CapturedVarlen() = default;
  CapturedVarlen(const CapturedVarlen&) = delete;
  CapturedVarlen& operator=(const CapturedVarlen&) = delete;
  ~CapturedVarlen() { release(); }

  // Points p's cu_seqlens at a checked copy when p is varlen and its stream
  // is being captured; otherwise leaves p as it is.
  fa_status prepare(AttentionParams* p);
  // Frees the copy after the work queued so far (stream-ordered).
  fa_status release();

 private:
  int32_t* copy_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace flashattn::cuda
