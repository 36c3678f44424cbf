// The CUDA backend's entry points: availability, GPU-specific argument checks,
// and dispatch to the kernel families.
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "core/backends.h"
#include "core/error.h"
#include "cuda/common/device_guard.h"
#include "cuda/head_dims.h"
#include "cuda/common/block_tiles.h"

namespace flashattn::cuda {
namespace {

constexpr int kMinComputeMajor = 8;  // mma.sync bf16 needs sm_80
constexpr int kAlignmentBytes = 16;  // 16-byte vector loads of rows

fa_status cuda_error(cudaError_t err, const char* what) {
  return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
}

fa_status check_device_pointer(const void* ptr, const char* name, int device_index,
                               uintptr_t alignment = kAlignmentBytes) {
  if (ptr == nullptr) return FA_OK;  // empty tensors
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " is not a CUDA pointer");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(name) + " is not device memory (the CUDA backend needs device tensors)");
  }
  if (attr.device != device_index) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " lives on cuda:" +
                                               std::to_string(attr.device) + ", not cuda:" +
                                               std::to_string(device_index));
  }
  if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(name) + " must be " + std::to_string(alignment) +
                                               "-byte aligned for the CUDA kernels");
  }
  return FA_OK;
}

// Rows are read and written 16 bytes at a time, so every row must start 16-byte
// aligned: strides in multiples of 8 (16-bit) elements.
constexpr int64_t kStrideMultiple = kAlignmentBytes / 2;
fa_status check_row_strides(std::initializer_list<int64_t> strides, const char* tensors) {
  for (int64_t s : strides) {
    if (s % kStrideMultiple != 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT, std::string("strides of ") + tensors +
                                                 " must be multiples of 8 elements (16 bytes) on CUDA");
    }
  }
  return FA_OK;
}

fa_status check_common(const AttentionParams& p) {
  if (p.dtype != FA_F16 && p.dtype != FA_BF16) {
    return fail(FA_ERROR_UNSUPPORTED, std::string("the CUDA backend supports f16 and bf16, not ") +
                                          fa_dtype_name(p.dtype));
  }
  if (p.head_dim % kHeadDimMultiple != 0 || p.head_dim > kMaxHeadDim) {
    return fail(FA_ERROR_UNSUPPORTED, "head_dim " + std::to_string(p.head_dim) +
                                          " is not supported: the CUDA backend takes multiples of " +
                                          std::to_string(kHeadDimMultiple) + " up to " +
                                          std::to_string(kMaxHeadDim));
  }
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || p.device_index >= device_count) {
    cudaGetLastError();
    return fail(FA_ERROR_INVALID_ARGUMENT, "cuda:" + std::to_string(p.device_index) + " does not exist");
  }
  // An attribute query, not cudaGetDeviceProperties: this runs on every call.
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device_index);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, p.device_index);
  }
  if (err != cudaSuccess) return cuda_error(err, "cudaDeviceGetAttribute");
  if (major < kMinComputeMajor) {
    return fail(FA_ERROR_UNSUPPORTED, "compute capability " + std::to_string(major) + "." +
                                          std::to_string(minor) +
                                          " is not supported (sm_80 or newer needed)");
  }
  FA_RETURN_IF_ERROR(check_row_strides({p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                                         p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                                         p.v_batch_stride, p.v_row_stride, p.v_head_stride},
                                        "q, k, v"));
  FA_RETURN_IF_ERROR(check_device_pointer(p.q, "q", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.k, "k", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.v, "v", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.out, "out", p.device_index));
  // The logsumexp is read and written one float at a time: a row slice of it
  // (ring attention's steps, a caller's view) need only be float-aligned.
  FA_RETURN_IF_ERROR(check_device_pointer(p.lse, "lse", p.device_index, sizeof(float)));
  FA_RETURN_IF_ERROR(check_device_pointer(p.cu_seqlens_q, "cu_seqlens_q", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.cu_seqlens_k, "cu_seqlens_k", p.device_index));
  return FA_OK;
}

// The extras' tensors (fa_extras) live on the device too; the kernels read
// them one f32 at a time. Dropout needs no tensor (the kernels regenerate its mask).
fa_status check_extras(const AttentionParams& p) {
  FA_RETURN_IF_ERROR(check_device_pointer(p.alibi_slopes, "alibi_slopes", p.device_index, sizeof(float)));
  FA_RETURN_IF_ERROR(check_device_pointer(p.sinks, "sinks", p.device_index, sizeof(float)));
  return check_device_pointer(p.dsinks, "dsinks", p.device_index, sizeof(float));
}

}  // namespace

bool available(const char** why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    *why = "no CUDA device is visible";
    return false;
  }
  *why = "";
  return true;
}

fa_status copy_to_host(void* dst, const void* src, size_t bytes, int device_index, void* stream) {
  DeviceGuard guard(device_index);
  // NOTES: on the call's stream, not cudaMemcpy's legacy stream: that one does not wait for a
  // non-blocking stream (torch's side streams), whose pending kernels may still be writing
  // the indices, and it waits for every blocking stream of the device instead.
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return cuda_error(err, "copying index arrays to the host for their check");
  return FA_OK;
}

fa_status check_forward(const AttentionParams& p) {
  FA_RETURN_IF_ERROR(check_common(p));
  FA_RETURN_IF_ERROR(check_extras(p));
  return check_row_strides({p.o_batch_stride, p.o_row_stride, p.o_head_stride}, "out");
}

// Grid dimensions y and z of the decode and backward kernels (KV heads, sequences).
constexpr int64_t kMaxGridYZ = 65535;

fa_status check_kvcache(const KvCacheParams& kp) {
  const AttentionParams& p = kp.attn;
  // Dropout never reaches here: apply_kvcache_extras refuses it for every backend.
  FA_RETURN_IF_ERROR(check_forward(p));
  if (p.batch > kMaxGridYZ || p.heads_kv > kMaxGridYZ) {
    return fail(FA_ERROR_UNSUPPORTED, "the CUDA decode kernels take at most 65535 sequences and "
                                      "65535 KV heads per call");
  }
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{kp.k_new, "k_new"},
                                  {kp.v_new, "v_new"},
                                  {kp.rotary_cos, "rotary_cos"},
                                  {kp.rotary_sin, "rotary_sin"}}) {
    FA_RETURN_IF_ERROR(check_device_pointer(ptr, name, p.device_index));
  }
  // The index arrays are read one int32 at a time (core/kvcache.h).
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{kp.block_table, "block_table"},
                                  {kp.cache_seqlens, "cache_seqlens"},
                                  {kp.cache_batch_idx, "cache_batch_idx"}}) {
    FA_RETURN_IF_ERROR(check_device_pointer(ptr, name, p.device_index, sizeof(int32_t)));
  }
  return FA_OK;
}

fa_status stream_is_capturing(void* stream, int device_index, bool* capturing) {
  DeviceGuard guard(device_index);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  if (err != cudaSuccess) return cuda_error(err, "cudaStreamIsCapturing");
  *capturing = status != cudaStreamCaptureStatusNone;
  return FA_OK;
}

fa_status check_backward(const AttentionParams& p) {
  FA_RETURN_IF_ERROR(check_common(p));
  FA_RETURN_IF_ERROR(check_extras(p));
  // The backward kernels' grids are (key tile, KV head, sequence).
  if (p.batch > kMaxGridYZ || p.heads_kv > kMaxGridYZ) {
    return fail(FA_ERROR_UNSUPPORTED, "the CUDA backward takes at most 65535 sequences and 65535 KV heads "
                                      "per call (batch " + std::to_string(p.batch) + ", heads_kv " +
                                          std::to_string(p.heads_kv) + "); split the batch");
  }
  FA_RETURN_IF_ERROR(check_row_strides(
      {p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.do_batch_stride, p.do_row_stride,
       p.do_head_stride, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.dk_batch_stride,
       p.dk_row_stride, p.dk_head_stride, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride},
      "out, dout, dq, dk, dv"));
  FA_RETURN_IF_ERROR(check_device_pointer(p.dout, "dout", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.dq, "dq", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.dk, "dk", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.dv, "dv", p.device_index));
  FA_RETURN_IF_ERROR(check_device_pointer(p.workspace, "workspace", p.device_index));
  return FA_OK;
}

// forward(), backward() and backward_workspace_size() are the dispatcher's (dispatch.cu).

}  // namespace flashattn::cuda
