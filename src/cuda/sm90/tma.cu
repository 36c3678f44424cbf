// Tensor-map creation through the driver entry point fetched by the runtime
// (cudaGetDriverEntryPointByVersion), so the library does not link libcuda.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    // 12000: the ABI of cuTensorMapEncodeTiled as introduced in CUDA 12.0.
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<EncodeTiled>(p);
    } else {
      cudaGetLastError();
    }
  });
  return fn;
}

}  // namespace

fa_status make_tma_map_4d(CUtensorMap* map, const void* base, fa_dtype dtype,
                          const uint64_t dims[4], const uint64_t strides_bytes[3],
                          const uint32_t box[4]) {
  EncodeTiled fn = encode_tiled();
  if (fn == nullptr) return fail(FA_ERROR_UNSUPPORTED, "cuTensorMapEncodeTiled is not available");
  const cuuint64_t d[4] = {dims[0], dims[1], dims[2], dims[3]};
  const cuuint64_t s[3] = {strides_bytes[0], strides_bytes[1], strides_bytes[2]};
  const cuuint32_t b[4] = {box[0], box[1], box[2], box[3]};
  const cuuint32_t e[4] = {1, 1, 1, 1};
  const CUtensorMapDataType t = dtype == FA_BF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                : dtype == FA_F32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                  : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // NOTES: L2 promotion 256B: K/V tiles are re-read by every query tile of a
  // head, so wider L2 fills pay off.
  CUresult r = fn(map, t, 4, const_cast<void*>(base), d, s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return fail(FA_ERROR_UNSUPPORTED, "cuTensorMapEncodeTiled rejected the tensor (error " +
                                          std::to_string(static_cast<int>(r)) + ")");
  }
  return FA_OK;
}

fa_status make_attention_map(CUtensorMap* map, const AttentionParams& p, const AttentionTensor& t,
                             int cols, uint32_t box_rows) {
  const bool varlen = p.is_varlen();
  const uint64_t dims[4] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(t.rows),
                            static_cast<uint64_t>(t.heads), static_cast<uint64_t>(varlen ? 1 : p.batch)};
  // A size-1 dimension's stride is irrelevant but must be a valid (16-byte
  // multiple, non-zero) value: use the row stride there.
  const int64_t hs = t.heads == 1 ? t.row_stride : t.head_stride;
  const int64_t bs = (varlen || p.batch == 1) ? t.row_stride : t.batch_stride;
  const uint64_t strides[3] = {static_cast<uint64_t>(t.row_stride) * 2, static_cast<uint64_t>(hs) * 2,
                               static_cast<uint64_t>(bs) * 2};
  const uint32_t box[4] = {64, box_rows, 1, 1};
  return make_tma_map_4d(map, t.base, p.dtype, dims, strides, box);
}

AttentionTensor call_tensor(const AttentionParams& p, CallTensor which) {
  const bool varlen = p.is_varlen();
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = varlen ? p.total_k : p.seqlen_k;
  switch (which) {
    case CallTensor::kQ: return {p.q, rows_q, p.heads_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride};
    case CallTensor::kK: return {p.k, rows_k, p.heads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride};
    case CallTensor::kV: return {p.v, rows_k, p.heads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride};
    case CallTensor::kOut:
      return {p.out, rows_q, p.heads_q, p.o_row_stride, p.o_head_stride, p.o_batch_stride};
    case CallTensor::kDout:
      return {p.dout, rows_q, p.heads_q, p.do_row_stride, p.do_head_stride, p.do_batch_stride};
  }
  return {};
}

}  // namespace flashattn::cuda::sm90
