// The extras of a Problem on the device and one CUDA forward / backward with
// them (ALiBi, sinks, dropout, block masks), shared by the GPU variant suites.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

#include "common/harness.h"
#include "common/suites.h"
#include "device.h"

namespace flashattn::testing {

// The problem's extras on the device (alibi slopes, sinks, a poisoned dsinks).
struct DeviceExtras {
  DeviceTensor alibi, sinks, dsinks;
  HostTensor dsinks_host;
  explicit DeviceExtras(const Problem& p) : dsinks_host(p.poisoned_dsinks()) {
    if (p.c.alibi != Case::Alibi::kOff) alibi = DeviceTensor::upload(p.alibi_slopes);
    if (p.c.sinks) {
      sinks = DeviceTensor::upload(p.sinks);
      dsinks = DeviceTensor::upload(dsinks_host);
    }
  }
  fa_extras forward(const Problem& p) const {
    fa_extras e = fa_default_extras();
    if (p.c.alibi != Case::Alibi::kOff) e.alibi_slopes = &alibi.desc;
    if (p.c.sinks) e.sinks = &sinks.desc;
    // Dropout takes no tensor: p, seed and offset as the host problem's.
    const fa_extras host = p.extras();
    e.block_mask = host.block_mask;  // host lists, on every backend
    e.dropout_p = host.dropout_p;
    e.dropout_seed = host.dropout_seed;
    e.dropout_offset = host.dropout_offset;
    return e;
  }
  fa_extras backward(const Problem& p) {
    fa_extras e = forward(p);
    if (p.c.sinks) e.dsinks = &dsinks.desc;
    return e;
  }
};

struct VariantRun {
  HostTensor out, lse, dq, dk, dv, dsinks;
};

// One forward (and backward) of p on CUDA from poisoned outputs; `prepare`
// may change the device inputs first.
inline ::testing::AssertionResult run_cuda(const Problem& p, bool backward, VariantRun& r,
                                           const std::function<void(DeviceProblem&)>& prepare = {}) {
  DeviceProblem d(p);
  if (prepare) prepare(d);
  DeviceExtras x(p);
  HostTensor out = p.poisoned_like_q(), lse = p.poisoned_lse();
  DeviceTensor dout_ = DeviceTensor::upload(out), dlse = DeviceTensor::upload(lse);
  const fa_options o = d.options();
  const fa_extras fx = x.forward(p);
  if (auto done = call_completed(fa_forward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &dlse.desc,
                                               d.varlen_ptr(), &o, &fx));
      !done)
    return done;
  r.out = dout_.download(out);
  r.lse = dlse.download(lse);
  if (!backward) return ::testing::AssertionSuccess();
  HostTensor gq = p.poisoned_like_q(), gk = p.poisoned_like_k(), gv = p.poisoned_like_k();
  DeviceTensor dq = DeviceTensor::upload(gq), dk = DeviceTensor::upload(gk), dv = DeviceTensor::upload(gv);
  const fa_extras bx = x.backward(p);
  if (auto done = call_completed(fa_backward_ex(&d.q.desc, &d.k.desc, &d.v.desc, &dout_.desc, &d.dout.desc,
                                                &dlse.desc, &dq.desc, &dk.desc, &dv.desc, d.varlen_ptr(),
                                                &o, &bx, nullptr, 0));
      !done)
    return done;
  r.dq = dq.download(gq);
  r.dk = dk.download(gk);
  r.dv = dv.download(gv);
  if (p.c.sinks) r.dsinks = x.dsinks.download(x.dsinks_host);
  return ::testing::AssertionSuccess();
}

// The dropout mask tests' case: two sequences, GQA 4 / 2, 203 rows against
// head_dim - 25 keys (unit_vector_values needs seqlen_k <= head_dim), an
// offset past 2^32 (its high word enters the Philox key).
inline Case dropout_mask_case(fa_dtype dtype, int head_dim, float drop, uint64_t seed) {
  Case c = make_case(dtype, 203, head_dim - 25, head_dim, seed);
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dropout_p = drop;
  c.dropout_offset = (uint64_t{5} << 32) + 12345 + static_cast<uint64_t>(head_dim);
  return c;
}

// The deterministic-backward tests' case: causal, GQA 4 / 2, two sequences,
// dropout 0.1 at an offset past 2^32.
inline Case dropout_determinism_case(int head_dim, uint64_t seed) {
  Case c = make_case(FA_BF16, 203, 333, head_dim, seed);
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = true;
  c.dropout_p = 0.1f;
  c.dropout_offset = uint64_t{1} << 33;
  return c;
}

// Dropout's mask read off a forward's output: with V_j the unit vector e_j
// (unit_vector_values; seqlen_k <= head_dim), out_ij = P_ij z_ij, and P_ij > 0
// everywhere (no mask), so out_ij == 0 exactly where key j of row i was
// dropped. It must be fa_dropout_mask's, and the kept fraction within 6
// standard deviations of the binomial's mean (p rounded to 8 bits).
inline void unit_vector_values(Problem& p) {
  const Case& c = p.c;
  for (int j = 0; j < c.seqlen_k; ++j)
    for (int h = 0; h < c.heads_kv; ++h)
      for (int col = 0; col < c.head_dim; ++col)
        for (int b = 0; b < c.batch; ++b) write_row_element(p.v, b * c.seqlen_k + j, h, col, col == j ? 1.0f : 0.0f);
}

inline void expect_output_shows_the_dropout_mask(const Problem& p, const HostTensor& out) {
  const Case& c = p.c;
  HostTensor m = make_host_tensor(FA_F32, {c.batch, c.heads_q, c.seqlen_q, c.seqlen_k});
  const fa_extras x = p.extras();
  ASSERT_EQ(fa_dropout_mask(&x, &m.desc), FA_OK) << fa_last_error();
  const float* z = reinterpret_cast<const float*>(m.bytes.data());
  int64_t kept = 0, n = 0, mismatched = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads_q; ++h)
      for (int i = 0; i < c.seqlen_q; ++i)
        for (int j = 0; j < c.seqlen_k; ++j, ++n) {
          const double o = read_row_element(out, b * c.seqlen_q + i, h, j);
          ASSERT_FALSE(std::isnan(o)) << "out NaN at " << b << "," << h << "," << i << "," << j;
          const bool kernel_kept = o != 0.0;
          kept += kernel_kept;
          mismatched += kernel_kept != (z[n] != 0.0f);
        }
  EXPECT_EQ(mismatched, 0) << "of " << n << " elements";
  const double p8 = std::min(std::floor(c.dropout_p * 256.0 + 0.5), 255.0) / 256.0;
  const double mean = n * (1.0 - p8), sd = std::sqrt(n * p8 * (1.0 - p8));
  EXPECT_LE(std::abs(static_cast<double>(kept) - mean), 6.0 * sd) << "kept " << kept << " of " << n;
}

}  // namespace flashattn::testing
