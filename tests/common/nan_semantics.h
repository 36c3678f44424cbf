// NaN/Inf semantics (flashattn.h, docs/semantics.md) as test cases shared by
// the CPU suite and the GPU suites: NaN or Inf planted in q, k, v, dout at
// visible and masked positions; every backend's outputs, lse and gradients
// must carry NaN exactly where the fp64 reference does, and match it
// elsewhere with the usual tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/harness.h"
#include "common/kvcache_harness.h"
#include "core/kvcache.h"

namespace flashattn::testing {

enum class Operand { kQ, kK, kV, kDout };

struct Plant {
  Operand operand;
  int64_t row;  // global row (b * seqlen + i, or the varlen row)
  int head;
  int col;
  float value;
};

struct NanCase {
  std::string name;
  Case c;
  std::vector<Plant> plants;
  bool deterministic = false;  // the backward's deterministic mode (fa_options)
  // c's block mask by explicit classes (BlockClasses::cls, lists per sequence
  // and query head) instead of Case::block_density's random ones.
  std::vector<uint8_t> block_classes;
};

// gtest prints a case by its name rather than its bytes.
inline void PrintTo(const NanCase& c, std::ostream* os) { *os << c.name; }

inline void plant(Problem& p, const std::vector<Plant>& plants) {
  for (const Plant& x : plants) {
    HostTensor* t = x.operand == Operand::kQ   ? &p.q
                    : x.operand == Operand::kK ? &p.k
                    : x.operand == Operand::kV ? &p.v
                                               : &p.dout;
    write_row_element(*t, x.row, x.head, x.col, x.value);
  }
}

// The case's problem: its explicit block classes, if any, then its plants.
inline Problem make_nan_problem(const NanCase& nc) {
  Problem p = make_problem(nc.c);
  if (!nc.block_classes.empty()) {
    BlockClasses bc(nc.c.block_q, nc.c.block_k, nc.c.batch, nc.c.heads_q, nc.c.seqlen_q, nc.c.seqlen_k);
    bc.cls = nc.block_classes;
    set_block_mask(p, bc);
  }
  plant(p, nc.plants);
  return p;
}

inline std::vector<NanCase> nan_semantics_cases(fa_dtype dtype, int head_dim) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // More queries than keys, causal: rows 0..59 see nothing, row i sees keys
  // <= i - 60, so key 30 is visible to rows >= 90 and masked for 60..89, which
  // share the query tile 64..127 with them.
  Case causal;
  causal.dtype = dtype;
  causal.seqlen_q = 130;
  causal.seqlen_k = 70;
  causal.heads_q = 2;
  causal.heads_kv = 1;
  causal.head_dim = head_dim;
  causal.causal = true;
  causal.seed = 11;
  // A window that no row of the first 100 keys reaches: row i sees keys
  // [i + 100, i + 110], so keys 0..99 are masked for every row.
  Case window = causal;
  window.seqlen_q = 40;
  window.seqlen_k = 150;
  window.window_left = 10;
  window.seed = 12;
  // Variable lengths (rows of sequence 2 start at 7, its keys at 14).
  Case varlen = causal;
  varlen.varlen_q = {7, 0, 113, 64};
  varlen.varlen_k = {9, 5, 203, 0};
  varlen.seed = 13;
  // cu_seqlens_k = {0, 9, 14, 217, 217}, cu_seqlens_q = {0, 7, 7, 120, 184}:
  // sequence 1 has keys and no query rows, so nothing may see its keys 9 and
  // 10, though a kernel's tile of sequence 0's 9 keys spans them; q row 7 and
  // dout row 8 (sequence 2) lie just past sequence 0's 7 query rows.
  return {
      {"q_visible_nan", causal, {{Operand::kQ, 100, 0, 5, nan}}},
      {"k_visible_nan", causal, {{Operand::kK, 30, 0, 2, nan}}},
      {"v_visible_nan", causal, {{Operand::kV, 30, 0, 7, nan}}},
      {"v_visible_inf", causal, {{Operand::kV, 30, 0, 7, inf}}},
      {"dout_nan", causal, {{Operand::kDout, 100, 1, 3, nan}}},
      {"unseeing_row_q_nan_inf", causal, {{Operand::kQ, 10, 0, 5, nan}, {Operand::kQ, 20, 1, 0, inf}}},
      {"masked_keys_nan_inf", window,
       {{Operand::kK, 5, 0, 1, nan}, {Operand::kV, 5, 0, 1, inf}, {Operand::kK, 70, 0, 0, inf},
        {Operand::kV, 70, 0, 2, nan}, {Operand::kV, 99, 0, 3, -inf}}},
      {"varlen_mixed", varlen,
       {{Operand::kQ, 50, 1, 0, nan}, {Operand::kK, 3, 0, 4, nan}, {Operand::kV, 100, 0, 6, nan},
        {Operand::kK, 200, 0, 1, inf}}},
      {"varlen_isolation", varlen,
       {{Operand::kV, 9, 0, 2, nan}, {Operand::kK, 10, 0, 3, inf}, {Operand::kQ, 7, 1, 4, nan},
        {Operand::kDout, 8, 0, 5, nan}}},
  };
}

// Classes of 3 x 3 blocks for 2 query heads (BlockClasses::cls order; 0 not
// listed, 1 partial, 2 full), lower triangle only (the case is causal):
//   head 0: query block 0 {0}, 1 {1}, 2 {0, 2}; head 1: 0 {0}, 1 {0, 1}, 2 {1, 2}.
inline std::vector<uint8_t> nan_semantics_whole_tile_classes() {
  return {2, 0, 0, 0, 1, 0, 2, 0, 1,   // head 0
          1, 0, 0, 2, 2, 0, 0, 1, 2};  // head 1
}

// The shared cases' causal and windowed problems with one thing changed each,
// for the kernel paths the shared cases do not take (the CUDA suite's; the CPU
// backend runs them too).
inline std::vector<NanCase> nan_semantics_path_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<NanCase> base = nan_semantics_cases(FA_BF16, 64);
  const NanCase& masked = base[6];  // masked_keys_nan_inf: window, NaN/Inf at keys no row sees
  const NanCase& v_inf = base[3];   // v_visible_inf: causal, Inf at a key some rows of a tile see
  std::vector<NanCase> out;
  auto add = [&](const NanCase& from, const std::string& name, auto&& change) {
    NanCase nc = from;
    nc.name = name;
    change(nc);
    out.push_back(nc);
  };
  // Several KV heads, two query heads each; plants at KV head 1.
  add(v_inf, "gqa_groups_v_inf", [&](NanCase& nc) {
    nc.c.heads_q = 4;
    nc.c.heads_kv = 2;
    nc.plants = {{Operand::kV, 30, 1, 7, inf}, {Operand::kK, 65, 1, 3, nan}};  // key 65: rows 125-129 see it
  });
  add(masked, "deterministic_masked", [](NanCase& nc) { nc.deterministic = true; });
  add(v_inf, "deterministic_v_inf", [](NanCase& nc) { nc.deterministic = true; });
  // A head dim below the kernel's (the Hopper kernels pad 96 to 128).
  add(masked, "padded_d96_masked", [](NanCase& nc) { nc.c.head_dim = 96; });
  add(v_inf, "padded_d96_v_inf", [](NanCase& nc) { nc.c.head_dim = 96; });
  add(masked, "d256_masked", [](NanCase& nc) { nc.c.head_dim = 256; });
  add(v_inf, "d256_v_inf", [](NanCase& nc) { nc.c.head_dim = 256; });
  // Score extras: softcap, ALiBi per (sequence, head), sinks.
  add(v_inf, "softcap_alibi_sinks_v_inf", [](NanCase& nc) {
    nc.c.softcap = 5.0f;
    nc.c.alibi = Case::Alibi::kPerBatchHead;
    nc.c.sinks = true;
  });
  add(masked, "alibi_sinks_masked", [](NanCase& nc) {
    nc.c.alibi = Case::Alibi::kPerHead;
    nc.c.sinks = true;
  });
  add(v_inf, "dropout_v_inf", [](NanCase& nc) { nc.c.dropout_p = 0.2f; });
  add(masked, "dropout_masked", [](NanCase& nc) { nc.c.dropout_p = 0.2f; });
  // A block mask over the causal problem: NaN/Inf at keys of blocks some rows
  // of a tile list and others do not.
  add(v_inf, "block_mask_v_inf", [&](NanCase& nc) {
    nc.c.block_q = 16;
    nc.c.block_k = 16;
    nc.c.block_density = 0.6;
    nc.plants = {{Operand::kV, 30, 0, 7, inf}, {Operand::kK, 20, 0, 2, nan}, {Operand::kV, 45, 0, 1, nan}};
  });
  // Whole 128 x 128 blocks, which the Hopper kernels take in both directions
  // (the backward only when every listed tile is whole on its tiles), at both
  // head-dim buckets. Causal over 384 x 384: rows 256..299 share the tile of
  // key 300 (Inf in V) without seeing it, so their stores come out NaN and are
  // recomputed; head 0's lists make them skip key block 1, which they see
  // causally, so the recompute must honour the launch's lists (the reference
  // keeps them finite). K NaN at key 140 reaches only the rows whose lists
  // hold key block 1 (all of head 1's query block 2, none of head 0's): 200
  // and 244 non-finite rows of 384 in the reference.
  for (const auto& shape : {std::pair{FA_BF16, 64}, std::pair{FA_F16, 128}}) {
    const fa_dtype dt = shape.first;  // (not a structured binding: the lambda below captures them)
    const int d = shape.second;
    add(v_inf, std::string("block_mask_whole_tiles_v_inf_") + fa_dtype_name(dt) + "_d" + std::to_string(d),
        [&](NanCase& nc) {
          nc.c.dtype = dt;
          nc.c.head_dim = d;
          nc.c.seqlen_q = nc.c.seqlen_k = 384;
          nc.c.block_q = nc.c.block_k = 128;
          nc.block_classes = nan_semantics_whole_tile_classes();
          nc.plants = {{Operand::kV, 300, 0, 7, inf}, {Operand::kK, 140, 0, 2, nan}};
        });
  }
  return out;
}

// Forward results against the reference of the planted problem.
inline void expect_forward_semantics(const Problem& p, const HostTensor& out, const HostTensor& lse) {
  const Expected e = expected_forward(p);
  const Comparison co = compare_rows(out, e.exact.out, e.naive.out, default_atol(p.c.dtype), true);
  EXPECT_TRUE(co.ok) << co.describe("out");
  const Comparison cl = compare_lse(lse, e.exact.lse, e.naive.lse, 1e-4, true);
  EXPECT_TRUE(cl.ok) << cl.describe("lse");
}

// Gradients against the reference of the planted problem.
inline void expect_backward_semantics(const Problem& p, const HostTensor& dq, const HostTensor& dk,
                                      const HostTensor& dv) {
  expect_gradients_match(p, dq, dk, dv, true);
}

// ---- Against a KV cache (fa_forward_kvcache): the same rules ----

// Element (sequence b's key j, KV head hk, column col) of the K or V cache
// (a cached token: j < the sequence's cache length), or of q (row b *
// seqlen_q + i, head h).
struct KvPlant {
  Operand operand;  // kQ, kK or kV
  int b;
  int index;  // key j, or query position i
  int head;
  int col;
  float value;
};

struct KvNanCase {
  std::string name;
  KvCase c;
  std::vector<KvPlant> plants;
};

inline void PrintTo(const KvNanCase& c, std::ostream* os) { *os << c.name; }

inline KvProblem make_kv_nan_problem(const KvNanCase& nc) {
  KvProblem p = make_kv_problem(nc.c);
  const KvCacheParams kp = p.host_params();
  for (const KvPlant& x : nc.plants) {
    if (x.operand == Operand::kQ) {
      write_row_element(p.q, int64_t{x.b} * nc.c.seqlen_q + x.index, x.head, x.col, x.value);
      continue;
    }
    HostTensor& cache = x.operand == Operand::kK ? p.k_cache : p.v_cache;
    const CacheSlot s = cache_slot(kp, x.b, x.index);
    write_row_element(cache, s.row * cache.desc.shape[1] + s.slot, x.head, x.col, x.value);
  }
  return p;
}

// Several query positions per call, so a key can be visible to some rows of a
// packed tile and masked for others (bottom-right causal: row i of a sequence
// of L keys sees keys <= L - seqlen_q + i). The decode kernel (seqlen_q < 64,
// pages of any size, cache_batch_idx, forced splits) and, on a Hopper GPU, the
// forward's KV-cache route (seqlen_q >= 64, contiguous or 64-token pages).
inline std::vector<KvNanCase> kvcache_nan_cases(fa_dtype dtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  using O = Operand;
  // Sequence 0: 70 keys, rows 0..3 see keys <= 66 + i; sequence 1: 41 keys, <= 37 + i.
  const KvCase causal{.seqlen_q = 4, .heads_q = 8, .heads_kv = 2, .head_dim = 128, .cached = {70, 41},
                      .dtype = dtype, .causal = true, .seed = 31};
  const std::vector<KvPlant> causal_plants = {
      {O::kV, 0, 68, 0, 3, nan},   // rows 2, 3 of heads 0-3
      {O::kV, 0, 69, 1, 5, inf},   // row 3 of heads 4-7
      {O::kK, 1, 40, 0, 1, nan},   // row 3 of sequence 1, heads 0-3
      {O::kQ, 0, 1, 2, 0, nan}};   // row 1 of head 2
  // 60 + 5 new keys: row i sees [50 + i, 60 + i]; 33 + 5: [23 + i, 33 + i].
  const KvCase window{.seqlen_q = 5, .heads_q = 4, .heads_kv = 1, .head_dim = 128, .cached = {60, 33},
                      .seqlen_new = 5, .page_size = 16, .dtype = dtype, .window_left = 10, .window_right = 0,
                      .seed = 32};
  const std::vector<KvPlant> window_plants = {
      {O::kV, 0, 52, 0, 2, nan},   // rows 0-2
      {O::kV, 0, 45, 0, 0, inf},   // no row
      {O::kK, 0, 47, 0, 1, nan},   // no row
      {O::kV, 1, 20, 0, 4, -inf},  // no row
      {O::kV, 1, 30, 0, 6, nan}};  // every row
  KvCase extras{.seqlen_q = 3, .heads_q = 4, .heads_kv = 2, .head_dim = 64, .cached = {50, 90},
                .batch_idx = true, .dtype = dtype, .causal = true, .softcap = 20.0f, .alibi = true,
                .sinks = true, .seed = 33};
  const std::vector<KvPlant> extras_plants = {
      {O::kV, 0, 49, 1, 7, nan},   // row 2 of heads 2, 3
      {O::kV, 0, 48, 0, 0, inf}};  // rows 1, 2 of heads 0, 1
  // The forward route: 150 keys, row i sees keys <= 50 + i; 20 keys: rows >= 80 see keys <= i - 80.
  const KvCase chunk{.seqlen_q = 100, .heads_q = 4, .heads_kv = 1, .head_dim = 128, .cached = {150, 20},
                     .dtype = dtype, .causal = true, .seed = 34};
  const std::vector<KvPlant> chunk_plants = {
      {O::kV, 0, 80, 0, 3, nan},    // rows >= 30
      {O::kV, 0, 140, 0, 9, inf},   // rows >= 90
      {O::kK, 0, 120, 0, 0, nan},   // rows >= 70
      {O::kV, 1, 10, 0, 1, nan},    // rows >= 90
      {O::kV, 1, 19, 0, 2, inf}};   // row 99
  KvCase paged_chunk = chunk;
  paged_chunk.page_size = 64;
  // 200 keys, window: row i sees [90 + i, 120 + i].
  const KvCase chunk_extras{.seqlen_q = 80, .heads_q = 4, .heads_kv = 4, .head_dim = 64, .cached = {200},
                            .dtype = dtype, .window_left = 30, .window_right = 0, .softcap = 15.0f,
                            .alibi = true, .sinks = true, .seed = 35};
  const std::vector<KvPlant> chunk_extras_plants = {
      {O::kV, 0, 100, 2, 2, nan},  // rows 0-10 of head 2
      {O::kV, 0, 60, 1, 0, inf},   // no row
      {O::kK, 0, 199, 3, 5, nan}};  // row 79 of head 3
  return {
      {"decode_causal", causal, causal_plants},
      {"decode_window_paged16_append", window, window_plants},
      {"decode_batch_idx_extras", extras, extras_plants},
      {"chunk_causal", chunk, chunk_plants},
      {"chunk_causal_paged64", paged_chunk, chunk_plants},
      {"chunk_window_extras", chunk_extras, chunk_extras_plants},
  };
}

// out and lse against the reference of the planted problem (NaN exactly where
// it has one), and the caches (appended rows, every other element unchanged).
inline ::testing::AssertionResult kvcache_semantics_match(const KvProblem& p, const HostTensor& out,
                                                          const HostTensor& lse, const HostTensor& k_after,
                                                          const HostTensor& v_after) {
  return kvcache_call_matches(p, expected_kvcache(p), out, lse, k_after, v_after, true);
}

}  // namespace flashattn::testing
