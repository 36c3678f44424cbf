// Turns C API arguments into validated AttentionParams, or a clear error.
#pragma once

#include <cstddef>

#include "core/kvcache.h"
#include "core/params.h"

namespace flashattn {

struct ForwardArgs {
  const fa_tensor* q;
  const fa_tensor* k;
  const fa_tensor* v;
  const fa_tensor* out;
  const fa_tensor* lse;  // may be null
  const fa_varlen* varlen;
  const fa_options* options;
};

struct BackwardArgs {
  const fa_tensor* q;
  const fa_tensor* k;
  const fa_tensor* v;
  const fa_tensor* out;
  const fa_tensor* dout;
  const fa_tensor* lse;
  const fa_tensor* dq;
  const fa_tensor* dk;
  const fa_tensor* dv;
  const fa_varlen* varlen;
  const fa_options* options;
};

// Resolves FA_BACKEND_AUTO from where the tensors live.
fa_backend resolve_backend(const fa_options& options, const fa_tensor& q);

fa_status make_forward_params(const ForwardArgs& args, AttentionParams* params);
fa_status make_backward_params(const BackwardArgs& args, AttentionParams* params);
// Shapes and options only (no output tensors): for workspace queries.
fa_status make_shape_params(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                            const fa_varlen* varlen, const fa_options* options,
                            AttentionParams* params);

struct KvCacheArgs {
  const fa_tensor* q;
  const fa_kvcache* cache;
  const fa_tensor* out;  // null for workspace queries
  const fa_tensor* lse;  // may be null
  const fa_options* options;
};

// Shapes, dtypes, devices, options and the cache layout (no index array is read).
fa_status make_kvcache_params(const KvCacheArgs& args, KvCacheParams* params);
// Reads the index arrays (cache_seqlens, cache_batch_idx, block_table; copied
// from the device when they live there) and checks every one a call would use.
fa_status check_kvcache_indices(const KvCacheParams& params);

// Shared 64-bit checks (the other entry points reuse them):
// a non-empty tensor (ndim >= 1, dtype and shapes already checked) has
// positive strides, a contiguous last dimension, non-null data, and a last
// byte whose offset fits 64 bits without wrapping the address space;
fa_status check_tensor_extent(const fa_tensor& t, const char* name);
// an output shares no byte with `other` (FA_ERROR_INVALID_ARGUMENT naming both);
fa_status check_no_overlap(const fa_tensor& output, const char* output_name, const fa_tensor& other,
                           const char* other_name);
// a caller's backward workspace is FA_WORKSPACE_ALIGNMENT-aligned and overlaps no tensor.
fa_status check_workspace(const BackwardArgs& args, const void* workspace, size_t bytes);

}  // namespace flashattn
