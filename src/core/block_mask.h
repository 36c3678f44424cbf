// Validation of fa_block_mask (fa_extras.block_mask) into AttentionParams.
#pragma once

#include "core/params.h"

namespace flashattn {

// Checks the block mask against p (shapes filled: batch, heads_q, seqlen_q/k,
// device) and sets p->block_mask; NULL leaves it off. Every count and every
// index a backend can read is read and checked here, in 64-bit arithmetic,
// before any attention memory is touched.
fa_status apply_block_mask(const fa_block_mask* mask, AttentionParams* p);

}  // namespace flashattn
