# CUDA sources of the library. One .cu per (kernel family, head dim) so that
# ninja compiles them in parallel and a change rebuilds only what it touches.
set(FLASHATTN_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/backend.cu
)
