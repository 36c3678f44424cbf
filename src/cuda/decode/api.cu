// The CUDA backend's KV-cache entry point: plan the workspace, append (and
// rotate), run the split-KV decode kernel, merge the splits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/backends.h"
#include "core/error.h"
#include "cuda/common/device_guard.h"
#include "cuda/common/launch_env.h"
#include "cuda/decode/combine.cuh"
#include "cuda/decode/kernel.cuh"
#include "cuda/decode/split.h"
#include "cuda/sm90/fwd/api.h"

namespace flashattn::cuda {
namespace {

using decode::kMaxRows;

constexpr size_t kWorkspaceAlignment = 256;  // every piece starts on a 256-byte boundary
size_t aligned(size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

int head_dim_bucket(int d) { return d <= 64 ? 64 : (d <= 128 ? 128 : 256); }

// log2(n) for a power of two n, else -1 (a paged cache's page size; 0 when contiguous).
int power_of_two_shift(int n) {
  if (n <= 0 || (n & (n - 1)) != 0) return -1;
  int shift = 0;
  while ((1 << shift) < n) ++shift;
  return shift;
}

// A device attribute, 0 if the query fails (choose_splits and choose_ring take 0 as the least).
int device_attribute(cudaDeviceAttr what, int device_index) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, what, device_index) != cudaSuccess) cudaGetLastError();
  return v;
}

// The Hopper forward's params for a KV-cache call (the route below): q or
// the rotated q (workspace, (batch, seqlen_q, heads_q, d)), K/V = the cache
// rows of the sequences, each sequence's key count from the append kernel.
// Mask, window, softcap, ALiBi (its diagonal per sequence: layout.h's
// alibi_for and the consumers take the count as seqlen_k), sinks, GQA and
// lse are kp.attn's, unchanged.
AttentionParams forward_params(const KvCacheParams& kp, const decode::Work& w) {
  AttentionParams f = kp.attn;
  if (w.q_rotated != nullptr) {
    f.q = w.q_rotated;
    f.q_head_stride = f.head_dim;
    f.q_row_stride = int64_t{f.heads_q} * f.head_dim;
    f.q_batch_stride = f.q_row_stride * f.seqlen_q;
  }
  f.seqused_k = w.key_counts;
  f.total_k = int64_t{f.batch} * kp.capacity;  // keys the call may address (supports_forward's int32 bound)
  f.workspace = nullptr;
  f.workspace_bytes = 0;
  return f;
}

// The pages the forward reads through (none for a contiguous cache).
sm90::KvPages forward_pages(const KvCacheParams& kp) {
  if (!kp.is_paged()) return {};
  return {kp.block_table, kp.block_table_stride, kp.block_size, std::max(power_of_two_shift(kp.block_size), 0),
          static_cast<int>(kp.cache_rows)};
}

// NOTES (route): a call with kForwardMinQueryRows query rows or more on an
// sm_90 device runs the append kernel, then the Hopper forward over the cache
// (chunked prefill: issue 28): contiguous caches without cache_batch_idx (the
// forward's tensor maps address sequence b at batch coordinate b), and paged
// caches whose page fits the forward's key tile (sm90::pages_fit); the others
// stay on the decode kernel. Index safety holds without the host's check
// (graph capture, trust_indices): the tensor maps bound every load to the
// cache, the append kernel re-checks each sequence's length and pages (key
// count -1 where one is out of range: NaN rows), and the forward reads only
// the table entries of a sequence's own pages.
bool takes_forward_route(const KvCacheParams& kp) {
  const AttentionParams& a = kp.attn;
  if (a.seqlen_q < decode::kForwardMinQueryRows || kp.cache_batch_idx != nullptr) return false;
  if (kp.is_paged() && (kp.cache_rows > INT32_MAX || !sm90::pages_fit(a.head_dim, kp.block_size))) return false;
  decode::Work probe{};
  return sm90::can_run_forward(forward_params(kp, probe));
}

// The decode kernel's ring on this device (split.h's choose_ring on the
// device's shared-memory figures) and how many of its CTAs an SM holds.
// FLASHATTN_DECODE_SMALL_RING=1 forces the small ring so that the path of the
// GPUs that take it is tested on any GPU (no tuning knob).
struct RingFit {
  bool small = false;
  int stages = 0;
  int ctas_per_sm = decode::kCtasPerSm;
};
template <int HeadDim>
RingFit ring_fit(int device_index) {
  using Big = decode::Ring<HeadDim, decode::kRingBytes>;
  using Small = decode::Ring<HeadDim, decode::kSmallRingBytes>;
  const decode::RingChoice c = decode::choose_ring(
      device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index),
      device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_index),
      device_attribute(cudaDevAttrReservedSharedMemoryPerBlock, device_index), Big::kSmemBytes, Small::kSmemBytes,
      env_switch("FLASHATTN_DECODE_SMALL_RING"));
  return {c.small, c.small ? Small::kStages : Big::kStages, c.ctas_per_sm};
}
RingFit ring_fit_of(int head_dim, int device_index) {
  switch (head_dim_bucket(head_dim)) {
    case 64: return ring_fit<64>(device_index);
    case 128: return ring_fit<128>(device_index);
    default: return ring_fit<256>(device_index);
  }
}

// Splits, tiles and the workspace's pieces for a call.
struct Plan {
  bool forward = false;  // the Hopper route
  RingFit ring;  // the decode kernel's
  int splits = 1;
  int query_tiles = 1;
  bool l2_prefetch = false;  // decode::Work::l2_prefetch
  bool early_prefetch = false;  // decode::Work::early_prefetch
  size_t q_rotated_bytes = 0;
  size_t partial_o_bytes = 0;
  size_t partial_lse_bytes = 0;
  size_t key_count_bytes = 0;
  size_t total() const { return q_rotated_bytes + partial_o_bytes + partial_lse_bytes + key_count_bytes; }
};

// A paged cache whose pages hold whole key tiles (the decode kernel's
// PagedTilesKv source: a tile translated once, its rows known a tile ahead).
bool pages_of_whole_tiles(const KvCacheParams& kp, int block_keys) {
  return kp.is_paged() && kp.block_size % block_keys == 0;
}

Plan make_plan(const KvCacheParams& kp) {
  const AttentionParams& a = kp.attn;
  Plan plan;
  const size_t rows = static_cast<size_t>(a.batch) * a.heads_q * a.seqlen_q;
  if (kp.has_rotary()) plan.q_rotated_bytes = aligned(rows * a.head_dim * 2);
  const int packed = a.seqlen_q * a.group_size();
  plan.query_tiles = std::max(1, (packed + kMaxRows - 1) / kMaxRows);
  if (takes_forward_route(kp)) {
    // One split: the decode kernel's fallback needs no partials (run()).
    plan.forward = true;
    plan.key_count_bytes = aligned(static_cast<size_t>(a.batch) * sizeof(int32_t));
    return plan;
  }
  const int block_keys = decode::block_keys(head_dim_bucket(a.head_dim));
  plan.ring = ring_fit_of(a.head_dim, a.device_index);
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, a.device_index);
  plan.splits = decode::choose_splits({a.batch, a.heads_kv, plan.query_tiles, kp.capacity, block_keys, sms,
                                       kp.num_splits, plan.ring.ctas_per_sm});
  // The loop's L2 prefetch: contiguous caches and pages of whole tiles (the
  // kernels whose Source::kPrefetchesAhead), short splits.
  const bool whole_pages = !kp.is_paged() || pages_of_whole_tiles(kp, block_keys);
  plan.l2_prefetch = whole_pages && decode::tiles_per_split(kp.capacity, block_keys, plan.splits) <=
                                        decode::kPrefetchMaxSplitTiles;
  // The prefetch before the grid wait computes rows without a lookup (no
  // cache_batch_idx, no block table: indices the kernel before may still write).
  plan.early_prefetch = !kp.is_paged() && kp.cache_batch_idx == nullptr;
  if (plan.splits > 1) {
    plan.partial_o_bytes = aligned(plan.splits * rows * a.head_dim * sizeof(float));
    plan.partial_lse_bytes = aligned(plan.splits * rows * sizeof(float));
  }
  return plan;
}

fa_status launch_error(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return FA_OK;
  return fail(FA_ERROR_DEVICE, std::string(what) + ": " + cudaGetErrorString(err));
}

// NOTES: programmatic dependent launch lets a kernel start while the one before
// it on the stream drains (common.cuh); it needs sm_90 code (griddepcontrol),
// so only a kernel whose binary on this device comes from a compute_90 or newer
// target gets the attribute (an sm_80 build running on any GPU never does).
bool programmatic_launch_ok(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  constexpr int kGridDependencyPtx = 90;
  return attr.ptxVersion >= kGridDependencyPtx;
}

// Launches kernel(p, w), overlapping the kernel before it when `overlap` and
// the device allows; a plain launch when the attribute is refused.
fa_status launch(void (*kernel)(KvCacheParams, decode::Work), dim3 grid, int smem, bool overlap,
                 const KvCacheParams& p, const decode::Work& w, cudaStream_t stream, const char* what) {
  if (overlap && programmatic_launch_ok(reinterpret_cast<const void*>(kernel))) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(decode::kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel, p, w) == cudaSuccess) return FA_OK;
    cudaGetLastError();
  }
  kernel<<<grid, decode::kThreads, smem, stream>>>(p, w);
  return launch_error(what);
}

// The decode kernel, then the combine when the keys are split, each launched
// to overlap the tail of the kernel before it.
//
// NOTES: the decode kernel waits for the kernel before it (griddepcontrol.wait)
// before it reads anything, so whatever that kernel is (the append, a previous
// call's combine, the caller's work writing q or cache_seqlens), its writes are
// visible. What the overlap saves is the launch: the grid is resident when the
// kernel before it finishes, if that kernel allows dependents early (ours do).
template <typename T, int HeadDim, int RingBytes, template <int> class Source>
fa_status launch_decode(const KvCacheParams& kp, const decode::Work& w, cudaStream_t stream) {
  constexpr int kSmem = decode::Ring<HeadDim, RingBytes>::kSmemBytes;
  auto kernel = decode::decode_kernel<T, HeadDim, RingBytes, Source>;
  const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, kp.attn.device_index);
  if (optin < kSmem) {
    return fail(FA_ERROR_UNSUPPORTED, "the decode kernel for head dim " + std::to_string(kp.attn.head_dim) +
                                          " needs " + std::to_string(kSmem) +
                                          " bytes of shared memory per block; this GPU allows " +
                                          std::to_string(optin));
  }
  // Opting in above 48 KiB of dynamic shared memory is a per-function attribute; it is cheap.
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) {
    return launch_error("decode kernel shared memory");
  }
  const dim3 grid(w.splits * w.query_tiles, kp.attn.heads_kv, kp.attn.batch);
  FA_RETURN_IF_ERROR(launch(kernel, grid, kSmem, true, kp, w, stream, "decode kernel"));
  if (w.splits == 1) return FA_OK;
  const int64_t rows = int64_t{kp.attn.batch} * kp.attn.heads_q * kp.attn.seqlen_q;
  return launch(decode::combine_kernel<T, HeadDim>, dim3(static_cast<unsigned>(rows)), 0, true, kp, w, stream,
                "decode combine kernel");
}

template <typename T, int HeadDim, int RingBytes>
fa_status launch_for_cache(const KvCacheParams& kp, const decode::Work& w, cudaStream_t stream) {
  if (!kp.is_paged()) return launch_decode<T, HeadDim, RingBytes, decode::ContiguousKv>(kp, w, stream);
  return pages_of_whole_tiles(kp, decode::block_keys(HeadDim))
             ? launch_decode<T, HeadDim, RingBytes, decode::PagedTilesKv>(kp, w, stream)
             : launch_decode<T, HeadDim, RingBytes, decode::PagedRowsKv>(kp, w, stream);
}

template <typename T, int HeadDim>
fa_status launch_for_ring(const KvCacheParams& kp, const decode::Work& w, bool small_ring, cudaStream_t stream) {
  return small_ring ? launch_for_cache<T, HeadDim, decode::kSmallRingBytes>(kp, w, stream)
                    : launch_for_cache<T, HeadDim, decode::kRingBytes>(kp, w, stream);
}

template <typename T>
fa_status run(const KvCacheParams& kp, const decode::Work& w, bool small_ring, cudaStream_t stream) {
  const AttentionParams& a = kp.attn;
  // NOTES: with no new tokens, no rotary and no key counts to write there is
  // nothing to append: one launch fewer.
  if (kp.seqlen_new > 0 || w.q_rotated != nullptr || w.key_counts != nullptr) {
    const dim3 grid(std::max({kp.seqlen_new, w.q_rotated != nullptr ? a.seqlen_q : 0, 1}), a.batch);
    decode::append_kernel<T><<<grid, decode::kThreads, 0, stream>>>(kp, w);
    FA_RETURN_IF_ERROR(launch_error("append kernel"));
  }
  if (a.seqlen_q == 0) return FA_OK;  // nothing to attend; the append above still happens
  if (w.key_counts != nullptr) {
    // FA_ERROR_UNSUPPORTED (a tensor map the driver refused): the decode kernel, one split.
    const fa_status s = sm90::run_forward(forward_params(kp, w), forward_pages(kp));
    if (s != FA_ERROR_UNSUPPORTED) return s;
  }
  switch (head_dim_bucket(a.head_dim)) {
    case 64: return launch_for_ring<T, 64>(kp, w, small_ring, stream);
    case 128: return launch_for_ring<T, 128>(kp, w, small_ring, stream);
    default: return launch_for_ring<T, 256>(kp, w, small_ring, stream);
  }
}

}  // namespace

size_t kvcache_workspace_size(const KvCacheParams& kp) { return make_plan(kp).total(); }

KvCacheRoute kvcache_route(const KvCacheParams& kp) {
  return make_plan(kp).forward ? KvCacheRoute::kHopperForward : KvCacheRoute::kDecode;
}

int kvcache_ring_stages(const KvCacheParams& kp) {
  const Plan plan = make_plan(kp);
  return plan.forward ? 0 : plan.ring.stages;
}

fa_status forward_kvcache(const KvCacheParams& kp) {
  const AttentionParams& a = kp.attn;
  if (a.batch == 0) return FA_OK;
  DeviceGuard guard(a.device_index);
  const Plan plan = make_plan(kp);
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  // Without a caller's workspace the stream-ordered pool serves (capturable in graphs).
  void* owned = nullptr;
  uint8_t* base = static_cast<uint8_t*>(a.workspace);
  if (base == nullptr && plan.total() > 0) {
    const cudaError_t err = cudaMallocAsync(&owned, plan.total(), stream);
    if (err != cudaSuccess) return fail(FA_ERROR_OUT_OF_MEMORY, std::string("decode workspace: ") + cudaGetErrorString(err));
    base = static_cast<uint8_t*>(owned);
  }
  decode::Work w{};
  w.splits = plan.splits;
  w.query_tiles = plan.query_tiles;
  w.page_shift = power_of_two_shift(kp.block_size);
  w.l2_prefetch = plan.l2_prefetch;
  w.early_prefetch = plan.early_prefetch;
  w.q_rotated = plan.q_rotated_bytes > 0 ? base : nullptr;
  w.partial_o = plan.splits > 1 ? reinterpret_cast<float*>(base + plan.q_rotated_bytes) : nullptr;
  w.partial_lse = plan.splits > 1 ? reinterpret_cast<float*>(base + plan.q_rotated_bytes + plan.partial_o_bytes) : nullptr;
  w.key_counts = plan.forward ? reinterpret_cast<int32_t*>(base + plan.q_rotated_bytes) : nullptr;
  const fa_status status = a.dtype == FA_F16 ? run<__half>(kp, w, plan.ring.small, stream)
                                               : run<__nv_bfloat16>(kp, w, plan.ring.small, stream);
  if (owned != nullptr) cudaFreeAsync(owned, stream);
  return status;
}

}  // namespace flashattn::cuda
