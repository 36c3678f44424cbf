// The sinks' gradient after the pre-pass (score_mod.h, AttentionSink):
//   dL/dsink_h = sum over the head's rows of -exp(sink_h - lse) * D,
// D = rowsum(dO * O) from the pre-pass, lse the forward's (sink included).
// NOTES: one block per head, each thread a fixed stride of rows, then a tree
// reduction in shared memory: the order never depends on timing, so the
// gradient is bitwise reproducible (deterministic mode or not). The sum is
// kept in double: it runs over every row of every sequence. With one block
// per head most SMs idle and the pass is bound by the latency of its loads:
// a full block of threads, each with kRowsInFlight rows' loads issued before
// their use, keeps more of them in flight.
#include <cuda_runtime.h>

#include <string>

#include "attention/score_mod.h"
#include "core/error.h"
#include "core/layout.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda::bwd {
namespace {

constexpr int kThreads = 1024;
constexpr int kRowsInFlight = 4;  // loads issued ahead per thread (latency-bound loop)

// The forward's lse of flattened row `row` (total_q view) of head h.
__device__ __forceinline__ float lse_of_row(const AttentionParams& p, int64_t row, int h) {
  if (p.is_varlen()) return p.lse[h * p.lse_head_stride + row * p.lse_row_stride];
  const int b = static_cast<int>(row / p.seqlen_q), i = static_cast<int>(row % p.seqlen_q);
  return p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + static_cast<int64_t>(i) * p.lse_row_stride];
}

__global__ void __launch_bounds__(kThreads) sink_grad_kernel(const AttentionParams p, const Workspace ws) {
  __shared__ double partial[kThreads];
  const int h = blockIdx.x;
  const AttentionSink sink{p.sinks[h]};
  double sum = 0.0;
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * kRowsInFlight;
  for (int64_t row0 = threadIdx.x; row0 < p.total_q; row0 += kStep) {
    float lse[kRowsInFlight], d[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int64_t row = row0 + u * kThreads;
      lse[u] = row < p.total_q ? lse_of_row(p, row, h) : -INFINITY;  // -inf: a zero term
      d[u] = row < p.total_q ? ws.row_d[h * p.total_q + row] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) sum += sink.grad_term(lse[u], d[u]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[h] = static_cast<float>(partial[0]);
}

}  // namespace

fa_status run_sink_grad(const AttentionParams& p, const Workspace& ws) {
  if (!p.has_sinks() || p.heads_q == 0) return FA_OK;
  sink_grad_kernel<<<p.heads_q, kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p, ws);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string("sinks' gradient launch: ") + cudaGetErrorString(err));
  return FA_OK;
}

}  // namespace flashattn::cuda::bwd
