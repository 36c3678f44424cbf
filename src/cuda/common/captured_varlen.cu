// The checked copy of a captured varlen call's cu_seqlens (captured_varlen.h).
#include "cuda/common/captured_varlen.h"

#include <string>

#include "core/error.h"

namespace flashattn::cuda {
namespace {

// Thread 0 copies cu_seqlens_q, thread 1 cu_seqlens_k (a sequential scan:
// each offset is clamped against the previous one).
__global__ void clamp_cu_seqlens(const int32_t* cu_q, const int32_t* cu_k, int batch, int64_t total_q,
                                 int64_t total_k, int max_q, int max_k, int32_t* out) {
  if (threadIdx.x > 1) return;
  const bool is_q = threadIdx.x == 0;
  const int32_t* cu = is_q ? cu_q : cu_k;
  const int64_t total = is_q ? total_q : total_k;
  const int max_len = is_q ? max_q : max_k;
  int32_t* o = out + (is_q ? 0 : batch + 1);
  int64_t prev = 0;
  o[0] = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t hi = prev + max_len < total ? prev + max_len : total;
    const int64_t next = cu[b + 1] < prev ? prev : (cu[b + 1] > hi ? hi : cu[b + 1]);
    o[b + 1] = static_cast<int32_t>(next);
    prev = next;
  }
}

fa_status device_error(cudaError_t err, const char* what) {
  cudaGetLastError();
  return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

fa_status CapturedVarlen::prepare(AttentionParams* p) {
  if (!p->is_varlen()) return FA_OK;
  stream_ = static_cast<cudaStream_t>(p->stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream_, &capture);
  if (err != cudaSuccess) return device_error(err, "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusNone) return FA_OK;  // checked on the host
  void* mem = nullptr;
  err = cudaMallocAsync(&mem, 2 * (static_cast<size_t>(p->batch) + 1) * sizeof(int32_t), stream_);
  if (err != cudaSuccess) return device_error(err, "cudaMallocAsync of the captured cu_seqlens copy");
  copy_ = static_cast<int32_t*>(mem);
  clamp_cu_seqlens<<<1, 32, 0, stream_>>>(p->cu_seqlens_q, p->cu_seqlens_k, p->batch, p->total_q, p->total_k,
                                          p->seqlen_q, p->seqlen_k, copy_);
  err = cudaGetLastError();
  if (err != cudaSuccess) return device_error(err, "cu_seqlens copy launch");
  p->cu_seqlens_q = copy_;
  p->cu_seqlens_k = copy_ + p->batch + 1;
  return FA_OK;
}

fa_status CapturedVarlen::release() {
  if (copy_ == nullptr) return FA_OK;
  const cudaError_t err = cudaFreeAsync(copy_, stream_);
  copy_ = nullptr;
  return err == cudaSuccess ? FA_OK : device_error(err, "cudaFreeAsync of the captured cu_seqlens copy");
}

}  // namespace flashattn::cuda
