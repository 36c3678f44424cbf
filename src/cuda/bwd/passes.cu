// Pre- and post-passes of the sm80 backward (memory-bound, one pass each).
//   pre:  D[h][row] = rowsum(dO * O) in f32, and the f32 dQ accumulator zeroed.
//   post: dq = scale * dQ accumulator, rounded to the input dtype; the rows
//         where that is Inf or NaN recomputed exactly (common/nonfinite.cuh).
// NOTES: one group of lanes per (row, head) in the pre-pass (prepass_group): a
// row of up to 256 16-bit elements is at most 32 16-byte chunks, one per lane,
// so the loads are 16 bytes wide and coalesced and the reduction is a shuffle
// tree. A whole warp per row left 3/4 of the lanes idle at d 64 (the pre-pass
// took 164 us against d 128's 101 us for the same bytes, H100, 16k tokens). The softmax
// scale is applied here (and to dK in the main kernel's epilogue) rather than
// to dS, whose scaled values would lose bits in fp16 (see kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/error.h"
#include "core/layout.h"
#include "cuda/bwd/workspace.h"
#include "cuda/common/convert.h"
#include "cuda/common/nonfinite.cuh"

namespace flashattn::cuda::bwd {
namespace {

// Row `row` of the flattened (total_q) view -> its sequence and row in it.
// Fixed-length batches divide; varlen batches search cu_seqlens_q.
__device__ __forceinline__ void locate_row(const AttentionParams& p, int64_t row, int* b, int* r) {
  if (!p.is_varlen()) {
    *b = static_cast<int>(row / p.seqlen_q);
    *r = static_cast<int>(row % p.seqlen_q);
    return;
  }
  int lo = 0, hi = p.batch;  // last b with cu_seqlens_q[b] <= row
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.cu_seqlens_q[mid] <= row) lo = mid; else hi = mid;
  }
  *b = lo;
  *r = static_cast<int>(row - p.cu_seqlens_q[lo]);
}

// Lanes per (row, head) item of the pre-pass: one per 16-byte chunk of a row,
// rounded up to a power of two (a shuffle tree), so a warp takes 32 / group
// rows at once (d 64: 4) instead of leaving lanes idle past the row's end.
__host__ __device__ inline int prepass_group(int head_dim) {
  int g = 1;
  while (g < head_dim / 8 && g < 32) g *= 2;
  return g;
}

template <typename T>
__global__ void prepass_kernel(const AttentionParams p, const Workspace ws, int group) {
  const int lane = threadIdx.x & 31, sub = lane % group;
  const int per_warp = 32 / group;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t items = p.total_q * p.heads_q;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * per_warp;
  // Every lane runs the same iterations (the shuffles below need the whole warp).
  for (int64_t base = first; base < items; base += warps * per_warp) {
    const int64_t item = base + lane / group;
    const bool valid = item < items;
    float sum = 0.0f;
    int64_t row = 0;
    int h = 0;
    if (valid) {
      row = item / p.heads_q;
      h = static_cast<int>(item % p.heads_q);
      int b, r;
      locate_row(p, row, &b, &r);
      const int64_t seq_first = p.is_varlen() ? p.cu_seqlens_q[b] : static_cast<int64_t>(b) * p.seqlen_q;
      const T* o = static_cast<const T*>(p.out) +
                   row_offset(b, seq_first, r, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.is_varlen());
      const T* d = static_cast<const T*>(p.dout) +
                   row_offset(b, seq_first, r, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride, p.is_varlen());
      for (int c = sub * 8; c < p.head_dim; c += group * 8) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
        const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
      }
    }
    // D = rowsum(dO * O) over the group's lanes (xor stays inside an aligned group).
    for (int off = group / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!valid) continue;
    if (sub == 0) ws.row_d[static_cast<int64_t>(h) * p.total_q + row] = sum;
    float4* acc = reinterpret_cast<float4*>(ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + row) * ws.accum_dim);
    for (int c = sub; c < ws.accum_dim / 4; c += group) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The f32 values item `item` of the post-pass stores: dq = scale * accumulator
// of 8 columns of one (row, head).
struct DqChunk {
  int64_t row;
  int h, c;
  float4 a, a2;

  __device__ DqChunk(const AttentionParams& p, const Workspace& ws, int64_t item, int chunks) {
    c = static_cast<int>(item % chunks) * 8;
    const int64_t rh = item / chunks;
    row = rh / p.heads_q;
    h = static_cast<int>(rh % p.heads_q);
    const float* src = ws.dq_accum + (static_cast<int64_t>(h) * p.total_q + row) * ws.accum_dim + c;
    a = __ldcs(reinterpret_cast<const float4*>(src));
    a2 = __ldcs(reinterpret_cast<const float4*>(src + 4));
    a.x *= p.scale; a.y *= p.scale; a.z *= p.scale; a.w *= p.scale;
    a2.x *= p.scale; a2.y *= p.scale; a2.z *= p.scale; a2.w *= p.scale;
  }
  // nonfinite::poison of the 8 values.
  __device__ float check(float acc) const {
    using nonfinite::poison;
    return poison(poison(poison(poison(poison(poison(poison(poison(acc, a.x), a.y), a.z), a.w), a2.x), a2.y), a2.z),
                  a2.w);
  }
};

// The rare path of the post-pass (a warp whose stores held an Inf or NaN):
// the warp walks its items again, and each (row, head) with a non-finite
// chunk is recomputed once, for the chunks found (other warps own the rest).
template <typename T>
__device__ __noinline__ void fix_dq_chunks(const AttentionParams& p, const Workspace ws, const ListedPairs& pairs) {
  const int lane = threadIdx.x % 32, chunks = p.head_dim / 8;
  const int64_t items = p.total_q * p.heads_q * chunks, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31); base < items;
       base += stride) {
    const int64_t item = base + lane;
    const bool mine = item < items;
    const DqChunk x(p, ws, mine ? item : base, chunks);
    uint32_t bad = __ballot_sync(0xffffffffu, mine && nonfinite::found(x.check(0.0f)));
    while (bad != 0) {
      const int first = __ffs(bad) - 1;
      const int64_t row = __shfl_sync(0xffffffffu, x.row, first);
      const int h = __shfl_sync(0xffffffffu, x.h, first);
      const bool same = ((bad >> lane) & 1u) && x.row == row && x.h == h;
      const uint32_t cols = __reduce_or_sync(0xffffffffu, same ? 1u << (x.c / 8) : 0u);
      bad &= ~__ballot_sync(0xffffffffu, same);
      int b, r;
      locate_row(p, row, &b, &r);
      nonfinite::fix_dq_row<T>(p, pairs, ws.row_d, b, h, r, cols);
    }
  }
}

// The post-pass's block and its register cap: 256 threads, 8 blocks an SM
// (32 registers, what the kernel needs without its rare path).
// NOTES: without the cap the out-of-line fix (fix_dq_chunks, ~96 registers)
// sets the kernel's register count and cuts its occupancy by 4; capped, the
// fix spills instead, on the rare path only.
constexpr int kPostThreads = 256, kPostBlocksPerSm = 8;

template <typename T>
__global__ void __launch_bounds__(kPostThreads, kPostBlocksPerSm)
    postpass_kernel(const __grid_constant__ AttentionParams p, const Workspace ws,
                    const __grid_constant__ ListedPairs pairs) {
  // One thread per 8 output elements (one 16-byte store).
  const int chunks = p.head_dim / 8;
  const int64_t items = p.total_q * p.heads_q * chunks;
  float check = 0.0f;  // nonfinite::poison of every value stored
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const DqChunk x(p, ws, item, chunks);
    const int c = x.c, h = x.h;
    const float4 a = x.a, a2 = x.a2;
    check = x.check(check);
    int b, r;
    locate_row(p, x.row, &b, &r);
    const int64_t seq_first = p.is_varlen() ? p.cu_seqlens_q[b] : static_cast<int64_t>(b) * p.seqlen_q;
    uint4 out;
    T* oe = reinterpret_cast<T*>(&out);
    oe[0] = from_float<T>(a.x); oe[1] = from_float<T>(a.y); oe[2] = from_float<T>(a.z); oe[3] = from_float<T>(a.w);
    oe[4] = from_float<T>(a2.x); oe[5] = from_float<T>(a2.y); oe[6] = from_float<T>(a2.z); oe[7] = from_float<T>(a2.w);
    T* dst = static_cast<T*>(p.dq) +
             row_offset(b, seq_first, r, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.is_varlen()) + c;
    *reinterpret_cast<uint4*>(dst) = out;
  }
  // Every lane has left the loop (whole warps run it: the grid is whole blocks).
  if (__any_sync(0xffffffffu, nonfinite::found(check))) fix_dq_chunks<T>(p, ws, pairs);  // rare
}

fa_status launched(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
  return FA_OK;
}

int grid_for(int64_t items, int per_block) {
  // Grid-stride loops: enough blocks to fill any current GPU several times over.
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<int>(blocks < 4096 ? (blocks < 1 ? 1 : blocks) : 4096);
}

}  // namespace

template <typename T>
fa_status run_prepass(const AttentionParams& p, const Workspace& ws) {
  const int64_t items = p.total_q * p.heads_q;
  if (items == 0) return FA_OK;
  const int group = prepass_group(p.head_dim);
  const int items_per_block = 8 * (32 / group);  // 8 warps of 256 threads
  prepass_kernel<T><<<grid_for(items, items_per_block), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
      p, ws, group);
  return launched("backward pre-pass launch");
}

template <typename T>
fa_status run_postpass(const AttentionParams& p, const Workspace& ws, const ListedPairs& pairs) {
  const int64_t items = p.total_q * p.heads_q * (p.head_dim / 8);
  if (items == 0) return FA_OK;
  postpass_kernel<T><<<grid_for(items, kPostThreads), kPostThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(
      p, ws, pairs);
  return launched("backward post-pass launch");
}

template <typename T>
fa_status run_postpass(const AttentionParams& p, const Workspace& ws) {
  return run_postpass<T>(p, ws, ListedPairs{});
}

template fa_status run_prepass<__half>(const AttentionParams&, const Workspace&);
template fa_status run_prepass<__nv_bfloat16>(const AttentionParams&, const Workspace&);
template fa_status run_postpass<__half>(const AttentionParams&, const Workspace&, const ListedPairs&);
template fa_status run_postpass<__nv_bfloat16>(const AttentionParams&, const Workspace&, const ListedPairs&);
template fa_status run_postpass<__half>(const AttentionParams&, const Workspace&);
template fa_status run_postpass<__nv_bfloat16>(const AttentionParams&, const Workspace&);

}  // namespace flashattn::cuda::bwd
