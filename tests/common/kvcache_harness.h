// Test problems for attention against a KV cache (fa_forward_kvcache), shared
// by the CPU and GPU suites: random caches (contiguous or paged with shuffled
// block tables), ragged lengths, new tokens, rotary tables; the float64
// reference; and the checks of out, lse and the cache contents after the call.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/harness.h"
#include "core/kvcache.h"

namespace flashattn::testing {

struct KvCase {
  int seqlen_q = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int head_dim = 64;
  std::vector<int> cached;  // tokens in the cache per sequence (batch = size)
  bool one_length = false;  // pass cache_seqlen (one int) instead of cache_seqlens
  int seqlen_new = 0;
  int page_size = 0;        // 0: contiguous cache
  bool batch_idx = false;   // contiguous: sequences in permuted cache rows
  int rotary_dim = 0;
  bool interleaved = false;
  fa_dtype dtype = FA_BF16;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  int num_splits = 0;
  bool alibi = false;  // ALiBi slopes per (sequence, head) through fa_forward_kvcache_ex
  bool slopes_per_head = false;  // with alibi: one slope per head (heads_q), shared by the sequences
  bool sinks = false;  // an attention sink per head, likewise
  uint64_t seed = 1;

  int batch() const { return static_cast<int>(cached.size()); }
  std::string name() const;
};
inline void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name(); }

struct KvProblem {
  KvCase c;
  HostTensor q, k_cache, v_cache, k_new, v_new, cos, sin, slopes, sinks;
  std::vector<int32_t> block_table, cache_seqlens, cache_batch_idx;
  int max_blocks = 0;
  fa_options options{};

  // Descriptor over the given tensors (host or device twins of the ones here)
  // and index arrays.
  fa_kvcache describe(fa_tensor* k_cache, fa_tensor* v_cache, const fa_tensor* k_new,
                      const fa_tensor* v_new, const fa_tensor* cos, const fa_tensor* sin,
                      const int32_t* block_table, const int32_t* cache_seqlens,
                      const int32_t* cache_batch_idx) const;
  // The case's ALiBi slopes and sinks over the given tensors (host or device
  // twins of slopes / sinks; ignored when the case has none).
  fa_extras extras(const fa_tensor* slopes, const fa_tensor* sinks) const;
  // Params over the host tensors, for the reference.
  KvCacheParams host_params() const;
  HostTensor poisoned_out() const;
  HostTensor poisoned_lse() const;
};

KvProblem make_kv_problem(const KvCase& c);

struct KvExpected {
  reference::KvCacheResult exact, naive;
};
KvExpected expected_kvcache(const KvProblem& p);

// out and lse against the reference, and the caches after the call: appended
// slots hold the new (rotated) tokens, every other element is unchanged.
// nan_exact: out and lse must be NaN exactly where the reference is (compare_rows).
::testing::AssertionResult kvcache_call_matches(const KvProblem& p, const KvExpected& e,
                                                const HostTensor& out, const HostTensor& lse,
                                                const HostTensor& k_after,
                                                const HostTensor& v_after, bool nan_exact = false);

// The cases the issue lists (lengths, pages, GQA, head dims, options, rotary).
std::vector<KvCase> kvcache_suite(fa_dtype dtype);
// Cases with ALiBi and sinks (every backend).
std::vector<KvCase> kvcache_extras_suite(fa_dtype dtype);

}  // namespace flashattn::testing
