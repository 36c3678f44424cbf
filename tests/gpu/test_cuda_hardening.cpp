// The CUDA backend at the boundary (issue 27): device cu_seqlens validated in
// 64-bit before any kernel runs, size limits, huge windows, empty tensors and
// overlapping outputs. Each call must either fail cleanly (a status, a
// message, no device error) or complete and match the reference. Meant to be
// run under compute-sanitizer memcheck too (docs/hardening.md).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "common/harness.h"
#include "device.h"
#include "forward_check.h"

namespace flashattn::testing {
namespace {

Case varlen_case() {
  Case c;
  c.dtype = FA_BF16;
  c.head_dim = 64;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.varlen_q = {7, 0, 113, 64};
  c.varlen_k = {9, 5, 203, 1};
  return c;
}

struct DeviceCall {
  Problem p;
  DeviceProblem d;
  DeviceTensor out, lse;
  fa_options o;
  explicit DeviceCall(const Case& c)
      : p(make_problem(c)), d(p), out(DeviceTensor::upload(p.poisoned_like_q())),
        lse(DeviceTensor::upload(p.poisoned_lse())), o(d.options()) {}
  fa_status forward(const fa_varlen* varlen) {
    return fa_forward(&d.q.desc, &d.k.desc, &d.v.desc, &out.desc, &lse.desc, varlen, &o);
  }
};

// A rejected call: a status, a message naming `words`, and a healthy device.
void expect_rejected(fa_status s, const std::string& words) {
  EXPECT_NE(s, FA_OK);
  EXPECT_NE(std::string(fa_last_error()).find(words), std::string::npos) << fa_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaHardening, DeviceCuSeqlensValidatedIn64Bit) {
  FA_REQUIRE_GPU();
  for (const std::vector<int32_t>& cu : std::vector<std::vector<int32_t>>{
           {0, 9, INT_MIN, 217, 218}, {0, 9, INT_MAX, 217, 218}, {0, 9, 14, 217, 219}}) {
    DeviceCall c(varlen_case());
    c.d.varlen.max_seqlen_k = FA_MAX_SEQLEN;
    ASSERT_EQ(cudaMemcpy(c.d.cu_k.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    expect_rejected(c.forward(c.d.varlen_ptr()), "cu_seqlens_k");
  }
}

TEST(CudaHardening, MaxSeqlenBeyondTheLimitRejected) {
  FA_REQUIRE_GPU();
  DeviceCall c(varlen_case());
  c.d.varlen.max_seqlen_q = INT_MAX;
  expect_rejected(c.forward(c.d.varlen_ptr()), "FA_MAX_SEQLEN");
}

// A large but valid max_seqlen over short sequences: many empty tiles, same results.
TEST(CudaHardening, LargeMaxSeqlenOverShortSequences) {
  FA_REQUIRE_GPU();
  DeviceCall c(varlen_case());
  c.d.varlen.max_seqlen_q = 1 << 16;
  c.d.varlen.max_seqlen_k = 1 << 16;
  ASSERT_TRUE(call_completed(c.forward(c.d.varlen_ptr())));
  expect_forward_matches_reference(c.p, {c.out.download(c.p.q), c.lse.download(c.p.poisoned_lse())});
}

TEST(CudaHardening, HugeWindowsEqualUnbounded) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_F16;
  k.head_dim = 64;
  k.seqlen_q = 130;
  k.seqlen_k = 257;
  DeviceCall huge(k), plain(k);
  huge.o.window_left = INT_MAX;
  huge.o.window_right = INT_MAX - 1;
  ASSERT_TRUE(call_completed(huge.forward(nullptr)));
  ASSERT_TRUE(call_completed(plain.forward(nullptr)));
  EXPECT_EQ(huge.out.download(huge.p.q).bytes, plain.out.download(plain.p.q).bytes);
}

TEST(CudaHardening, EmptyBatchForwardAndBackward) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_BF16;
  k.head_dim = 64;
  k.batch = 0;
  k.seqlen_q = 17;
  k.seqlen_k = 33;
  DeviceCall c(k);
  ASSERT_TRUE(call_completed(c.forward(nullptr)));
  DeviceTensor dq = DeviceTensor::upload(c.p.poisoned_like_q()), dk = DeviceTensor::upload(c.p.poisoned_like_k()),
               dv = DeviceTensor::upload(c.p.poisoned_like_k());
  EXPECT_TRUE(call_completed(fa_backward(&c.d.q.desc, &c.d.k.desc, &c.d.v.desc, &c.out.desc,
                                         &c.d.dout.desc, &c.lse.desc, &dq.desc, &dk.desc, &dv.desc,
                                         nullptr, &c.o, nullptr, 0)));
}

// An empty tensor is never read or written, so its strides may be anything,
// also what the CUDA kernels refuse for a non-empty one (multiples of 8
// elements): no query rows here, and q, out, dout, dq carry row strides of 3.
// The keys, seen by no row, get zero gradients.
TEST(CudaHardening, EmptyTensorsAcceptAnyStrides) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_BF16;
  k.head_dim = 64;
  k.batch = 2;
  k.seqlen_q = 0;
  k.seqlen_k = 33;
  DeviceCall c(k);
  DeviceTensor dq = DeviceTensor::upload(c.p.poisoned_like_q()), dk = DeviceTensor::upload(c.p.poisoned_like_k()),
               dv = DeviceTensor::upload(c.p.poisoned_like_k());
  constexpr int64_t kOddStride = 3;
  for (fa_tensor* t : {&c.d.q.desc, &c.out.desc, &c.d.dout.desc, &dq.desc}) t->strides[1] = kOddStride;
  ASSERT_TRUE(call_completed(c.forward(nullptr)));
  ASSERT_TRUE(call_completed(fa_backward(&c.d.q.desc, &c.d.k.desc, &c.d.v.desc, &c.out.desc, &c.d.dout.desc,
                                         &c.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, nullptr, 0)));
  for (const HostTensor& g : {dk.download(c.p.k), dv.download(c.p.k)}) {
    const auto* bits = reinterpret_cast<const uint16_t*>(g.bytes.data());
    for (size_t i = 0; i < g.bytes.size() / sizeof(uint16_t); ++i) {
      ASSERT_EQ(bits[i] & 0x7fff, 0) << "element " << i << " is not +-0";  // bf16: sign bit aside
    }
  }
}

// The backward's grid holds at most 65535 sequences: more is a clear refusal
// before anything is written, not a failed launch after the pre-pass.
TEST(CudaHardening, BackwardBeyondGridLimitRefused) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_BF16;
  k.head_dim = 64;
  k.batch = 65536;
  k.seqlen_q = 1;
  k.seqlen_k = 2;
  DeviceCall c(k);
  ASSERT_TRUE(call_completed(c.forward(nullptr)));
  const HostTensor poison = c.p.poisoned_like_q();
  DeviceTensor dq = DeviceTensor::upload(poison), dk = DeviceTensor::upload(c.p.poisoned_like_k()),
               dv = DeviceTensor::upload(c.p.poisoned_like_k());
  expect_rejected(fa_backward(&c.d.q.desc, &c.d.k.desc, &c.d.v.desc, &c.out.desc, &c.d.dout.desc, &c.lse.desc,
                              &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, nullptr, 0),
                  "65535 sequences");
  EXPECT_EQ(dq.download(c.p.q).bytes, poison.bytes);
}

// The logsumexp needs only float alignment (it is read and written one float
// at a time; ring attention writes row slices of it): a view that starts one
// float into its buffer is accepted and holds the right values.
TEST(CudaHardening, LseViewsNeedOnlyFloatAlignment) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_BF16;
  k.head_dim = 64;
  k.seqlen_q = 41;
  k.seqlen_k = 57;
  DeviceCall c(k);
  const size_t bytes = c.p.poisoned_lse().bytes.size();
  DeviceMemory shifted = device_alloc(bytes + sizeof(float));
  fa_tensor view = c.lse.desc;
  view.data = static_cast<char*>(shifted.get()) + sizeof(float);
  ASSERT_EQ(cudaMemcpy(view.data, c.lse.desc.data, bytes, cudaMemcpyDeviceToDevice), cudaSuccess);  // poisoned
  ASSERT_TRUE(call_completed(fa_forward(&c.d.q.desc, &c.d.k.desc, &c.d.v.desc, &c.out.desc, &view, nullptr, &c.o)));
  ASSERT_EQ(cudaMemcpy(c.lse.desc.data, view.data, bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  expect_forward_matches_reference(c.p, {c.out.download(c.p.q), c.lse.download(c.p.poisoned_lse())});
}

TEST(CudaHardening, OverlappingOutputsRejected) {
  FA_REQUIRE_GPU();
  Case k;
  k.dtype = FA_BF16;
  k.head_dim = 64;
  k.seqlen_q = k.seqlen_k = 65;
  DeviceCall c(k);
  c.out.desc.data = c.d.v.desc.data;
  expect_rejected(c.forward(nullptr), "out overlaps v");
}

}  // namespace
}  // namespace flashattn::testing
