// `flashattn bench`: the main job. Runs exact attention by the FlashAttention
// algorithm on the best backend present over a sweep of shapes, checks each
// against the fp64 reference (row-subsampled for large shapes), and prints
// time, throughput, memory and error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/validate.h"
#include "device.h"
#include "reference/reference.h"

namespace flashattn::tools {
namespace {

struct Shape {
  int batch, seqlen, heads_q, heads_kv, head_dim;
  bool causal;
};

struct BenchOptions {
  fa_backend backend = FA_BACKEND_AUTO;
  fa_dtype dtype = FA_BF16;
  bool dtype_set = false;
  int warmup = 3;
  int repeats = 10;
  int check_rows = 32;  // query rows checked per (sequence, head)
  bool backward = false;
  bool json = false;
  bool protocol = false;
  int threads = 0;
  std::vector<int> seqlens, head_dims;
  int tokens = 0;   // batch * seqlen; 0 = per sweep default
  int hidden = 0;   // heads * head_dim; 0 = per sweep default
  int heads_kv_ratio = 1;
  std::vector<bool> causal = {false, true};
};

constexpr const char* kBenchUsage =
    "usage: flashattn bench [--backend auto|cpu|cuda] [--dtype f32|f16|bf16]\n"
    "                       [--protocol] [--seqlens 512,1024] [--head-dims 64,128]\n"
    "                       [--tokens N] [--hidden N] [--gqa R] [--causal on|off|both]\n"
    "                       [--backward] [--warmup N] [--repeats N] [--check-rows N]\n"
    "                       [--threads N] [--json]\n"
    "Times the forward (and with --backward the backward) pass over a sweep of shapes and\n"
    "checks each result against the float64 reference. --protocol runs the sweep of\n"
    "docs/performance.md (16k tokens, hidden 2048, seqlen 512..16k, hdim 64/128/256).\n";

// Sweeps: the benchmark protocol (docs/performance.md) on a GPU; on a CPU the same shape of sweep,
// scaled down so it runs in about a minute on two cores.
std::vector<Shape> make_sweep(const BenchOptions& o, fa_backend backend) {
  const bool gpu_scale = o.protocol || backend == FA_BACKEND_CUDA;
  std::vector<int> seqlens = o.seqlens;
  if (seqlens.empty()) {
    seqlens = gpu_scale ? std::vector<int>{512, 1024, 2048, 4096, 8192, 16384}
                        : std::vector<int>{256, 512, 1024, 2048};
  }
  std::vector<int> dims = o.head_dims;
  if (dims.empty()) dims = gpu_scale ? std::vector<int>{64, 128, 256} : std::vector<int>{64, 128};
  const int tokens = o.tokens > 0 ? o.tokens : (gpu_scale ? 16384 : 2048);
  const int hidden = o.hidden > 0 ? o.hidden : (gpu_scale ? 2048 : 512);
  std::vector<Shape> shapes;
  for (int d : dims) {
    for (bool causal : o.causal) {
      for (int s : seqlens) {
        const int heads = std::max(1, hidden / d);
        shapes.push_back({std::max(1, tokens / s), s, heads, std::max(1, heads / o.heads_kv_ratio), d,
                          causal});
      }
    }
  }
  return shapes;
}

struct Result {
  Shape shape;
  double fwd_ms = 0, fwd_tflops = 0, bwd_ms = 0, bwd_tflops = 0;
  double extra_bytes = 0, naive_bytes = 0;
  double max_error = 0, tolerance = 0;
  bool checked = false, ok = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

fa_tensor rows_tensor(void* data, fa_dtype dtype, fa_backend backend, int b, int s, int h, int d) {
  fa_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device_of(backend);
  t.ndim = 4;
  const int64_t shape[] = {b, s, h, d};
  const int64_t strides[] = {int64_t{s} * h * d, int64_t{h} * d, d, 1};
  std::copy(shape, shape + 4, t.shape);
  std::copy(strides, strides + 4, t.strides);
  return t;
}

fa_tensor lse_tensor(void* data, fa_backend backend, int b, int h, int s) {
  fa_tensor t{};
  t.data = data;
  t.dtype = FA_F32;
  t.device = device_of(backend);
  t.ndim = 3;
  const int64_t shape[] = {b, h, s};
  const int64_t strides[] = {int64_t{h} * s, s, 1};
  std::copy(shape, shape + 3, t.shape);
  std::copy(strides, strides + 3, t.strides);
  return t;
}

std::vector<uint8_t> random_bytes(size_t elements, fa_dtype dtype, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(elements * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < elements; ++i) store_from_float(bytes.data(), static_cast<int64_t>(i), dtype, normal(rng));
  return bytes;
}

void fail_call(fa_status st, const char* what) {
  if (st != FA_OK) throw CliError(std::string(what) + " failed: " + fa_last_error());
}

// Checks sampled rows of `out` against the fp64 reference with the tolerance rule.
void check_forward(const Shape& s, const BenchOptions& o, const fa_tensor& hq, const fa_tensor& hk,
                   const fa_tensor& hv, const fa_options& opts, const std::vector<uint8_t>& out,
                   Result* r) {
  AttentionParams p;
  fa_options ref_opts = opts;
  ref_opts.backend = FA_BACKEND_CPU;
  if (make_shape_params(&hq, &hk, &hv, nullptr, &ref_opts, &p) != FA_OK) {
    throw CliError(std::string("reference setup failed: ") + last_error());
  }
  const int row_stride = std::max(1, s.seqlen / std::max(1, o.check_rows));
  const auto exact = reference::forward(p, reference::Precision::kFloat64, row_stride);
  const auto naive = reference::forward(p, reference::Precision::kInput, row_stride);
  double err = 0, base = 0;
  bool nan = false;
  const int d = s.head_dim;
  for (int64_t row = 0; row < p.total_q; ++row) {
    if ((row % s.seqlen) % row_stride != 0) continue;
    for (int h = 0; h < s.heads_q; ++h) {
      for (int c = 0; c < d; ++c) {
        const size_t i = (static_cast<size_t>(row) * s.heads_q + h) * d + c;
        const double got = load_as_float(out.data(), static_cast<int64_t>(i), o.dtype);
        nan = nan || std::isnan(got);
        err = std::max(err, std::abs(got - exact.out[i]));
        base = std::max(base, std::abs(naive.out[i] - exact.out[i]));
      }
    }
  }
  r->checked = true;
  r->max_error = nan ? NAN : err;
  r->tolerance = reference::tolerance(o.dtype, base);
  r->ok = !nan && err <= r->tolerance;
}

Result run_shape(const Shape& s, const BenchOptions& o, fa_backend backend, uint64_t seed) {
  Result r;
  r.shape = s;
  std::mt19937_64 rng(seed);
  const size_t q_elems = size_t(s.batch) * s.seqlen * s.heads_q * s.head_dim;
  const size_t kv_elems = size_t(s.batch) * s.seqlen * s.heads_kv * s.head_dim;
  const size_t lse_bytes = size_t(s.batch) * s.heads_q * s.seqlen * sizeof(float);
  const auto hq = random_bytes(q_elems, o.dtype, rng);
  const auto hk = random_bytes(kv_elems, o.dtype, rng);
  const auto hv = random_bytes(kv_elems, o.dtype, rng);
  const size_t esize = dtype_size(o.dtype);
  Buffer q(backend, q_elems * esize), k(backend, kv_elems * esize), v(backend, kv_elems * esize);
  Buffer out(backend, q_elems * esize), lse(backend, lse_bytes);
  q.upload(hq.data());
  k.upload(hk.data());
  v.upload(hv.data());
  out.fill_bytes(0xff);  // NaN in every float format: unwritten outputs show up
  const fa_tensor tq = rows_tensor(q.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_q, s.head_dim);
  const fa_tensor tk = rows_tensor(k.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_kv, s.head_dim);
  const fa_tensor tv = rows_tensor(v.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_kv, s.head_dim);
  fa_tensor to = rows_tensor(out.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_q, s.head_dim);
  fa_tensor tl = lse_tensor(lse.data(), backend, s.batch, s.heads_q, s.seqlen);
  fa_options opts = fa_default_options();
  opts.causal = s.causal;
  opts.backend = backend;
  opts.num_threads = o.threads;

  fail_call(fa_forward(&tq, &tk, &tv, &to, &tl, nullptr, &opts), "forward");
  synchronize(backend);
  std::vector<uint8_t> hout(q_elems * esize);
  out.download(hout.data());
  if (o.check_rows > 0) {
    check_forward(s, o, rows_tensor(const_cast<uint8_t*>(hq.data()), o.dtype, FA_BACKEND_CPU, s.batch, s.seqlen, s.heads_q, s.head_dim),
                  rows_tensor(const_cast<uint8_t*>(hk.data()), o.dtype, FA_BACKEND_CPU, s.batch, s.seqlen, s.heads_kv, s.head_dim),
                  rows_tensor(const_cast<uint8_t*>(hv.data()), o.dtype, FA_BACKEND_CPU, s.batch, s.seqlen, s.heads_kv, s.head_dim),
                  opts, hout, &r);
  }

  auto forward = [&] { fail_call(fa_forward(&tq, &tk, &tv, &to, &tl, nullptr, &opts), "forward"); };
  r.fwd_ms = median(time_calls(backend, o.warmup, o.repeats, forward));
  // FLOPs = 4 * b * h * sq * sk * d, halved when causal.
  const double flops = 4.0 * s.batch * s.heads_q * double(s.seqlen) * s.seqlen * s.head_dim *
                       (s.causal ? 0.5 : 1.0);
  r.fwd_tflops = flops / (r.fwd_ms * 1e-3) / 1e12;

  size_t fwd_workspace = 0;
  fail_call(fa_forward_workspace_size(&tq, &tk, &tv, nullptr, &opts, &fwd_workspace), "workspace query");
  r.extra_bytes = double(fwd_workspace + lse_bytes);
  // Naive attention materializes S and P: two f32 matrices of b*h*sq*sk.
  r.naive_bytes = 2.0 * s.batch * s.heads_q * double(s.seqlen) * s.seqlen * sizeof(float);

  if (o.backward) {
    Buffer dout(backend, q_elems * esize), dq(backend, q_elems * esize), dk(backend, kv_elems * esize),
        dv(backend, kv_elems * esize);
    const auto hdo = random_bytes(q_elems, o.dtype, rng);
    dout.upload(hdo.data());
    fa_tensor tdo = rows_tensor(dout.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_q, s.head_dim);
    fa_tensor tdq = rows_tensor(dq.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_q, s.head_dim);
    fa_tensor tdk = rows_tensor(dk.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_kv, s.head_dim);
    fa_tensor tdv = rows_tensor(dv.data(), o.dtype, backend, s.batch, s.seqlen, s.heads_kv, s.head_dim);
    size_t ws_bytes = 0;
    fail_call(fa_backward_workspace_size(&tq, &tk, &tv, nullptr, &opts, &ws_bytes), "workspace query");
    Buffer ws(backend, ws_bytes);
    auto both = [&] {
      forward();
      fail_call(fa_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, nullptr, &opts,
                            ws.data(), ws_bytes),
                "backward");
    };
    // Backward time = time(forward + backward) - time(forward); FLOPs 2.5x forward.
    r.bwd_ms = median(time_calls(backend, o.warmup, o.repeats, both)) - r.fwd_ms;
    r.bwd_tflops = 2.5 * flops / (r.bwd_ms * 1e-3) / 1e12;
    r.extra_bytes = std::max(r.extra_bytes, double(ws_bytes + lse_bytes));
  }
  return r;
}

std::string shape_label(const Shape& s) {
  std::ostringstream o;
  o << s.batch << "x" << s.seqlen << "x" << s.heads_q;
  if (s.heads_kv != s.heads_q) o << "/" << s.heads_kv;
  o << "x" << s.head_dim << (s.causal ? " causal" : "");
  return o.str();
}

void print_table(const std::vector<Result>& results, const BenchOptions& o, fa_backend backend) {
  std::printf("\nflashattn %s bench on %s (%s), %s, median of %d runs after %d warm-up\n",
              fa_version(), backend == FA_BACKEND_CUDA ? "cuda" : "cpu", device_name(backend).c_str(),
              fa_dtype_name(o.dtype), o.repeats, o.warmup);
  std::printf("%-24s %10s %9s", "b x s x h x d", "fwd ms", "TFLOP/s");
  if (o.backward) std::printf(" %10s %9s", "bwd ms", "TFLOP/s");
  std::printf(" %11s %12s %10s %10s %s\n", "extra MiB", "naive MiB", "max err", "tol", "check");
  for (const Result& r : results) {
    std::printf("%-24s %10.3f %9.3f", shape_label(r.shape).c_str(), r.fwd_ms, r.fwd_tflops);
    if (o.backward) std::printf(" %10.3f %9.3f", r.bwd_ms, r.bwd_tflops);
    std::printf(" %11.2f %12.1f %10.2e %10.2e %s\n", r.extra_bytes / 1048576.0,
                r.naive_bytes / 1048576.0, r.max_error, r.tolerance,
                !r.checked ? "-" : (r.ok ? "ok" : "FAIL"));
  }
  std::printf("extra MiB: memory beyond inputs and outputs (workspace + logsumexp); naive MiB: the S "
              "and P matrices naive attention materializes (f32).\n");
}

void print_json(const std::vector<Result>& results, const BenchOptions& o, fa_backend backend) {
  std::printf("{\"version\": \"%s\", \"backend\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
              "\"repeats\": %d, \"results\": [\n",
              fa_version(), backend == FA_BACKEND_CUDA ? "cuda" : "cpu", device_name(backend).c_str(),
              fa_dtype_name(o.dtype), o.repeats);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const Shape& s = r.shape;
    std::printf("  {\"batch\": %d, \"seqlen\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"head_dim\": %d, "
                "\"causal\": %s, \"fwd_ms\": %.6f, \"fwd_tflops\": %.4f, \"bwd_ms\": %.6f, "
                "\"bwd_tflops\": %.4f, \"extra_bytes\": %.0f, \"naive_bytes\": %.0f, "
                "\"max_error\": %.6g, \"tolerance\": %.6g, \"checked\": %s, \"ok\": %s}%s\n",
                s.batch, s.seqlen, s.heads_q, s.heads_kv, s.head_dim, s.causal ? "true" : "false",
                r.fwd_ms, r.fwd_tflops, r.bwd_ms, r.bwd_tflops, r.extra_bytes, r.naive_bytes,
                std::isnan(r.max_error) ? -1.0 : r.max_error, r.tolerance,
                r.checked ? "true" : "false", r.ok ? "true" : "false",
                i + 1 < results.size() ? "," : "");
  }
  std::printf("]}\n");
}

}  // namespace

int bench_main(Args& args) {
  BenchOptions o;
  if (args.flag("--help")) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  o.backend = parse_backend(args.value("--backend", "auto"));
  if (auto d = args.value("--dtype", ""); !d.empty()) {
    o.dtype = parse_dtype(d);
    o.dtype_set = true;
  }
  o.protocol = args.flag("--protocol");
  o.backward = args.flag("--backward");
  o.json = args.flag("--json");
  o.warmup = args.int_value("--warmup", o.warmup);
  o.repeats = args.int_value("--repeats", o.repeats);
  o.check_rows = args.int_value("--check-rows", o.check_rows);
  o.threads = args.int_value("--threads", 0);
  o.tokens = args.int_value("--tokens", 0);
  o.hidden = args.int_value("--hidden", 0);
  o.heads_kv_ratio = args.int_value("--gqa", 1);
  o.seqlens = args.int_list("--seqlens");
  o.head_dims = args.int_list("--head-dims");
  const std::string causal = args.value("--causal", "both");
  if (causal == "on") o.causal = {true};
  else if (causal == "off") o.causal = {false};
  else if (causal != "both") throw CliError("--causal takes on, off or both, not '" + causal + "'");
  args.finish();
  if (o.repeats < 1 || o.warmup < 0 || o.heads_kv_ratio < 1) {
    throw CliError("--repeats must be >= 1, --warmup >= 0, --gqa >= 1");
  }

  // The best backend present: CUDA when a GPU is visible, else the CPU.
  fa_backend backend = o.backend;
  if (backend == FA_BACKEND_AUTO) backend = fa_backend_available(FA_BACKEND_CUDA) ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
  if (!fa_backend_available(backend)) {
    throw CliError(std::string("backend unavailable: ") + fa_backend_unavailable_reason(backend));
  }
  if (!o.dtype_set) o.dtype = backend == FA_BACKEND_CUDA ? FA_BF16 : FA_F32;

  const std::vector<Shape> shapes = make_sweep(o, backend);
  std::vector<Result> results;
  bool all_ok = true;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::fprintf(stderr, "[%zu/%zu] %s %s ...\n", i + 1, shapes.size(), shape_label(shapes[i]).c_str(),
                 fa_dtype_name(o.dtype));
    results.push_back(run_shape(shapes[i], o, backend, 1000 + i));
    all_ok = all_ok && results.back().ok;
  }
  if (o.json) print_json(results, o, backend);
  else print_table(results, o, backend);
  if (!all_ok) {
    std::fprintf(stderr, "error: some results exceed the tolerance versus the float64 reference\n");
    return 1;
  }
  return 0;
}

}  // namespace flashattn::tools
