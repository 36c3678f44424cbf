// Scalar conversions between the 16-bit element types and f32 for the
// memory-bound passes (backward pre/post-pass, decode): to_float<T>(x) and
// from_float<T>(x), round to nearest even (float: the identity, for f32 partials). The tensor-core kernels pack pairs
// instead (mma.h's pack2 / MmaType::pack).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashattn::cuda {

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }

}  // namespace flashattn::cuda
