// Validation of fa_extras (ALiBi slopes, attention sinks and their gradient)
// into AttentionParams, after the shapes and options are validated.
#pragma once

#include "core/params.h"

namespace flashattn {

enum class Pass { kForward, kBackward };

// Checks every extra against q (device) and p (batch, heads_q) and sets the
// params' pointers; extras may be null (everything off).
fa_status apply_extras(const fa_extras* extras, const fa_tensor& q, Pass pass, AttentionParams* p);
// The extras of a KV-cache call: ALiBi and sinks; dropout, dsinks and a block
// mask refused.
fa_status apply_kvcache_extras(const fa_extras* extras, const fa_tensor& q, AttentionParams* p);

// fa_dropout_mask: checks its arguments, then writes the dropout factors.
fa_status dropout_mask(const fa_extras* extras, fa_tensor* mask);

}  // namespace flashattn
