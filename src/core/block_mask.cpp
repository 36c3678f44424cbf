#include "core/block_mask.h"

#include <string>
#include <vector>

#include "core/abi_enum.h"
#include "core/error.h"
#include "core/validate.h"
#include "core/validate_parts.h"

namespace flashattn {
namespace {

using validation::shape_string;

// One (num_blocks, indices) pair of the mask with its argument names.
struct ListArgs {
  const fa_tensor* counts;
  const fa_tensor* indices;
  const char* counts_name;
  const char* indices_name;
};

// An int32 host tensor of `ndim` dimensions whose every element lies inside
// memory that does not wrap (strides positive where a dimension exceeds 1,
// the last one contiguous).
fa_status check_int_tensor(const fa_tensor* t, const char* name, int ndim) {
  const std::string n(name);
  if (t == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, n + " is a null pointer");
  if (t->ndim != ndim) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                n + " must have " + std::to_string(ndim) + " dimensions, got " + std::to_string(t->ndim));
  }
  if (enum_code(t->dtype) != FA_I32) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " must be int32 (FA_I32), got dtype code " +
                                               std::to_string(enum_code(t->dtype)));
  }
  if (enum_code(t->device) != FA_DEVICE_CPU) {
    return fail(FA_ERROR_INVALID_ARGUMENT, n + " must be host memory (the lists are read on the host, and copied "
                                               "to the device for CUDA calls)");
  }
  int64_t elements = 1;
  for (int i = 0; i < ndim; ++i) {
    if (t->shape[i] < 0 || __builtin_mul_overflow(elements, t->shape[i], &elements)) {
      return fail(FA_ERROR_INVALID_ARGUMENT, n + " has a negative or too large shape " + shape_string(*t));
    }
  }
  return elements == 0 ? FA_OK : check_tensor_extent(*t, name);
}

// counts (B, H, q_blocks) and indices (B, H, q_blocks, capacity) with
// B in {1, batch}, H in {1, heads_q}, both tensors agreeing.
fa_status check_list_shapes(const ListArgs& a, const AttentionParams& p, int q_blocks) {
  FA_RETURN_IF_ERROR(check_int_tensor(a.counts, a.counts_name, 3));
  FA_RETURN_IF_ERROR(check_int_tensor(a.indices, a.indices_name, 4));
  const int64_t* s = a.counts->shape;
  if ((s[0] != 1 && s[0] != p.batch) || (s[1] != 1 && s[1] != p.heads_q) || s[2] != q_blocks) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                std::string(a.counts_name) + " has shape " + shape_string(*a.counts) + ", expected (1 or " +
                    std::to_string(p.batch) + ", 1 or " + std::to_string(p.heads_q) + " (heads_q), " +
                    std::to_string(q_blocks) + " (query blocks))");
  }
  const int64_t* si = a.indices->shape;
  if (si[0] != s[0] || si[1] != s[1] || si[2] != s[2]) {
    return fail(FA_ERROR_INVALID_ARGUMENT, std::string(a.indices_name) + " has shape " +
                                               shape_string(*a.indices) + ", its first three dimensions must be " +
                                               a.counts_name + "'s " + shape_string(*a.counts));
  }
  return FA_OK;
}

BlockList list_of(const ListArgs& a) {
  BlockList l;
  l.counts = static_cast<const int32_t*>(a.counts->data);
  l.indices = static_cast<const int32_t*>(a.indices->data);
  for (int i = 0; i < 3; ++i) l.count_strides[i] = a.counts->shape[i] > 1 ? a.counts->strides[i] : 0;
  for (int i = 0; i < 4; ++i) l.index_strides[i] = a.indices->shape[i] > 1 ? a.indices->strides[i] : 0;
  return l;
}

std::string at(const char* name, int b, int h, int qb) {
  return std::string(name) + "[" + std::to_string(b) + "][" + std::to_string(h) + "][" + std::to_string(qb) + "]";
}

// Reads every entry a backend can read: counts in [0, capacity], indices in
// [0, k_blocks), and no key block twice in the two lists of a query block
// (`seen` holds, per key block, the last row stamp that listed it).
fa_status check_row(const BlockList& l, const ListArgs& a, int b, int h, int qb, int k_blocks,
                    int64_t stamp, std::vector<int64_t>& seen) {
  const int64_t count = l.count(b, h, qb), capacity = a.indices->shape[3];
  if (count < 0 || count > capacity) {
    return fail(FA_ERROR_INVALID_ARGUMENT, at(a.counts_name, b, h, qb) + " = " + std::to_string(count) +
                                               ", must be in [0, " + std::to_string(capacity) + "] (" +
                                               a.indices_name + "'s last dimension)");
  }
  // NOTES: the entry's name is built only for an error: built for every
  // entry, it made a call with 65,536 entries 5x slower (docs/variants.md,
  // "Cost on the CPU backend").
  const auto where = [&](int n, int kb) {
    return at(a.indices_name, b, h, qb) + "[" + std::to_string(n) + "] = " + std::to_string(kb);
  };
  for (int n = 0; n < count; ++n) {
    const int kb = l.index(b, h, qb, n);
    if (kb < 0 || kb >= k_blocks) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  where(n, kb) + " is not a key block: must be in [0, " + std::to_string(k_blocks) + ")");
    }
    if (seen[kb] == stamp) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  where(n, kb) + " lists a key block already listed for this query block (each block once, "
                                 "in kv_indices or full_kv_indices)");
    }
    seen[kb] = stamp;
  }
  return FA_OK;
}

fa_status check_entries(const BlockMaskView& m, const ListArgs& partial, const ListArgs* full) {
  std::vector<int64_t> seen(static_cast<size_t>(m.k_blocks), -1);
  int64_t stamp = 0;
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int qb = 0; qb < m.q_blocks; ++qb, ++stamp) {
        FA_RETURN_IF_ERROR(check_row(m.partial, partial, b, h, qb, m.k_blocks, stamp, seen));
        if (full != nullptr) FA_RETURN_IF_ERROR(check_row(m.full, *full, b, h, qb, m.k_blocks, stamp, seen));
      }
    }
  }
  return FA_OK;
}

fa_status check_header(const fa_block_mask& m) {
  for (int32_t r : m.reserved) {
    if (r != 0) return fail(FA_ERROR_INVALID_ARGUMENT, "block_mask.reserved must be zero");
  }
  if (m.block_q <= 0 || m.block_k <= 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "block_mask.block_q and block_k must be positive, got " +
                                               std::to_string(m.block_q) + " x " + std::to_string(m.block_k));
  }
  if ((m.full_kv_num_blocks == nullptr) != (m.full_kv_indices == nullptr)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "block_mask.full_kv_num_blocks and full_kv_indices must be given together or both NULL");
  }
  return FA_OK;
}

int blocks_of(int length, int block) { return static_cast<int>((int64_t{length} + block - 1) / block); }

}  // namespace

fa_status apply_block_mask(const fa_block_mask* mask, AttentionParams* p) {
  if (mask == nullptr) return FA_OK;
  FA_RETURN_IF_ERROR(check_header(*mask));
  BlockMaskView m;
  m.block_q = mask->block_q;
  m.block_k = mask->block_k;
  m.q_blocks = blocks_of(p->seqlen_q, m.block_q);
  m.k_blocks = blocks_of(p->seqlen_k, m.block_k);
  const ListArgs partial{mask->kv_num_blocks, mask->kv_indices, "block_mask.kv_num_blocks",
                         "block_mask.kv_indices"};
  const ListArgs full{mask->full_kv_num_blocks, mask->full_kv_indices, "block_mask.full_kv_num_blocks",
                      "block_mask.full_kv_indices"};
  const bool has_full = mask->full_kv_num_blocks != nullptr;
  FA_RETURN_IF_ERROR(check_list_shapes(partial, *p, m.q_blocks));
  m.batch = static_cast<int>(partial.counts->shape[0]);
  m.heads = static_cast<int>(partial.counts->shape[1]);
  if (has_full) {
    FA_RETURN_IF_ERROR(check_list_shapes(full, *p, m.q_blocks));
    if (full.counts->shape[0] != m.batch || full.counts->shape[1] != m.heads) {
      return fail(FA_ERROR_INVALID_ARGUMENT, "block_mask.full_kv_num_blocks has shape " +
                                                 shape_string(*full.counts) + ", its (B, H) must be kv_num_blocks' " +
                                                 shape_string(*partial.counts));
    }
  }
  m.partial = list_of(partial);
  if (has_full) m.full = list_of(full);
  FA_RETURN_IF_ERROR(check_entries(m, partial, has_full ? &full : nullptr));
  p->block_mask = m;
  return FA_OK;
}

}  // namespace flashattn
