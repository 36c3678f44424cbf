// Bad input gets a status and a message that names the problem: never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/api_call.h"

namespace flashattn::testing {
namespace {

TEST(ApiErrors, ValidCallSucceeds) {
  Call c;
  EXPECT_EQ(c.forward(), FA_OK) << fa_last_error();
  EXPECT_STREQ(fa_last_error(), "");
}

TEST(ApiErrors, NullPointers) {
  Call c;
  expect_error(fa_forward(nullptr, &c.p.k.desc, &c.p.v.desc, &c.out.desc, nullptr, nullptr, &c.o),
               FA_ERROR_INVALID_ARGUMENT, "q is a null pointer");
  expect_error(fa_forward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, nullptr, nullptr, nullptr),
               FA_ERROR_INVALID_ARGUMENT, "options");
  c.p.v.desc.data = nullptr;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "v has a null data pointer");
  Call d;
  expect_error(fa_backward(&d.p.q.desc, &d.p.k.desc, &d.p.v.desc, &d.out.desc, &d.p.dout.desc,
                           nullptr, &d.out.desc, &d.p.k.desc, &d.p.v.desc, nullptr, &d.o, nullptr, 0),
               FA_ERROR_INVALID_ARGUMENT, "lse is a null pointer");
}

TEST(ApiErrors, UnsupportedDtype) {
  Call c;
  c.p.q.desc.dtype = static_cast<fa_dtype>(42);
  expect_error(c.forward(), FA_ERROR_UNSUPPORTED, "dtype");
}

TEST(ApiErrors, UnsupportedHeadDim) {
  Case k = Call::base();
  k.head_dim = 12;
  Call c(k);
  expect_error(c.forward(), FA_ERROR_UNSUPPORTED, "head_dim 12");
  k.head_dim = 264;
  Call d(k);
  expect_error(d.forward(), FA_ERROR_UNSUPPORTED, "head_dim 264");
}

TEST(ApiErrors, MixedDtypes) {
  Call c;
  c.p.k.desc.dtype = FA_F16;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "mixed dtypes");
  Call d;
  d.out.desc.dtype = FA_BF16;
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "mixed dtypes");
  Call e;
  e.lse.desc.dtype = FA_F16;
  expect_error(e.forward(), FA_ERROR_INVALID_ARGUMENT, "lse must be f32");
}

TEST(ApiErrors, ShapeMismatches) {
  Call c;
  c.p.v.desc.shape[1] = 6;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "does not match");
  Call d;
  d.out.desc.shape[2] = 2;
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "out shape");
  Call e;
  e.lse.desc.shape[2] = 4;
  expect_error(e.forward(), FA_ERROR_INVALID_ARGUMENT, "lse shape");
  Call f;
  f.p.k.desc.shape[0] = 2;
  f.p.v.desc.shape[0] = 2;
  expect_error(f.forward(), FA_ERROR_INVALID_ARGUMENT, "batch of k");
  Call g;
  g.p.q.desc.ndim = 3;
  expect_error(g.forward(), FA_ERROR_INVALID_ARGUMENT, "q must have 4 dimensions");
}

TEST(ApiErrors, HeadsNotAMultiple) {
  Case k = Call::base();
  k.heads_q = 3;
  k.heads_kv = 2;
  Call c(k);
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "multiple of heads_kv");
}

TEST(ApiErrors, LastDimensionNotContiguous) {
  Call c;
  c.p.q.desc.strides[3] = 2;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "contiguous in its last dimension");
}

TEST(ApiErrors, CuSeqlensChecked) {
  Case k = Call::base();
  k.varlen_q = {3, 4};
  k.varlen_k = {5, 2};
  {
    Call c(k);
    EXPECT_EQ(c.forward(), FA_OK) << fa_last_error();
    c.p.cu_seqlens_q = {0, 2, 1};  // decreasing
    c.p.varlen.cu_seqlens_q = c.p.cu_seqlens_q.data();
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "non-decreasing");
  }
  {
    Call c(k);
    c.p.cu_seqlens_k = {0, 5, 6};  // ends at 6, k has 7 rows
    c.p.varlen.cu_seqlens_k = c.p.cu_seqlens_k.data();
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "does not match total tokens");
  }
  {
    Call c(k);
    c.p.varlen.max_seqlen_q = 2;
    expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "max_seqlen");
  }
}

TEST(ApiErrors, WindowBelowMinusOne) {
  Call c;
  c.o.window_left = -2;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "window sizes must be >= -1");
}

TEST(ApiErrors, BadScaleAndSoftcap) {
  Call c;
  c.o.softcap = -1.0f;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "softcap");
  Call d;
  d.o.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "softmax_scale");
}

TEST(ApiErrors, IndexArithmeticOverflow) {
  Call c;
  c.p.q.desc.strides[0] = int64_t{1} << 62;  // (batch - 1) * stride = 3 * 2^62 > INT64_MAX
  c.p.q.desc.shape[0] = 4;
  c.p.k.desc.shape[0] = 4;
  c.p.v.desc.shape[0] = 4;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "overflow");
  Call d;
  d.p.q.desc.shape[1] = int64_t{1} << 40;
  d.p.q.desc.shape[0] = int64_t{1} << 30;
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "64-bit");
}

TEST(ApiErrors, WrongDeviceForBackend) {
  Call c;
  c.p.q.desc.device = FA_DEVICE_CUDA;
  c.p.k.desc.device = FA_DEVICE_CUDA;
  c.p.v.desc.device = FA_DEVICE_CUDA;
  c.out.desc.device = FA_DEVICE_CUDA;
  c.lse.desc.device = FA_DEVICE_CUDA;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "CPU backend needs host tensors");
  Call d;
  d.p.k.desc.device = FA_DEVICE_CUDA;
  expect_error(d.forward(), FA_ERROR_INVALID_ARGUMENT, "is on cuda:0");
}

TEST(ApiErrors, BackendNotPresent) {
  if (fa_backend_available(FA_BACKEND_CUDA)) GTEST_SKIP() << "a GPU is present here";
  Call c;
  c.o.backend = FA_BACKEND_CUDA;
  expect_error(c.forward(), FA_ERROR_BACKEND_UNAVAILABLE, "CUDA backend unavailable");
  EXPECT_STRNE(fa_backend_unavailable_reason(FA_BACKEND_CUDA), "");
}

TEST(ApiErrors, WorkspaceTooSmall) {
  Call c;
  ASSERT_EQ(c.forward(), FA_OK);
  HostTensor dq = c.p.poisoned_like_q(), dk = c.p.poisoned_like_k(), dv = c.p.poisoned_like_k();
  char tiny[4];
  expect_error(fa_backward(&c.p.q.desc, &c.p.k.desc, &c.p.v.desc, &c.out.desc, &c.p.dout.desc,
                           &c.lse.desc, &dq.desc, &dk.desc, &dv.desc, nullptr, &c.o, tiny, sizeof tiny),
               FA_ERROR_INVALID_ARGUMENT, "workspace");
}

TEST(ApiErrors, AbsurdThreadCountIsCapped) {
  Call c;
  c.o.num_threads = 1 << 30;  // capped to a few threads per core, not a billion
  EXPECT_EQ(c.forward(), FA_OK) << fa_last_error();
  c.o.num_threads = -1;
  expect_error(c.forward(), FA_ERROR_INVALID_ARGUMENT, "num_threads");
}

TEST(ApiErrors, EmptyInputsAreFine) {
  Case k = Call::base();
  k.seqlen_k = 0;  // every row sees nothing: out 0, lse -inf
  Call c(k);
  ASSERT_EQ(c.forward(), FA_OK) << fa_last_error();
  for (int64_t row = 0; row < 5; ++row) EXPECT_EQ(read_row_element(c.out, row, 0, 0), 0.0);
  EXPECT_TRUE(std::isinf(reinterpret_cast<float*>(c.lse.bytes.data())[0]));
}

}  // namespace
}  // namespace flashattn::testing

// Results files name the commit a timed library came from; it must be a git
// hash (maybe "+dirty") or "unknown", never empty.
TEST(BuildInfo, CommitIsNamed) {
  const std::string commit = fa_build_commit();
  ASSERT_FALSE(commit.empty());
  if (commit != "unknown") {
    const std::string hash = commit.substr(0, commit.find('+'));
    EXPECT_GE(hash.size(), 7u);
    EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos) << commit;
    EXPECT_TRUE(hash.size() == commit.size() || commit.substr(hash.size()) == "+dirty") << commit;
  }
  EXPECT_NE(fa_build_cuda_architectures(), nullptr);
}
