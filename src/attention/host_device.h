// Qualifiers for code shared by the host (reference, CPU backend, validation)
// and the CUDA kernels: the attention vocabulary in this folder is written once
// and compiled by both g++ and nvcc.
#pragma once

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#define FA_DEVICE __device__ __forceinline__
#define FA_UNROLL _Pragma("unroll")
#else
#define FA_HOST_DEVICE inline
#define FA_DEVICE inline
#define FA_UNROLL
#endif
