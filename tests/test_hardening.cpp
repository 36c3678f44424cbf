// The boundary holds against hostile and careless input (issue 27): 64-bit
// varlen metadata, size limits, window normalisation, byte extents, output
// overlap, empty tensors, enum codes, reserved fields, the workspace, and
// thread-start failures. Each test would have caught its defect class.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/api_call.h"
#include "core/overlap.h"
#include "core/parallel.h"
#include "core/validate.h"
#include "flashattn/flashattn.hpp"

// tests/c_abi_calls.c: out-of-range enum codes passed as a C caller does.
extern "C" {
const char* c_abi_dtype_name(int code);
const char* c_abi_status_string(int code);
int c_abi_backend_available(int code);
const char* c_abi_backend_unavailable_reason(int code);
}

namespace flashattn::testing {
namespace {

Case small_case() { return Call::base(); }

bool all_nan(const HostTensor& t) {
  const int64_t n = static_cast<int64_t>(t.bytes.size() / dtype_size(t.desc.dtype));
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(load_as_float(t.bytes.data(), i, t.desc.dtype))) return false;
  }
  return true;
}

// 1. cu_seqlens whose int32 differences overflow, or that leave the tensors.
TEST(Hardening, CuSeqlensValidatedIn64Bit) {
  Case k = small_case();
  k.varlen_q = {3, 4};
  k.varlen_k = {5, 2};
  const std::vector<std::vector<int32_t>> bad = {
      {0, INT_MIN, 7},          // negative length; the next difference overflows int32
      {0, INT_MAX, 7},          // a length beyond every tensor
      {0, 2000000000, -294967296 + 7},  // wrapped sum
      {0, 3, 8},                // ends past the 7 rows of q
      {0, 8, 7},                // decreasing, offset past the tensor
  };
  for (const auto& cu : bad) {
    Call c(k);
    c.p.varlen.max_seqlen_q = FA_MAX_SEQLEN;
    c.p.cu_seqlens_q = cu;
    c.p.varlen.cu_seqlens_q = c.p.cu_seqlens_q.data();
    EXPECT_EQ(c.forward(), FA_ERROR_INVALID_ARGUMENT) << cu[1] << ", " << cu[2];
    EXPECT_NE(std::string(fa_last_error()).find("cu_seqlens_q"), std::string::npos) << fa_last_error();
    EXPECT_TRUE(all_nan(c.out)) << "nothing may be written on error";
  }
}

// 2. max_seqlen and tile counts beyond the documented limits: an error, never
// FA_OK with nothing computed.
TEST(Hardening, SizeLimits) {
  Case k = small_case();
  k.varlen_q = {3, 4};
  k.varlen_k = {5, 2};
  {
    Call c(k);
    c.p.varlen.max_seqlen_q = INT_MAX;
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "FA_MAX_SEQLEN");
  }
  {
    Call c(k);
    c.p.varlen.max_seqlen_k = FA_MAX_SEQLEN + 1;
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "FA_MAX_SEQLEN");
  }
  {
    // 2^20 sequences x 4 heads x 2^16 tiles: validated without touching memory.
    Call c;
    for (fa_tensor* t : {&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc}) {
      t->shape[0] = int64_t{1} << 20;
      t->shape[1] = int64_t{1} << 20;
      t->strides[1] = t->shape[2] * t->shape[3];
      t->strides[0] = t->strides[1] << 20;
    }
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "INT32_MAX tiles");
  }
  {
    Call c;
    c.p.q.desc.shape[2] = int64_t{1} << 32;  // heads beyond int32
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "heads");
  }
}

// 3. Windows near INT32_MAX mean "unbounded": the same results as -1, not blank rows.
TEST(Hardening, HugeWindowsAreUnbounded) {
  for (auto [left, right] : std::vector<std::pair<int, int>>{
           {INT_MAX, INT_MAX}, {INT_MAX - 1, 0}, {7, INT_MAX}, {INT_MAX, -1}}) {
    Case k = small_case();
    k.seqlen_q = 70;
    k.seqlen_k = 90;
    Call big(k), bounded(k);
    big.o.window_left = left;
    big.o.window_right = right;
    bounded.o.window_left = left >= k.seqlen_k ? -1 : left;
    bounded.o.window_right = right >= k.seqlen_q ? -1 : right;
    ASSERT_EQ(big.forward(), FA_OK) << fa_last_error();
    ASSERT_EQ(bounded.forward(), FA_OK) << fa_last_error();
    EXPECT_EQ(big.out.bytes, bounded.out.bytes) << left << ", " << right;
    EXPECT_EQ(big.lse.bytes, bounded.lse.bytes) << left << ", " << right;
    AttentionParams params;
    ASSERT_EQ(make_forward_params({&big.p.q.desc, &big.p.k.desc, &big.p.v.desc, &big.out.desc,
                                   &big.lse.desc, nullptr, &big.o},
                                  &params),
              FA_OK);
    EXPECT_LT(params.window_left, k.seqlen_k);
    EXPECT_LT(params.window_right, k.seqlen_q);
  }
}

// 7. Byte extents: a stride that fits in elements but wraps in bytes.
TEST(Hardening, StrideBoundCheckedInBytes) {
  Call c;
  c.p.q.desc.shape[0] = 2;
  c.p.k.desc.shape[0] = 2;
  c.p.v.desc.shape[0] = 2;
  c.out.desc.shape[0] = 2;
  c.p.q.desc.strides[0] = int64_t{1} << 61;  // 2^61 elements fit int64, 2^63 bytes do not
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "byte offsets");
  Call d;
  d.p.k.desc.data = reinterpret_cast<void*>(UINTPTR_MAX - 64);  // the end wraps the address space
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "wrap");
}

// 7. Outputs that alias inputs or each other are rejected, naming both.
TEST(Hardening, OverlappingOutputsRejected) {
  Case k = small_case();
  k.seqlen_k = k.seqlen_q;
  k.heads_kv = k.heads_q;  // out can take k's memory exactly
  {
    Call c(k);
    c.out.desc.data = c.p.k.desc.data;
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "out overlaps k");
  }
  {
    Call c(k);
    c.out.desc.data = c.p.q.desc.data;  // in place
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "out overlaps q");
  }
  {
    Call c(k);
    c.lse.desc.data = static_cast<uint8_t*>(c.out.desc.data) + 64;  // lse inside out
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "overlaps");
  }
  {
    Call c(k);
    c.out.desc.strides[1] = 0;  // rows written over each other
    c.out.desc.strides[0] = 0;
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "stride");
  }
  {
    Call c(k);
    ASSERT_EQ(c.forward(), FA_OK);
    HostTensor dq = c.p.poisoned_like_q(), dk = c.p.poisoned_like_k(), dv = c.p.poisoned_like_k();
    dv.desc.data = dk.desc.data;
    expect_error(fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc,
                             &c.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, nullptr, 0),
                 FA_ERROR_INVALID_ARGUMENT, "dk overlaps dv");
    expect_error(fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc,
                             &c.lse.desc, &c.out.desc, &dk.desc, &c.p.v.desc, nullptr, &c.o, nullptr, 0),
                 FA_ERROR_INVALID_ARGUMENT, "dq overlaps out");
  }
}

// 7. Packed layouts (q, k, v and dq, dk, dv as interleaved views of one
// buffer) share no element and are accepted, with the same results.
TEST(Hardening, PackedInterleavedViewsAccepted) {
  Case k = small_case();
  k.heads_kv = k.heads_q;
  k.seqlen_k = k.seqlen_q;
  k.batch = 2;
  Call c(k);
  ASSERT_EQ(c.forward(), FA_OK) << fa_last_error();
  HostTensor dq = c.p.poisoned_like_q(), dk = c.p.poisoned_like_k(), dv = c.p.poisoned_like_k();
  ASSERT_EQ(fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc,
                        &c.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, nullptr, 0),
            FA_OK)
      << fa_last_error();
  // (batch, seqlen, 3, heads, dim) packed gradients.
  const int64_t b = k.batch, s = k.seqlen_q, h = k.heads_q, d = k.head_dim;
  std::vector<float> packed(static_cast<size_t>(b * s * 3 * h * d), std::nanf(""));
  fa_tensor views[3];
  for (int i = 0; i < 3; ++i) {
    views[i] = dq.desc;
    views[i].data = packed.data() + i * h * d;
    const int64_t strides[] = {s * 3 * h * d, 3 * h * d, d, 1};
    std::memcpy(views[i].strides, strides, sizeof strides);
  }
  ASSERT_EQ(fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc,
                        &c.lse.desc, &views[0], &views[1], &views[2], nullptr, &c.o, nullptr, 0),
            FA_OK)
      << fa_last_error();
  for (int64_t row = 0; row < b * s; ++row)
    for (int64_t head = 0; head < h; ++head)
      for (int64_t col = 0; col < d; ++col) {
        const float* at = packed.data() + row * 3 * h * d + head * d + col;
        ASSERT_EQ(at[0], read_row_element(dq, row, static_cast<int>(head), static_cast<int>(col)));
        ASSERT_EQ(at[h * d], read_row_element(dk, row, static_cast<int>(head), static_cast<int>(col)));
        ASSERT_EQ(at[2 * h * d], read_row_element(dv, row, static_cast<int>(head), static_cast<int>(col)));
      }
}

TEST(Hardening, OverlapModel) {
  float buffer[2 * 3 * 4 * 8];
  fa_tensor a{};
  a.data = buffer;
  a.dtype = FA_F32;
  a.ndim = 4;
  const int64_t shape[] = {2, 1, 4, 8}, strides[] = {3 * 4 * 8, 3 * 4 * 8, 8, 1};
  std::memcpy(a.shape, shape, sizeof shape);
  std::memcpy(a.strides, strides, sizeof strides);
  fa_tensor b = a;
  EXPECT_TRUE(tensors_may_overlap(a, b));  // the same tensor
  b.data = buffer + 32;                    // the next packed slot
  EXPECT_FALSE(tensors_may_overlap(a, b));
  b.data = buffer + 31;  // one element back: its first row ends in a's slot
  EXPECT_TRUE(tensors_may_overlap(a, b));
  b.data = buffer + 8;  // a's second head
  EXPECT_TRUE(tensors_may_overlap(a, b));
  b.shape[2] = 0;  // empty: touches nothing
  EXPECT_FALSE(tensors_may_overlap(a, b));
}

// 8. Empty tensors with natural strides: zero batch, zero-length sequences,
// forward and backward, through the C++ make_tensor.
TEST(Hardening, EmptyTensorsWithNaturalStrides) {
  for (auto [batch, sq, sk] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 5, 7}, {2, 0, 7}, {2, 5, 0}, {3, 0, 0}}) {
    std::vector<float> q(static_cast<size_t>(batch * sq * 2 * 8) + 1, 1.0f),
        k(static_cast<size_t>(batch * sk * 2 * 8) + 1, 1.0f), v = k, out = q, dout = q, dq = q,
        dk = k, dv = k, lse(static_cast<size_t>(batch * 2 * sq) + 1);
    auto t = [](std::vector<float>& x, std::initializer_list<int64_t> shape) {
      return make_tensor(x.data(), FA_F32, shape);
    };
    fa_tensor tq = t(q, {batch, sq, 2, 8}), tk = t(k, {batch, sk, 2, 8}), tv = t(v, {batch, sk, 2, 8});
    fa_tensor to = t(out, {batch, sq, 2, 8}), tl = t(lse, {batch, 2, sq});
    fa_tensor tdo = t(dout, {batch, sq, 2, 8}), tdq = t(dq, {batch, sq, 2, 8}),
              tdk = t(dk, {batch, sk, 2, 8}), tdv = t(dv, {batch, sk, 2, 8});
    const Options o = Options().with_backend(FA_BACKEND_CPU);
    EXPECT_NO_THROW(forward(tq, tk, tv, to, &tl, o)) << batch << " " << sq << " " << sk;
    EXPECT_NO_THROW(backward(tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, o)) << batch << " " << sq << " " << sk;
    if (batch > 0 && sq > 0) EXPECT_EQ(out[0], 0.0f);  // no key: 0
    if (batch > 0 && sk > 0) EXPECT_EQ(dk[0], 0.0f);   // no query: zero gradient
  }
}

// 9. Enum fields are read as integers and range-checked (UBSan checks the loads).
TEST(Hardening, EnumCodesRangeChecked) {
  Call c;
  fa_tensor bad = c.p.q.desc;
  int32_t code = 7;
  std::memcpy(&bad.device, &code, sizeof code);
  expect_error(fa_forward(&bad, &c.p.k.desc, &c.p.v.desc, &c.out.desc, nullptr, nullptr, &c.o),
               FA_ERROR_INVALID_ARGUMENT, "device type code 7");
  code = -3;
  bad = c.p.q.desc;
  std::memcpy(&bad.dtype, &code, sizeof code);
  expect_error(fa_forward(&bad, &c.p.k.desc, &c.p.v.desc, &c.out.desc, nullptr, nullptr, &c.o),
               FA_ERROR_UNSUPPORTED, "dtype code -3");
  fa_options o = c.o;
  code = 99;
  std::memcpy(&o.backend, &code, sizeof code);
  expect_error(fa_forward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, nullptr, nullptr, &o),
               FA_ERROR_INVALID_ARGUMENT, "backend code 99");
  EXPECT_STREQ(c_abi_dtype_name(1234), "unknown");
  EXPECT_STREQ(c_abi_status_string(-7), "unknown status");
  EXPECT_EQ(c_abi_backend_available(1234), 0);
  EXPECT_STREQ(c_abi_backend_unavailable_reason(99), "unknown backend");
}

// 9. reserved option fields must be zero.
TEST(Hardening, ReservedOptionsMustBeZero) {
  Call c;
  c.o.reserved[3] = 1;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "reserved[3]");
}

// 9. The backward workspace: aligned, and overlapping no tensor.
TEST(Hardening, WorkspaceAlignmentAndOverlap) {
  Call c;
  ASSERT_EQ(c.forward(), FA_OK);
  size_t bytes = 0;
  ASSERT_EQ(fa_backward_workspace_size(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, nullptr, &c.o, &bytes),
            FA_OK);
  std::vector<uint8_t> buffer(bytes + 2 * FA_WORKSPACE_ALIGNMENT);
  uint8_t* aligned = buffer.data() + (FA_WORKSPACE_ALIGNMENT -
                                      reinterpret_cast<uintptr_t>(buffer.data()) % FA_WORKSPACE_ALIGNMENT);
  HostTensor dq = c.p.poisoned_like_q(), dk = c.p.poisoned_like_k(), dv = c.p.poisoned_like_k();
  auto run = [&](void* ws, size_t n) {
    return fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc, &c.lse.desc,
                       &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, ws, n);
  };
  EXPECT_EQ(run(aligned, bytes), FA_OK) << fa_last_error();
  expect_error(run(aligned + 4, bytes), FA_ERROR_INVALID_ARGUMENT, "aligned");
  expect_error(run(c.p.q.desc.data, bytes), FA_ERROR_INVALID_ARGUMENT, "workspace overlaps q");
}

// 6. A worker thread that cannot start is no abort: the others do every item.
struct FailingStarter {
  int allowed;
  mutable std::atomic<int> started{0};
  template <typename Fn>
  std::thread operator()(Fn&& fn, int index) const {
    if (started.fetch_add(1) >= allowed) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    return std::thread(std::forward<Fn>(fn), index);
  }
};

TEST(Hardening, ThreadStartFailureDegrades) {
  for (int allowed : {0, 1, 2}) {
    std::vector<std::atomic<int>> done(1000);
    const FailingStarter starter{allowed};
    const int threads = parallel_for(
        static_cast<int64_t>(done.size()), 8, [&](int64_t i, int) { done[i].fetch_add(1); }, starter);
    EXPECT_LE(threads, allowed + 1);
    for (const auto& d : done) ASSERT_EQ(d.load(), 1);
  }
}

}  // namespace
}  // namespace flashattn::testing
