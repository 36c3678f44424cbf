// Host entry points of the sm90 primitive checks (test_sm90_primitives_kernels.cu).
// Each runs one small kernel and returns what the test asserts on; `error`
// gets a CUDA error message when something failed to run.
#pragma once

#include <string>

namespace flashattn::testing::sm90prim {

// TMA 4-D box load (128B swizzle, partly out of bounds) completing on an
// mbarrier: number of elements that differ from the un-swizzled expectation.
long tma_load_mismatches(std::string& error);
// wgmma m64n128k16 x 8 (K = 128), A and B K-major in shared memory:
// max |C - C_ref| / max |C_ref|. bf16 when `bf16`, else fp16.
double wgmma_ss_rel_error(bool bf16, std::string& error);
// wgmma m64n128k16 x 2 (K = 32), A from registers, B MN-major (transposed):
// max |C - C_ref| / max |C_ref|.
double wgmma_rs_rel_error(bool bf16, std::string& error);
// wgmma m64n64k16 x 2 (K = 32), A and B both MN-major in shared memory (the
// backward's dQ = dS K): max |C - C_ref| / max |C_ref|.
double wgmma_sstt_rel_error(bool bf16, std::string& error);
// stmatrix.x4 (the forward's O epilogue): four 8x8 16-bit matrices from the
// accumulator layout: number of elements not where the layout puts them.
long stmatrix_mismatches(std::string& error);
// Producer/consumer mbarrier ring (2 stages, 40 rounds, stages filled by bulk
// copies completing on the barrier) with named-barrier
// turn taking between two consumer warpgroups: wrong sums + out-of-order turns.
long pipeline_errors(std::string& error);

}  // namespace flashattn::testing::sm90prim
