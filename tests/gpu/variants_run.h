// The extras of a Problem on the device and one CUDA forward / backward with
// them (ALiBi, sinks, dropout, block masks), shared by the GPU variant suites.
#pragma once

#include <gtest/gtest.h>

#include <functional>

#include "common/harness.h"
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

}  // namespace flashattn::testing
