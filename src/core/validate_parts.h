// The argument checks validate.cpp and validate_kvcache.cpp share (internal:
// not part of the library's API). Each returns FA_OK or fails with a message
// naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "core/params.h"
#include "flashattn/flashattn.h"

namespace flashattn::validation {

std::string shape_string(const fa_tensor& t);
// A non-null tensor of `ndim` dimensions with valid dtype, device and extents.
fa_status check_tensor(const fa_tensor* t, const char* name, int ndim);
fa_status check_same_shape(const fa_tensor& a, const char* a_name, const fa_tensor& b, const char* b_name);
fa_status check_same_dtype(const fa_tensor& a, const char* a_name, const fa_tensor& b, const char* b_name);
fa_status check_same_device(const fa_tensor& a, const char* a_name, const fa_tensor& b, const char* b_name);
fa_status check_options(const fa_options& o);
// Batch, row and head strides (elements) of a (batch, rows, heads, d) tensor,
// or of (rows, heads, d) with varlen (batch stride 0).
void set_strides(const fa_tensor& t, bool varlen, int64_t* batch, int64_t* row, int64_t* head);
// The backend can run these params on q's device.
fa_status check_backend(const AttentionParams& p, fa_backend backend, const fa_tensor& q);
// lse's shape and strides for these params, written into *out.
fa_status check_lse(const fa_tensor* lse, const AttentionParams& p, const fa_tensor& q, AttentionParams* out);
// t has like's shape, dtype and device.
fa_status check_like(const fa_tensor* t, const char* name, const fa_tensor& like, const char* like_name);

}  // namespace flashattn::validation
