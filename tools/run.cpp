// `flashattn run`: attention on NumPy files in the flash-attn layout, for
// debugging and interop. Inputs may be float16/32/64; outputs are float32.
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "core/dtype.h"
#include "device.h"
#include "npy.h"

namespace flashattn::tools {
namespace {

constexpr const char* kRunUsage =
    "usage: flashattn run --q q.npy --k k.npy --v v.npy --out o.npy [--lse lse.npy]\n"
    "                     [--causal] [--window L,R] [--softcap C] [--scale S]\n"
    "                     [--dtype f32|f16|bf16] [--backend auto|cpu|cuda]\n"
    "                     [--backward --dout do.npy --dq dq.npy --dk dk.npy --dv dv.npy]\n"
    "Arrays are (batch, seqlen, heads, head_dim) or (seqlen, heads, head_dim); lse is\n"
    "written as (batch, heads, seqlen). Outputs are float32 .npy files.\n";

// An .npy array in the compute dtype on the backend's device.
struct DeviceArray {
  std::vector<int64_t> shape;  // always 4-D (batch, seqlen, heads, head_dim)
  std::unique_ptr<Buffer> buffer;
  fa_tensor desc{};
};

// NOTES: head_dim > 0 keeps every buffer sized from a shape (out, lse) within
// the file's data: an empty array then has batch, seqlen or heads 0.
std::vector<int64_t> as_4d(const NpyArray& a, const std::string& name) {
  if (a.shape.size() != 3 && a.shape.size() != 4) {
    throw CliError(name + " must have 3 or 4 dimensions (seqlen, heads, head_dim), got " +
                   std::to_string(a.shape.size()));
  }
  if (a.shape.back() == 0) throw CliError(name + " has head_dim 0");
  if (a.shape.size() == 4) return a.shape;
  return {1, a.shape[0], a.shape[1], a.shape[2]};
}

fa_tensor describe(void* data, fa_dtype dtype, fa_backend backend, const std::vector<int64_t>& shape) {
  fa_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device_of(backend);
  t.ndim = 4;
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

DeviceArray load(const std::string& path, const std::string& name, fa_dtype dtype, fa_backend backend) {
  NpyArray a;
  std::string error;
  if (!read_npy(path, &a, &error)) throw CliError(error);
  DeviceArray d;
  d.shape = as_4d(a, name);
  std::vector<uint8_t> bytes(a.values.size() * dtype_size(dtype));
  for (size_t i = 0; i < a.values.size(); ++i) store_from_float(bytes.data(), int64_t(i), dtype, a.values[i]);
  d.buffer = std::make_unique<Buffer>(backend, bytes.size());
  d.buffer->upload(bytes.data());
  d.desc = describe(d.buffer->data(), dtype, backend, d.shape);
  return d;
}

DeviceArray empty_like(const DeviceArray& like, fa_dtype dtype, fa_backend backend) {
  DeviceArray d;
  d.shape = like.shape;
  d.buffer = std::make_unique<Buffer>(backend, like.buffer->bytes());
  d.buffer->fill_bytes(0xff);
  d.desc = describe(d.buffer->data(), dtype, backend, d.shape);
  return d;
}

void save(const std::string& path, const DeviceArray& d, fa_dtype dtype) {
  std::vector<uint8_t> bytes(d.buffer->bytes());
  d.buffer->download(bytes.data());
  std::vector<float> values(bytes.size() / dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) values[i] = load_as_float(bytes.data(), int64_t(i), dtype);
  std::string error;
  if (!write_npy_f32(path, d.shape, values, &error)) throw CliError(error);
}

void check(fa_status st, const char* what) {
  if (st != FA_OK) throw CliError(std::string(what) + ": " + fa_last_error());
}

std::string required(Args& args, const char* name) {
  std::string v = args.value(name, "");
  if (v.empty()) throw CliError(std::string(name) + " is required (see flashattn run --help)");
  return v;
}

}  // namespace

int run_main(Args& args) {
  if (args.flag("--help")) {
    std::fputs(kRunUsage, stdout);
    return 0;
  }
  const std::string q_path = required(args, "--q"), k_path = required(args, "--k"),
                    v_path = required(args, "--v"), out_path = required(args, "--out");
  const std::string lse_path = args.value("--lse", "");
  fa_options opts = fa_default_options();
  opts.causal = args.flag("--causal");
  opts.softcap = static_cast<float>(args.double_value("--softcap", 0.0));
  opts.softmax_scale = static_cast<float>(args.double_value("--scale", 0.0));
  const std::string window = args.value("--window", "");
  if (!window.empty()) {
    if (std::sscanf(window.c_str(), "%d,%d", &opts.window_left, &opts.window_right) != 2) {
      throw CliError("--window takes L,R (e.g. 128,0; -1 = unbounded), not '" + window + "'");
    }
  }
  const fa_dtype dtype = parse_dtype(args.value("--dtype", "f32"));
  fa_backend backend = parse_backend(args.value("--backend", "auto"));
  if (backend == FA_BACKEND_AUTO) backend = fa_backend_available(FA_BACKEND_CUDA) ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
  opts.backend = backend;
  const bool backward = args.flag("--backward");
  std::string do_path, dq_path, dk_path, dv_path;
  if (backward) {
    do_path = required(args, "--dout");
    dq_path = required(args, "--dq");
    dk_path = required(args, "--dk");
    dv_path = required(args, "--dv");
  }
  args.finish();
  if (!fa_backend_available(backend)) {
    throw CliError(std::string("backend unavailable: ") + fa_backend_unavailable_reason(backend));
  }

  DeviceArray q = load(q_path, "q", dtype, backend), k = load(k_path, "k", dtype, backend),
              v = load(v_path, "v", dtype, backend);
  DeviceArray out = empty_like(q, dtype, backend);
  const int64_t b = q.shape[0], s = q.shape[1], h = q.shape[2];
  DeviceArray lse;
  lse.shape = {b, h, s};
  lse.buffer = std::make_unique<Buffer>(backend, size_t(b * h * s) * sizeof(float));
  lse.desc = describe(lse.buffer->data(), FA_F32, backend, {1, b, h, s});
  lse.desc.ndim = 3;
  for (int i = 0; i < 3; ++i) {
    lse.desc.shape[i] = lse.desc.shape[i + 1];
    lse.desc.strides[i] = lse.desc.strides[i + 1];
  }
  check(fa_forward(&q.desc, &k.desc, &v.desc, &out.desc, &lse.desc, nullptr, &opts), "forward");
  save(out_path, out, dtype);
  if (!lse_path.empty()) save(lse_path, lse, FA_F32);

  if (backward) {
    DeviceArray dout = load(do_path, "dout", dtype, backend);
    DeviceArray dq = empty_like(q, dtype, backend), dk = empty_like(k, dtype, backend),
                dv = empty_like(v, dtype, backend);
    check(fa_backward(&q.desc, &k.desc, &v.desc, &out.desc, &dout.desc, &lse.desc, &dq.desc,
                      &dk.desc, &dv.desc, nullptr, &opts, nullptr, 0),
          "backward");
    save(dq_path, dq, dtype);
    save(dk_path, dk, dtype);
    save(dv_path, dv, dtype);
  }
  return 0;
}

}  // namespace flashattn::tools
