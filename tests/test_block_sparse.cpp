// Block-sparse masks (fa_block_mask): the CPU backend against the float64
// reference over block_sparse_suite; a mask listing every block bitwise equal
// to the dense call; masks built the way FlexAttention's create_block_mask
// builds them (causal, sliding window, documents); the reference's block
// semantics against a direct computation; the ABI layout; every validation error.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "common/harness.h"
#include "common/suites.h"
#include "common/variants_check.h"
#include "core/block_mask.h"
#include "core/layout.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {
namespace {

// The extras' layout is ABI: block_mask took reserved[0..1].
static_assert(offsetof(fa_extras, dropout_offset) == 40, "fa_extras layout");
static_assert(offsetof(fa_extras, block_mask) == 48, "fa_extras layout");
static_assert(offsetof(fa_extras, reserved) == 56 && sizeof(fa_extras) == 80, "fa_extras layout");

int32_t* ints(HostTensor& t) { return reinterpret_cast<int32_t*>(t.bytes.data()); }

// Outputs of one CPU forward (and backward) with the problem's extras, from poisoned tensors.
struct CpuResults {
  HostTensor out, lse, dq, dk, dv, dsinks;
};

::testing::AssertionResult run_cpu(const Problem& p, bool backward, CpuResults& r) {
  fa_options o = p.options;
  o.backend = FA_BACKEND_CPU;
  fa_extras x = p.extras();
  r.out = p.poisoned_like_q();
  r.lse = p.poisoned_lse();
  if (fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &r.lse.desc, p.varlen_ptr(), &o, &x) != FA_OK) {
    return ::testing::AssertionFailure() << "forward: " << fa_last_error();
  }
  if (!backward) return ::testing::AssertionSuccess();
  r.dq = p.poisoned_like_q();
  r.dk = p.poisoned_like_k();
  r.dv = p.poisoned_like_k();
  r.dsinks = p.poisoned_dsinks();
  if (p.c.sinks) x.dsinks = &r.dsinks.desc;
  if (fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &r.out.desc, &p.dout.desc, &r.lse.desc, &r.dq.desc,
                     &r.dk.desc, &r.dv.desc, p.varlen_ptr(), &o, &x, nullptr, 0) != FA_OK) {
    return ::testing::AssertionFailure() << "backward: " << fa_last_error();
  }
  return ::testing::AssertionSuccess();
}

class CpuBlockSparse : public ::testing::TestWithParam<Case> {};

TEST_P(CpuBlockSparse, ForwardMatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  CpuResults r;
  ASSERT_TRUE(run_cpu(p, false, r));
  expect_forward_matches(p, r.out, r.lse);
}

TEST_P(CpuBlockSparse, BackwardMatchesFloat64Reference) {
  const Problem p = make_problem(GetParam());
  CpuResults r;
  ASSERT_TRUE(run_cpu(p, true, r));
  expect_backward_matches(p, r.dq, r.dk, r.dv, r.dsinks);
}

INSTANTIATE_TEST_SUITE_P(Suite, CpuBlockSparse,
                         ::testing::ValuesIn(block_sparse_suite({FA_F32, FA_F16, FA_BF16}, suite_head_dims())),
                         [](const auto& info) { return info.param.name(); });

// Forward and backward of p with its block mask and of p without one: bitwise equal.
void expect_block_mask_is_dense(Problem p, const fa_options& dense_options) {
  CpuResults sparse, dense;
  ASSERT_TRUE(run_cpu(p, true, sparse));
  p.use_block_mask = false;
  p.options = dense_options;
  ASSERT_TRUE(run_cpu(p, true, dense));
  expect_same_results(sparse, dense);
}

// Every case of the suite at density 1 (and with dropout): the same bits as dense.
TEST(BlockSparse, DensityOneIsDenseBitwise) {
  for (Case c : block_sparse_suite({FA_F32, FA_BF16}, {64})) {
    if (c.block_density != 1.0) continue;
    SCOPED_TRACE(c.name());
    const Problem p = make_problem(c);
    expect_block_mask_is_dense(p, p.options);
    c.dropout_p = 0.25f;
    const Problem dropped = make_problem(c);
    expect_block_mask_is_dense(dropped, dropped.options);
  }
}

// create_block_mask's causal and sliding-window masks, with the same element
// mask in the options: bitwise the dense causal / windowed call (blocks left
// out hold no visible pair, and tiles whose pairs are all listed are the
// dense tiles).
TEST(BlockSparse, FlexCausalAndSlidingWindowMasksAreDenseBitwise) {
  for (auto& [label, p] : flex_causal_window_problems(FA_F32, {64}, 4000)) {
    SCOPED_TRACE(label);
    expect_block_mask_is_dense(p, p.options);
  }
}

// A document mask (causal within each document) over one packed sequence,
// documents on block boundaries: the same attention as the variable-length
// batch of the documents, forward and backward (compared with that batch's
// float64 reference).
TEST(BlockSparse, FlexDocumentMaskIsTheVarlenBatch) {
  const std::vector<int> docs = {64, 96, 32, 128, 16};
  for (fa_dtype dt : {FA_F32, FA_BF16}) {
    Case v = make_case(dt, 0, 0, 64, 4100);
    v.varlen_q = docs;
    v.varlen_k = docs;
    v.causal = true;
    const Problem varlen = make_problem(v);
    Case c = make_case(dt, varlen.cu_seqlens_q.back(), varlen.cu_seqlens_q.back(), 64, 4100);
    c.causal = true;
    Problem packed = make_problem(c);
    for (auto [to, from] : {std::pair{&packed.q, &varlen.q}, {&packed.k, &varlen.k}, {&packed.v, &varlen.v},
                            {&packed.dout, &varlen.dout}}) {
      to->bytes = from->bytes;  // (total, heads, d) rows, same order
      to->rebind();
    }
    std::vector<int> doc_of;
    for (size_t d = 0; d < docs.size(); ++d) doc_of.insert(doc_of.end(), docs[d], static_cast<int>(d));
    set_block_mask(packed, classes_of(packed, 16, 32, [&](int i, int j) { return doc_of[i] == doc_of[j] && j <= i; }));
    CpuResults r;
    ASSERT_TRUE(run_cpu(packed, true, r));
    const Expected e = expected_all(varlen);
    const double atol = default_atol(dt);
    const Comparison co = compare_rows(r.out, e.exact.out, e.naive.out, atol);
    EXPECT_TRUE(co.ok) << co.describe("out");
    for (const auto& [name, cmp] : compare_gradients(r.dq, r.dk, r.dv, e, atol)) EXPECT_TRUE(cmp.ok) << cmp.describe(name);
  }
}

// The reference's lse of every row is the logsumexp over exactly the keys of
// listed blocks the element mask lets through (computed here directly).
TEST(BlockSparse, ReferenceSeesOnlyListedBlocks) {
  Case c = make_case(FA_F32, 29, 37, 16, 4200);
  c.window_left = 20;
  c.block_q = 4;
  c.block_k = 5;
  c.block_density = 0.4;
  c.heads_q = 3;
  c.heads_kv = 1;
  Problem p = make_problem(c);
  ints(p.kv_num_blocks)[1] = 0;  // head 0, query block 1 lists nothing: rows 4..7 see no key
  ints(p.full_kv_num_blocks)[1] = 0;
  const AttentionParams params = p.host_params();
  const reference::ForwardResult r = reference::forward(params, reference::Precision::kFloat64);
  const auto* counts = reinterpret_cast<const int32_t*>(p.kv_num_blocks.bytes.data());
  const auto* full_counts = reinterpret_cast<const int32_t*>(p.full_kv_num_blocks.bytes.data());
  const auto* idx = reinterpret_cast<const int32_t*>(p.kv_indices.bytes.data());
  const auto* full_idx = reinterpret_cast<const int32_t*>(p.full_kv_indices.bytes.data());
  const int qbs = static_cast<int>(p.kv_indices.desc.shape[2]), cap = static_cast<int>(p.kv_indices.desc.shape[3]);
  const int full_cap = static_cast<int>(p.full_kv_indices.desc.shape[3]);
  const auto listed = [&](int h, int qb, int kb) {
    const int row = h * qbs + qb;
    for (int n = 0; n < counts[row]; ++n) if (idx[row * cap + n] == kb) return true;
    for (int n = 0; n < full_counts[row]; ++n) if (full_idx[row * full_cap + n] == kb) return true;
    return false;
  };
  const MaskPolicy mask = mask_for(params, sequence_info(params, 0));
  int empty_rows = 0;
  for (int h = 0; h < c.heads_q; ++h) {
    for (int i = 0; i < c.seqlen_q; ++i) {
      double sum = 0;
      for (int j = 0; j < c.seqlen_k; ++j) {
        if (!mask.visible(i, j) || !listed(h, i / c.block_q, j / c.block_k)) continue;
        double s = 0;
        for (int d = 0; d < c.head_dim; ++d) s += read_row_element(p.q, i, h, d) * read_row_element(p.k, j, 0, d);
        sum += std::exp(s * params.scale);
      }
      const double got = r.lse[static_cast<size_t>(h) * c.seqlen_q + i];
      if (sum == 0) {
        ++empty_rows;
        EXPECT_EQ(got, -std::numeric_limits<double>::infinity()) << "row " << i << " head " << h;
      } else {
        EXPECT_NEAR(got, std::log(sum), 1e-9) << "row " << i << " head " << h;
      }
    }
  }
  EXPECT_GE(empty_rows, c.block_q) << "query block 1 of head 0 sees no key";
}

// NaN keys and values in a key block no query block lists never reach a
// result (docs/semantics.md: masked keys never contribute), while a NaN in a
// listed block reaches exactly the rows that see it; both as the reference says.
TEST(BlockSparse, UnlistedKeysNeverLeakNaN) {
  for (bool causal : {false, true}) {
    Case c = make_case(FA_F32, 113, 203, 32, 4250);
    c.causal = causal;
    c.block_q = 16;
    c.block_k = 32;
    c.block_density = 0.5;
    Problem p = make_problem(c);
    BlockClasses bc(16, 32, 1, c.heads_q, c.seqlen_q, c.seqlen_k);
    for (size_t i = 0; i < bc.cls.size(); ++i) bc.cls[i] = static_cast<uint8_t>(i * 7 % 3);
    for (int h = 0; h < c.heads_q; ++h)
      for (int qb = 0; qb < bc.q_blocks; ++qb) bc.at(0, h, qb, 2) = 0;  // keys 64..95: never listed
    set_block_mask(p, bc);
    for (int h = 0; h < c.heads_kv; ++h) {
      for (int j = 64; j < 96; ++j) {
        write_row_element(p.k, j, h, 3, NAN);
        write_row_element(p.v, j, h, 5, NAN);
      }
      write_row_element(p.v, 100, h, 1, NAN);  // key block 3: listed for some rows
    }
    CpuResults r;
    ASSERT_TRUE(run_cpu(p, true, r));
    const Expected e = expected_all(p);
    const double atol = default_atol(p.c.dtype);
    const Comparison co = compare_rows(r.out, e.exact.out, e.naive.out, atol, true);
    EXPECT_TRUE(co.ok) << co.describe("out");
    expect_gradients_match(p, r.dq, r.dk, r.dv, true);
  }
}

// Pages that fault on any access, holding a copy of t's bytes: t's data moves there.
struct GuardedCopy {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  explicit GuardedCopy(HostTensor& t) : bytes(t.bytes.size()) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return;
    std::memcpy(base, t.bytes.data(), bytes);
    t.desc.data = base;
  }
  bool protect(size_t offset, size_t length, int prot) {
    return base != MAP_FAILED && mprotect(static_cast<char*>(base) + offset, length, prot) == 0;
  }
  ~GuardedCopy() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
};

// Skipped blocks cost no memory traffic: the K and V rows of a key block no
// query block lists sit on pages that fault when touched, and the forward and
// the backward (both passes) run through, with the reference's results. The
// block (16 keys of 256 bytes) shares a 64-key CPU tile with listed blocks, so
// the loads skip rows, not only tiles.
TEST(BlockSparse, UnlistedKeyBlocksAreNeverRead) {
  const long page = sysconf(_SC_PAGESIZE);
  constexpr int kRowBytes = 64 * 4, kBlockKeys = 16;
  if (page != kRowBytes * kBlockKeys) GTEST_SKIP() << "the test lays one key block on a 4 KiB page";
  for (bool causal : {false, true}) {
    Case c = make_case(FA_F32, 50, 128, 64, 4260);
    c.heads_q = 2;
    c.heads_kv = 1;
    c.causal = causal;
    Problem p = make_problem(c);
    BlockClasses bc(16, kBlockKeys, 1, c.heads_q, c.seqlen_q, c.seqlen_k);
    for (size_t i = 0; i < bc.cls.size(); ++i) bc.cls[i] = static_cast<uint8_t>(1 + i % 2);
    for (int h = 0; h < c.heads_q; ++h)
      for (int qb = 0; qb < bc.q_blocks; ++qb) bc.at(0, h, qb, 2) = 0;  // keys 32..47 (page 2)
    set_block_mask(p, bc);
    const Expected e = expected_all(p);
    GuardedCopy k(p.k), v(p.v);
    ASSERT_TRUE(k.protect(2 * page, page, PROT_NONE) && v.protect(2 * page, page, PROT_NONE));
    CpuResults r;
    ASSERT_TRUE(run_cpu(p, true, r));
    ASSERT_TRUE(k.protect(2 * page, page, PROT_READ) && v.protect(2 * page, page, PROT_READ));
    const double atol = default_atol(p.c.dtype);
    const Comparison co = compare_rows(r.out, e.exact.out, e.naive.out, atol);
    EXPECT_TRUE(co.ok) << co.describe("out");
    for (const auto& [name, cmp] : compare_gradients(r.dq, r.dk, r.dv, e, atol)) EXPECT_TRUE(cmp.ok) << cmp.describe(name);
  }
}

// The C++ API carries the mask (Options::with_block_mask, make_block_mask).
TEST(BlockSparse, CppApiCarriesTheMask) {
  Case c = make_case(FA_F32, 50, 70, 32, 4300);
  c.block_q = 16;
  c.block_k = 16;
  c.block_density = 0.5;
  const Problem p = make_problem(c);
  CpuResults expected;
  ASSERT_TRUE(run_cpu(p, false, expected));
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  const fa_block_mask m = make_block_mask(16, 16, p.kv_num_blocks.desc, p.kv_indices.desc,
                                          &p.full_kv_num_blocks.desc, &p.full_kv_indices.desc);
  Options o;
  o.backend = FA_BACKEND_CPU;
  forward(p.q.desc, p.k.desc, p.v.desc, out.desc, &lse.desc, o.with_block_mask(&m));
  expect_same_bytes(out, expected.out, "out");
  expect_same_bytes(lse, expected.lse, "lse");
}

// ---- validation: every error names its argument, before memory is touched ----

struct BadMask {
  const char* what;
  std::function<void(Problem&)> mutate;
  const char* message;  // a substring of fa_last_error()
};

Problem validation_problem() {
  Case c = make_case(FA_F32, 40, 50, 16, 4400);
  c.block_q = 16;  // 3 query blocks
  c.block_k = 16;  // 4 key blocks
  c.block_density = 0.5;
  Problem p = make_problem(c);
  // Row 0 lists key block 1 as partial, nothing as full.
  ints(p.kv_num_blocks)[0] = 1;
  ints(p.kv_indices)[0] = 1;
  ints(p.full_kv_num_blocks)[0] = 0;
  return p;
}

std::vector<BadMask> bad_masks() {
  return {
      {"block_q zero", [](Problem& p) { p.block_mask.block_q = 0; }, "block_q and block_k must be positive"},
      {"block_k negative", [](Problem& p) { p.block_mask.block_k = -4; }, "must be positive"},
      {"reserved", [](Problem& p) { p.block_mask.reserved[2] = 1; }, "block_mask.reserved"},
      {"only full counts", [](Problem& p) { p.full_kv_indices = HostTensor{}; },
       "full_kv_indices"},
      {"counts ndim", [](Problem& p) { p.kv_num_blocks.desc.ndim = 2; }, "kv_num_blocks must have 3 dimensions"},
      {"indices dtype", [](Problem& p) { p.kv_indices.desc.dtype = FA_F32; }, "kv_indices must be int32"},
      {"counts on device", [](Problem& p) { p.kv_num_blocks.desc.device = FA_DEVICE_CUDA; }, "must be host memory"},
      {"negative shape", [](Problem& p) { p.kv_indices.desc.shape[3] = -1; }, "negative or too large shape"},
      {"batch", [](Problem& p) { p.kv_num_blocks.desc.shape[0] = 3; }, "kv_num_blocks has shape (3, 2, 3)"},
      {"heads", [](Problem& p) { p.kv_num_blocks.desc.shape[1] = 4; }, "1 or 2 (heads_q)"},
      {"query blocks", [](Problem& p) { p.kv_num_blocks.desc.shape[2] = 2; }, "3 (query blocks)"},
      {"indices vs counts", [](Problem& p) { p.full_kv_indices.desc.shape[2] = 2; },
       "full_kv_indices has shape (1, 2, 2, 4)"},
      {"full (B, H)", [](Problem& p) {
         p.full_kv_num_blocks.desc.shape[1] = 1;
         p.full_kv_indices.desc.shape[1] = 1;
       }, "its (B, H) must be kv_num_blocks'"},
      {"stride", [](Problem& p) { p.kv_indices.desc.strides[3] = 2; }, "kv_indices must be contiguous in its last dimension"},
      {"zero stride", [](Problem& p) { p.kv_num_blocks.desc.strides[2] = 0; }, "strides must be positive"},
      {"null data", [](Problem& p) { p.kv_indices.desc.data = nullptr; }, "kv_indices has a null data pointer"},
      {"null counts", [](Problem& p) { p.kv_num_blocks = HostTensor{}; }, "kv_num_blocks is a null pointer"},
      {"count negative", [](Problem& p) { ints(p.kv_num_blocks)[0] = -1; }, "kv_num_blocks[0][0][0] = -1"},
      {"count over capacity", [](Problem& p) { ints(p.full_kv_num_blocks)[5] = 5; }, "full_kv_num_blocks[0][1][2] = 5"},
      {"index negative", [](Problem& p) { ints(p.kv_indices)[0] = -1; }, "kv_indices[0][0][0][0] = -1 is not a key block"},
      {"index past k_blocks", [](Problem& p) { ints(p.kv_indices)[0] = 4; }, "must be in [0, 4)"},
      {"duplicate in a list", [](Problem& p) {
         ints(p.kv_num_blocks)[0] = 2;
         ints(p.kv_indices)[1] = 1;
       }, "kv_indices[0][0][0][1] = 1 lists a key block already listed"},
      {"in both lists", [](Problem& p) {
         ints(p.full_kv_num_blocks)[0] = 1;
         ints(p.full_kv_indices)[0] = 1;
       }, "full_kv_indices[0][0][0][0] = 1 lists a key block already listed"},
  };
}

TEST(BlockSparse, EveryBadMaskIsRejected) {
  for (const BadMask& bad : bad_masks()) {
    SCOPED_TRACE(bad.what);
    Problem p = validation_problem();
    bad.mutate(p);
    fa_options o = p.options;
    o.backend = FA_BACKEND_CPU;
    fa_extras x = p.extras();
    if (p.kv_num_blocks.bytes.empty()) p.block_mask.kv_num_blocks = nullptr;
    if (p.full_kv_indices.bytes.empty()) p.block_mask.full_kv_indices = nullptr;
    HostTensor out = p.poisoned_like_q();
    const HostTensor poisoned = out;
    EXPECT_EQ(fa_forward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, nullptr, nullptr, &o, &x),
              FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fa_last_error()).find(bad.message), std::string::npos) << fa_last_error();
    expect_same_bytes(out, poisoned, "out (untouched)");
    HostTensor lse = p.poisoned_lse(), dq = p.poisoned_like_q(), dk = p.poisoned_like_k(), dv = p.poisoned_like_k();
    EXPECT_EQ(fa_backward_ex(&p.q.desc, &p.k.desc, &p.v.desc, &out.desc, &p.dout.desc, &lse.desc, &dq.desc, &dk.desc,
                             &dv.desc, nullptr, &o, &x, nullptr, 0),
              FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fa_last_error()).find(bad.message), std::string::npos) << fa_last_error();
  }
}

TEST(BlockSparse, ValidProblemIsAccepted) {
  const Problem p = validation_problem();
  CpuResults r;
  EXPECT_TRUE(run_cpu(p, true, r));
}

// Entries past a count are never read: garbage there (the harness fills it) is accepted.
TEST(BlockSparse, EntriesPastTheCountAreIgnored) {
  Problem p = validation_problem();
  ints(p.kv_indices)[1] = std::numeric_limits<int32_t>::min();
  ints(p.kv_indices)[2] = std::numeric_limits<int32_t>::max();
  CpuResults r;
  EXPECT_TRUE(run_cpu(p, false, r));
}

// CUDA calls take the same host lists (validated here, then copied to the
// device by the CUDA backend); lists in device memory are refused, named.
TEST(BlockSparse, CudaCallsValidateHostLists) {
  const Problem p = validation_problem();
  AttentionParams params = p.host_params();
  params.block_mask = BlockMaskView{};
  params.device = FA_DEVICE_CUDA;
  (void)p.extras();
  EXPECT_EQ(apply_block_mask(&p.block_mask, &params), FA_OK) << fa_last_error();
  EXPECT_TRUE(params.has_block_mask());
  fa_tensor device_num = *p.block_mask.kv_num_blocks;
  device_num.device = FA_DEVICE_CUDA;
  fa_block_mask m = p.block_mask;
  m.kv_num_blocks = &device_num;
  params.block_mask = BlockMaskView{};
  EXPECT_EQ(apply_block_mask(&m, &params), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("block_mask.kv_num_blocks must be host memory"), std::string::npos)
      << fa_last_error();
  EXPECT_FALSE(params.has_block_mask());
}

}  // namespace
}  // namespace flashattn::testing
