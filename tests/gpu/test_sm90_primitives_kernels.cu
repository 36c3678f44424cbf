// Small kernels exercising the src/cuda/sm90 primitives one at a time, with
// host-side references (see sm90_primitives_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/sm90/arch.h"
#include "cuda/sm90/tma_store.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"
#include "cuda/sm90/wgmma.h"
#include "sm90_primitives_kernels.h"

namespace flashattn::testing::sm90prim {
namespace {

using namespace flashattn::cuda::sm90;

bool ok(cudaError_t e, std::string& error) {
  if (e == cudaSuccess) return true;
  if (error.empty()) error = cudaGetErrorString(e);
  return false;
}

// Byte offset of element (r, c) of a [rows][64] 16-bit block, 128B-swizzled.
__host__ __device__ inline int sw128_offset(int r, int c) {
  return r * 128 + ((((c * 2) / 16) ^ (r % 8)) * 16) + (c * 2) % 16;
}

#if FLASHATTN_SM90_DEVICE
// Writes a warpgroup's m64nN f32 accumulator to row-major c[64][N]: warp w owns
// rows 16w..16w+15; in each 8-column group i a thread holds rows lane/4 and
// lane/4 + 8, columns 2*(lane%4) and 2*(lane%4) + 1.
template <int N>
__device__ __forceinline__ void store_accumulator(const float* d, float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + lane / 4 + 8 * (e >> 1), col = 8 * i + 2 * (lane % 4) + (e & 1);
      c[row * N + col] = d[4 * i + e];
    }
}
#endif

// ------------------------------------------------------------------ TMA
constexpr int kTD = 128, kTRows = 100, kTHeads = 3, kTBatch = 2, kTPad = 8;
constexpr int kBoxRows = 64;

__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, uint16_t* out, int c0, int c1,
                           int c2, int c3) {
#if FLASHATTN_SM90_DEVICE
  __shared__ alignas(1024) uint16_t tile[kBoxRows * 64];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, sizeof(tile));
    tma_load_4d(tile, &map, &bar, c0, c1, c2, c3);
  }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < kBoxRows * 64; i += blockDim.x) out[i] = tile[i];
#endif
}

// ------------------------------------------------------------------ wgmma SS
template <typename T>
__global__ void wgmma_ss_kernel(const T* a, const T* b, float* c) {
#if FLASHATTN_SM90_DEVICE
  constexpr int M = 64, N = 128, K = 128;
  __shared__ alignas(1024) uint8_t sa[M * K * 2];
  __shared__ alignas(1024) uint8_t sb[N * K * 2];
  // K-major: column block kb of 64 holds rows x 128 bytes, swizzled.
  for (int i = threadIdx.x; i < M * K; i += blockDim.x) {
    const int r = i / K, k = i % K;
    *reinterpret_cast<T*>(sa + (k / 64) * M * 128 + sw128_offset(r, k % 64)) = a[i];
  }
  for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
    const int r = i / K, k = i % K;
    *reinterpret_cast<T*>(sb + (k / 64) * N * 128 + sw128_offset(r, k % 64)) = b[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  float d[N / 2];
  wgmma_fence();
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint64_t da = make_smem_desc_sw128(smem_addr(sa) + (kk / 4) * M * 128 + (kk % 4) * 32, 16, 1024);
    const uint64_t db = make_smem_desc_sw128(smem_addr(sb) + (kk / 4) * N * 128 + (kk % 4) * 32, 16, 1024);
    WgmmaSS<N, T>::run(d, da, db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  store_accumulator<N>(d, c);
#endif
}

// ------------------------------------------------------------------ wgmma RS
template <typename T>
__global__ void wgmma_rs_kernel(const T* a, const T* b, float* c) {
#if FLASHATTN_SM90_DEVICE
  constexpr int N = 128, K = 32;  // M = 64
  __shared__ alignas(1024) uint8_t sb[K * N * 2];
  // MN-major: B is K x N with N contiguous; N block nb of 64 holds K rows x 128 bytes.
  for (int i = threadIdx.x; i < K * N; i += blockDim.x) {
    const int k = i / N, n = i % N;
    *reinterpret_cast<T*>(sb + (n / 64) * K * 128 + sw128_offset(k, n % 64)) = b[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16 + lane / 4, c0 = 2 * (lane % 4);
  uint32_t af[K / 16][4];
  for (int kt = 0; kt < K / 16; ++kt) {
    const int k = kt * 16 + c0;
    auto at = [&](int r, int kk) { return static_cast<float>(a[r * K + kk]); };
    af[kt][0] = pack2<T>(at(r0, k), at(r0, k + 1));
    af[kt][1] = pack2<T>(at(r0 + 8, k), at(r0 + 8, k + 1));
    af[kt][2] = pack2<T>(at(r0, k + 8), at(r0, k + 9));
    af[kt][3] = pack2<T>(at(r0 + 8, k + 8), at(r0 + 8, k + 9));
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.5f;  // accumulate onto a known value
  wgmma_fence();
  for (int kt = 0; kt < K / 16; ++kt) {
    const uint64_t db = make_smem_desc_sw128(smem_addr(sb) + kt * 16 * 128, K * 128, 1024);
    WgmmaRS<N, T>::run(d, af[kt], db, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  store_accumulator<N>(d, c);
#endif
}

// ------------------------------------------------------------------ wgmma SS, both MN-major
// The backward's dQ = dS K: A (64 x K) stored [k][m] (M contiguous), B (K x N)
// stored [k][n] (N contiguous), both 128B-swizzled; k-step kt starts 16 rows on.
template <typename T>
__global__ void wgmma_sstt_kernel(const T* a, const T* b, float* c) {
#if FLASHATTN_SM90_DEVICE
  constexpr int M = 64, N = 64, K = 32;
  __shared__ alignas(1024) uint8_t sa[K * M * 2];
  __shared__ alignas(1024) uint8_t sb[K * N * 2];
  for (int i = threadIdx.x; i < M * K; i += blockDim.x) {
    const int m = i / K, k = i % K;
    *reinterpret_cast<T*>(sa + sw128_offset(k, m)) = a[i];
  }
  for (int i = threadIdx.x; i < K * N; i += blockDim.x) {
    const int k = i / N, n = i % N;
    *reinterpret_cast<T*>(sb + sw128_offset(k, n)) = b[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  float d[N / 2];
  wgmma_fence();
  for (int kt = 0; kt < K / 16; ++kt) {
    const uint64_t da = make_smem_desc_sw128(smem_addr(sa) + kt * 16 * 128, K * 128, 1024);
    const uint64_t db = make_smem_desc_sw128(smem_addr(sb) + kt * 16 * 128, K * 128, 1024);
    WgmmaSSTT<N, T>::run(d, da, db, kt > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  store_accumulator<N>(d, c);
#endif
}

// ------------------------------------------------------------------ pipeline
[[maybe_unused]] constexpr int kStages = 2;
constexpr int kRounds = 40, kSlot = 256;

// The producer fills stages with bulk copies (complete_tx on the full barrier),
// as the forward kernel's producer does with TMA; consumers read with ordinary
// loads and release stages warp by warp.
__global__ void __launch_bounds__(384, 1) pipeline_kernel(const float* src, float* sums, int* log,
                                                          int* log_len) {
#if FLASHATTN_SM90_DEVICE
  __shared__ alignas(128) float ring[kStages][kSlot];
  __shared__ uint64_t full[kStages], empty[kStages];
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // one arrival per consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      for (int it = 0; it < kRounds; ++it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[s], kSlot * sizeof(float));
        bulk_copy_g2s(ring[s], src + it * kSlot, kSlot * sizeof(float), &full[s]);
      }
    }
  } else {
    setmaxnreg_inc<240>();
    const int cw = wg - 1, tid = threadIdx.x - 128;
    if (cw == 1) named_arrive(1, 256);
    float acc = 0.0f;
    for (int it = 0; it < kRounds; ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      named_sync(1 + cw, 256);  // my turn
      // The turn log (global atomics): strict alternation 0, 1, 0, 1, ... if
      // the turns are exclusive and handed over in order.
      if (tid % 128 == 0) log[atomicAdd(log_len, 1)] = cw;
      acc += ring[s][tid];
      __threadfence_block();
      named_sync(3 + cw, 128);  // the whole warpgroup is done with its turn
      named_arrive(1 + (1 - cw), 256);  // hand the turn over
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
    }
    if (cw == 0) named_sync(1, 256);
    sums[tid] = acc;
  }
#endif
}

template <typename T>
T to_t(float v);
template <>
__nv_bfloat16 to_t(float v) { return __float2bfloat16(v); }
template <>
__half to_t(float v) { return __float2half(v); }

enum class Form { kSS, kRS, kSSTT };

template <typename T>
double run_wgmma(Form form, std::string& error) {
  const bool rs = form == Form::kRS;
  // B stored [k][n] (MN-major) for rs and sstt, [n][k] for ss.
  const bool b_kn = form != Form::kSS;
  const int M = 64, N = form == Form::kSSTT ? 64 : 128, K = form == Form::kSS ? 128 : 32;
  std::mt19937 rng(form == Form::kSSTT ? 11 : rs ? 7 : 3);
  std::normal_distribution<float> nd;
  std::vector<T> a(M * K), b(b_kn ? K * N : N * K);
  for (auto& x : a) x = to_t<T>(nd(rng));
  for (auto& x : b) x = to_t<T>(nd(rng));
  std::vector<double> ref(M * N, rs ? 0.5 : 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) {
        const double bv = b_kn ? static_cast<float>(b[k * N + j]) : static_cast<float>(b[j * K + k]);
        ref[i * N + j] += static_cast<double>(static_cast<float>(a[i * K + k])) * bv;
      }
  T *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  bool good = ok(cudaMalloc(&da, a.size() * sizeof(T)), error) &&
              ok(cudaMalloc(&db, b.size() * sizeof(T)), error) &&
              ok(cudaMalloc(&dc, M * N * sizeof(float)), error) &&
              ok(cudaMemcpy(da, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice), error) &&
              ok(cudaMemcpy(db, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice), error) &&
              ok(cudaMemset(dc, 0xff, M * N * sizeof(float)), error);
  std::vector<float> c(M * N);
  if (good) {
    if (form == Form::kRS) wgmma_rs_kernel<T><<<1, 128>>>(da, db, dc);
    else if (form == Form::kSSTT) wgmma_sstt_kernel<T><<<1, 128>>>(da, db, dc);
    else wgmma_ss_kernel<T><<<1, 128>>>(da, db, dc);
    good = ok(cudaGetLastError(), error) && ok(cudaDeviceSynchronize(), error) &&
           ok(cudaMemcpy(c.data(), dc, M * N * sizeof(float), cudaMemcpyDeviceToHost), error);
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (!good) return -1;
  double err = 0, mag = 0;
  for (int i = 0; i < M * N; ++i) {
    if (std::isnan(c[i])) return INFINITY;
    err = std::max(err, std::abs(c[i] - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / mag;
}

// ------------------------------------------------------------------ stmatrix
// One warp stores four 8x8 matrices of 16-bit values, matrix m at byte
// 128 m (rows of 16 bytes), element (r, c) of matrix m holding m*64 + r*8 + c.
__global__ void stmatrix_kernel(uint16_t* out) {
#if FLASHATTN_SM90_DEVICE
  __shared__ alignas(128) uint16_t tile[4 * 64];
  const int lane = threadIdx.x;
  uint32_t r[4];
  for (int m = 0; m < 4; ++m) {
    const int v = m * 64 + (lane / 4) * 8 + 2 * (lane % 4);
    r[m] = static_cast<uint32_t>(v) | (static_cast<uint32_t>(v + 1) << 16);
  }
  const uint32_t row = static_cast<uint32_t>(__cvta_generic_to_shared(tile)) + (lane / 8) * 128 + (lane % 8) * 16;
  stmatrix_x4(row, r[0], r[1], r[2], r[3]);
  __syncwarp();
  for (int i = lane; i < 4 * 64; i += 32) out[i] = tile[i];
#endif
}

}  // namespace

long stmatrix_mismatches(std::string& error) {
  uint16_t* d_out = nullptr;
  if (!ok(cudaMalloc(&d_out, 4 * 64 * sizeof(uint16_t)), error)) return -1;
  std::vector<uint16_t> out(4 * 64, 0xffff);
  bool ran = ok(cudaMemset(d_out, 0xff, out.size() * sizeof(uint16_t)), error);
  if (ran) {
    stmatrix_kernel<<<1, 32>>>(d_out);
    ran = ok(cudaGetLastError(), error) && ok(cudaDeviceSynchronize(), error) &&
          ok(cudaMemcpy(out.data(), d_out, out.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost), error);
  }
  cudaFree(d_out);
  if (!ran) return -1;
  long bad = 0;
  for (int i = 0; i < 4 * 64; ++i) bad += out[i] != i;
  return bad;
}

long tma_load_mismatches(std::string& error) {
  const int64_t row_stride = kTHeads * kTD + kTPad, head_stride = kTD,
                batch_stride = kTRows * row_stride;
  std::vector<uint16_t> g(kTBatch * batch_stride);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  uint16_t* dg = nullptr;
  uint16_t* dout = nullptr;
  if (!ok(cudaMalloc(&dg, g.size() * 2), error) || !ok(cudaMalloc(&dout, kBoxRows * 64 * 2), error) ||
      !ok(cudaMemcpy(dg, g.data(), g.size() * 2, cudaMemcpyHostToDevice), error))
    return -1;
  CUtensorMap map;
  const uint64_t dims[4] = {kTD, kTRows, kTHeads, kTBatch};
  const uint64_t strides[3] = {row_stride * 2, head_stride * 2, batch_stride * 2};
  const uint32_t box[4] = {64, kBoxRows, 1, 1};
  if (make_tma_map_4d(&map, dg, FA_BF16, dims, strides, box) != FA_OK) {
    error = "make_tma_map_4d failed";
    return -1;
  }
  const int c0 = 64, c1 = 80, c2 = 2, c3 = 1;  // rows 80..143: 100.. are out of bounds
  tma_kernel<<<1, 128>>>(map, dout, c0, c1, c2, c3);
  std::vector<uint16_t> out(kBoxRows * 64);
  if (!ok(cudaGetLastError(), error) || !ok(cudaDeviceSynchronize(), error) ||
      !ok(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost), error))
    return -1;
  cudaFree(dg);
  cudaFree(dout);
  long bad = 0;
  for (int r = 0; r < kBoxRows; ++r)
    for (int c = 0; c < 64; ++c) {
      const int row = c1 + r;
      const uint16_t want =
          row < kTRows ? g[c3 * batch_stride + row * row_stride + c2 * head_stride + c0 + c] : 0;
      if (out[sw128_offset(r, c) / 2] != want) ++bad;
    }
  return bad;
}

double wgmma_ss_rel_error(bool bf16, std::string& error) {
  return bf16 ? run_wgmma<__nv_bfloat16>(Form::kSS, error) : run_wgmma<__half>(Form::kSS, error);
}
double wgmma_rs_rel_error(bool bf16, std::string& error) {
  return bf16 ? run_wgmma<__nv_bfloat16>(Form::kRS, error) : run_wgmma<__half>(Form::kRS, error);
}
double wgmma_sstt_rel_error(bool bf16, std::string& error) {
  return bf16 ? run_wgmma<__nv_bfloat16>(Form::kSSTT, error) : run_wgmma<__half>(Form::kSSTT, error);
}

long pipeline_errors(std::string& error) {
  float* dsums = nullptr;
  float* dsrc = nullptr;
  int* dlog = nullptr;
  std::vector<float> src(kRounds * kSlot);
  for (int it = 0; it < kRounds; ++it)
    for (int i = 0; i < kSlot; ++i) src[it * kSlot + i] = static_cast<float>(it * 1000 + i);
  const int log_entries = 2 * kRounds;
  if (!ok(cudaMalloc(&dsums, kSlot * sizeof(float)), error) ||
      !ok(cudaMalloc(&dlog, (log_entries + 1) * sizeof(int)), error) ||
      !ok(cudaMalloc(&dsrc, src.size() * sizeof(float)), error) ||
      !ok(cudaMemcpy(dsrc, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), error) ||
      !ok(cudaMemset(dlog, 0xff, (log_entries + 1) * sizeof(int)), error) ||
      !ok(cudaMemset(dlog + log_entries, 0, sizeof(int)), error))
    return -1;
  pipeline_kernel<<<1, 384>>>(dsrc, dsums, dlog, dlog + log_entries);
  std::vector<float> sums(kSlot);
  std::vector<int> log(log_entries + 1);
  if (!ok(cudaGetLastError(), error) || !ok(cudaDeviceSynchronize(), error) ||
      !ok(cudaMemcpy(sums.data(), dsums, kSlot * sizeof(float), cudaMemcpyDeviceToHost), error) ||
      !ok(cudaMemcpy(log.data(), dlog, log.size() * sizeof(int), cudaMemcpyDeviceToHost), error))
    return -1;
  cudaFree(dsums);
  cudaFree(dsrc);
  cudaFree(dlog);
  long bad = log[log_entries] == log_entries ? 0 : 1;
  for (int i = 0; i < log_entries; ++i) bad += log[i] != i % 2;
  for (int t = 0; t < kSlot; ++t) {
    double want = 0;
    for (int it = 0; it < kRounds; ++it) want += it * 1000.0 + t % kSlot;
    if (std::abs(sums[t] - want) > 1e-3 * want) ++bad;
  }
  return bad;
}

}  // namespace flashattn::testing::sm90prim
