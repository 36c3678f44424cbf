// The shapes and options every backend is run over (the CPU suite and the GPU
// suites share them), so that "correct on every shape" means the same thing.
#pragma once

#include <cmath>
#include <vector>

#include "common/harness.h"

namespace flashattn::testing {

// Head dims every backend claims (the CPU backend takes any multiple of 8).
inline const std::vector<int>& suite_head_dims() {
  static const std::vector<int> dims = {8, 40, 64, 72, 80, 96, 128, 160, 192, 256};
  return dims;
}

inline Case make_case(fa_dtype dtype, int sq, int sk, int d, uint64_t seed) {
  Case c;
  c.dtype = dtype;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.head_dim = d;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.seed = seed;
  return c;
}

// Logits of standard deviation ~12 (scale 12/sqrt(d) on unit normal q, k): a
// row's running max keeps growing by more than 2^8 (after exp2) at later key
// tiles, in either walk direction, with tiles where it stays in between: the
// O rescale by exp(m_old - m_new) then matters at every tile, and a lazy
// rescale (O *= corr only when some row's max moved that far; measured and
// not kept, docs/performance.md) would take both of its branches. With the
// default scale the max settles within the first key tile.
inline std::vector<Case> large_logit_cases(const std::vector<int>& head_dims, uint64_t seed) {
  std::vector<Case> cases;
  for (fa_dtype dt : {FA_BF16, FA_F16}) {
    for (int d : head_dims) {
      Case c = make_case(dt, 77, 1000, d, seed++);
      c.scale = 12.0f / std::sqrt(static_cast<float>(d));
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
    }
  }
  return cases;
}

// Forward and backward suites. `head_dims` restricts head dims (GPU kernels
// that do not take 8); `large` adds the 1023-long sequences.
inline std::vector<Case> attention_suite(const std::vector<fa_dtype>& dtypes,
                                         const std::vector<int>& head_dims, bool large) {
  std::vector<Case> cases;
  uint64_t seed = 1;
  for (fa_dtype dt : dtypes) {
    // Sequence lengths, square and not, at head dim 64.
    std::vector<std::pair<int, int>> lengths = {{1, 1},     {7, 7},   {113, 113}, {203, 203},
                                                {113, 203}, {1, 239}, {239, 1}};
    if (large) lengths.push_back({1023, 1023});
    for (auto [sq, sk] : lengths) {
      for (bool causal : {false, true}) {
        Case c = make_case(dt, sq, sk, 64, seed++);
        c.causal = causal;
        cases.push_back(c);
      }
    }
    // Every head dim.
    for (int d : head_dims) {
      Case c = make_case(dt, 113, 203, d, seed++);
      cases.push_back(c);
      c.causal = true;
      c.seqlen_q = 203;
      c.seqlen_k = 113;  // more queries than keys: leading rows fully masked
      cases.push_back(c);
    }
    // Options.
    const int d = 64;
    for (auto [left, right] : std::vector<std::pair<int, int>>{{32, 0}, {16, 16}, {-1, 8}, {50, -1}, {0, 0}}) {
      Case c = make_case(dt, 203, 113, d, seed++);
      c.window_left = left;
      c.window_right = right;
      cases.push_back(c);
      std::swap(c.seqlen_q, c.seqlen_k);
      cases.push_back(c);
    }
    {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.softcap = 5.0f;
      cases.push_back(c);
      c.causal = true;
      c.scale = 0.3f;
      cases.push_back(c);
    }
    for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{4, 2}, {8, 1}}) {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.heads_q = hq;
      c.heads_kv = hkv;
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
    }
    {
      Case c = make_case(dt, 0, 0, d, seed++);
      c.varlen_q = {7, 0, 113, 64, 1};
      c.varlen_k = {9, 5, 203, 0, 1};
      cases.push_back(c);
      c.causal = true;
      c.heads_q = 4;
      cases.push_back(c);
      c.causal = false;
      c.window_left = 20;
      c.window_right = 3;
      cases.push_back(c);
    }
    {
      Case c = make_case(dt, 113, 203, 128, seed++);
      c.batch = 3;
      c.row_pad = 8;  // non-contiguous rows
      c.causal = true;
      cases.push_back(c);
    }
  }
  return cases;
}

// A causal variable-length batch with empty sequences on either side, GQA 4:2.
inline Case varlen_causal_case(fa_dtype dt, uint64_t seed) {
  Case c = make_case(dt, 0, 0, 64, seed);
  c.varlen_q = {7, 0, 113, 64, 1};
  c.varlen_k = {9, 5, 203, 0, 1};
  c.heads_q = 4;
  c.causal = true;
  return c;
}

// Score extras (ALiBi, sinks) alone and together, combined with causal,
// window, softcap, GQA, varlen and odd sizes, at head dim 64, then both at
// every head dim in `head_dims`.
inline std::vector<Case> variants_suite(const std::vector<fa_dtype>& dtypes,
                                        const std::vector<int>& head_dims) {
  using Alibi = Case::Alibi;
  struct Extras {
    Alibi alibi;
    bool sinks;
  };
  std::vector<Case> cases;
  uint64_t seed = 1000;
  for (fa_dtype dt : dtypes) {
    for (Extras x : {Extras{Alibi::kPerHead, false}, Extras{Alibi::kOff, true},
                     Extras{Alibi::kPerBatchHead, true}}) {
      const auto with = [&](Case c) {
        c.alibi = x.alibi;
        c.sinks = x.sinks;
        cases.push_back(c);
      };
      for (auto [sq, sk] : std::vector<std::pair<int, int>>{{1, 1}, {7, 7}, {113, 203}, {1, 239}}) {
        with(make_case(dt, sq, sk, 64, seed++));
      }
      Case c = make_case(dt, 203, 113, 64, seed++);
      c.causal = true;  // leading rows see no key: out 0, lse = sink (or -inf)
      with(c);
      c = make_case(dt, 113, 203, 64, seed++);
      c.window_left = 32;
      c.window_right = 0;
      with(c);
      c = make_case(dt, 113, 203, 64, seed++);
      c.softcap = 5.0f;
      c.causal = true;
      with(c);
      c = make_case(dt, 113, 203, 64, seed++);
      c.heads_q = 8;
      c.heads_kv = 2;
      c.causal = true;
      c.batch = 2;
      with(c);
      with(varlen_causal_case(dt, seed++));
    }
    for (int d : head_dims) {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.alibi = Alibi::kPerHead;
      c.sinks = true;
      cases.push_back(c);
    }
    // Long enough for whole tiles on each side of the diagonal (the kernels'
    // linear ALiBi form) as well as across it.
    // Seeds of their own, so the cases above keep theirs.
    for (bool causal : {false, true}) {
      Case c = make_case(dt, 1023, 700, 64, 5000 + 2 * static_cast<uint64_t>(dt) + (causal ? 1 : 0));
      c.alibi = Alibi::kPerBatchHead;
      c.batch = 2;
      c.causal = causal;
      cases.push_back(c);
    }
  }
  return cases;
}

// Dropout (p = 0.17 and 0.5) alone and with causal, windows, softcap, GQA,
// varlen, ALiBi and sinks (with and without softcap), odd sizes; every head
// dim in `head_dims` once.
// NOTES: no row sees a single key here. There P = 1 and dS = z dP - D = 0
// exactly; naive attention gets 0, the backends form D = dO . O from O
// rounded to the dtype (z V is not exact in it), leaving u |dP|, which the
// 2x-naive rule has no room for. Without dropout O = V is exact.
inline std::vector<Case> dropout_suite(const std::vector<fa_dtype>& dtypes,
                                       const std::vector<int>& head_dims) {
  std::vector<Case> cases;
  uint64_t seed = 2000;
  for (fa_dtype dt : dtypes) {
    for (float p : {0.17f, 0.5f}) {
      const auto with = [&](Case c) {
        c.dropout_p = p;
        cases.push_back(c);
      };
      for (auto [sq, sk] : std::vector<std::pair<int, int>>{{1, 17}, {7, 7}, {113, 203}, {203, 113}}) {
        Case c = make_case(dt, sq, sk, 64, seed++);
        with(c);
        c.causal = sq <= sk;  // causal with sq > sk: the first key row sees one key
        if (c.causal) with(c);
      }
      Case c = make_case(dt, 113, 203, 64, seed++);
      c.window_left = 20;
      c.window_right = 5;
      c.softcap = 5.0f;
      with(c);
      c = make_case(dt, 113, 203, 64, seed++);
      c.heads_q = 8;
      c.heads_kv = 2;
      c.batch = 2;
      c.alibi = Case::Alibi::kPerHead;
      c.sinks = true;
      with(c);
      with(varlen_causal_case(dt, seed++));
    }
    for (int d : head_dims) {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.dropout_p = 0.3f;
      cases.push_back(c);
    }
  }
  // Softcap with ALiBi and sinks (on an H100 the sm80 backward runs that with
  // dropout); seeds of their own, so the cases above keep theirs.
  seed = 2900;
  for (fa_dtype dt : dtypes) {
    Case c = make_case(dt, 113, 203, 64, seed++);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.softcap = 5.0f;
    c.alibi = Case::Alibi::kPerHead;
    c.sinks = true;
    c.dropout_p = 0.17f;
    cases.push_back(c);
  }
  return cases;
}

// Block masks (fa_block_mask) of density 0, 0.1, 0.5 and 1, with block sizes
// that divide no sequence length (and FlexAttention's 128 x 128), alone and
// with causal, window + softcap, GQA with lists shared by every sequence and
// head, varlen (with empty sequences), ALiBi + sinks, dropout, all of causal,
// window, softcap, ALiBi and sinks together, odd sizes; every head dim in
// `head_dims` once at density 0.5.
inline std::vector<Case> block_sparse_suite(const std::vector<fa_dtype>& dtypes,
                                            const std::vector<int>& head_dims) {
  std::vector<Case> cases;
  uint64_t seed = 3000;
  for (fa_dtype dt : dtypes) {
    for (double density : {0.0, 0.1, 0.5, 1.0}) {
      const auto with = [&](Case c, int block_q, int block_k) {
        c.block_q = block_q;
        c.block_k = block_k;
        c.block_density = density;
        cases.push_back(c);
      };
      for (auto [bq, bk] : std::vector<std::pair<int, int>>{{128, 128}, {16, 48}, {7, 13}}) {
        with(make_case(dt, 113, 203, 64, seed++), bq, bk);
        Case c = make_case(dt, 203, 113, 64, seed++);
        c.causal = true;
        with(c, bq, bk);
      }
      with(make_case(dt, 1, 1, 64, seed++), 128, 128);
      with(make_case(dt, 7, 7, 64, seed++), 1, 3);
      Case c = make_case(dt, 113, 203, 64, seed++);
      c.window_left = 32;
      c.window_right = 0;
      c.softcap = 5.0f;
      with(c, 16, 32);
      c = make_case(dt, 113, 203, 64, seed++);
      c.heads_q = 8;
      c.heads_kv = 2;
      c.batch = 2;
      c.causal = true;
      c.block_shared = true;
      with(c, 32, 16);
      c.block_shared = false;
      c.alibi = Case::Alibi::kPerHead;
      c.sinks = true;
      with(c, 64, 64);
      with(varlen_causal_case(dt, seed++), 16, 24);
      c = make_case(dt, 113, 203, 64, seed++);
      c.dropout_p = 0.17f;  // every listed block holds >= 11 keys: no row sees a single key (dropout_suite)
      with(c, 16, 32);
    }
    for (int d : head_dims) {
      Case c = make_case(dt, 113, 203, d, seed++);
      c.block_q = 16;
      c.block_k = 32;
      c.block_density = 0.5;
      cases.push_back(c);
    }
  }
  // Every element mask and score modifier at once: causal, a window, softcap,
  // ALiBi per sequence and head, sinks, GQA (on an H100 the sm80 backward runs
  // softcap with ALiBi and a block mask); seeds of their own, so the cases
  // above keep theirs.
  seed = 3900;
  for (fa_dtype dt : dtypes) {
    for (double density : {0.1, 0.5, 1.0}) {
      Case c = make_case(dt, 113, 203, 64, seed++);
      c.heads_q = 8;
      c.heads_kv = 2;
      c.batch = 2;
      c.causal = true;
      c.window_left = 40;
      c.window_right = 0;
      c.softcap = 5.0f;
      c.alibi = Case::Alibi::kPerBatchHead;
      c.sinks = true;
      c.block_q = 16;
      c.block_k = 32;
      c.block_density = density;
      cases.push_back(c);
    }
  }
  return cases;
}

}  // namespace flashattn::testing
