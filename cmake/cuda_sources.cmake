# CUDA sources of the library: every .cu under src/cuda. Kernel families keep
# one .cu per (head dim) instantiation so ninja compiles them in parallel and
# a change rebuilds only what it touches.
file(GLOB_RECURSE FLASHATTN_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/*.cu)
