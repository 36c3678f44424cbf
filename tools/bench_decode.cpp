// `flashattn bench --decode`: one decode step (one query token per sequence,
// nothing appended) against a KV cache, contiguous or paged through a shuffled
// block table, over a sweep of (batch, KV length). Reports the time per call,
// GB/s of K and V read, and the error of the first sequences against the
// float64 reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/validate.h"
#include "device.h"
#include "reference/reference.h"
#include "tensors.h"

namespace flashattn::tools {
namespace {

struct DecodeOptions {
  fa_backend backend = FA_BACKEND_AUTO;
  fa_dtype dtype = FA_BF16;
  int heads_q = 0, heads_kv = 0, head_dim = 0;  // 0: the backend's default sweep
  int page_size = 0;                            // 0: contiguous cache
  int warmup = 3, repeats = 20, check_seqs = 2, threads = 0;
  std::vector<int> batches, kv_lens;
  bool json = false;
};

// Defaults: issue 28's decode table on a GPU (32/8 heads, d128); on a CPU a
// scaled-down sweep that runs in seconds.
void fill_defaults(DecodeOptions& o, fa_backend backend) {
  const bool gpu = backend == FA_BACKEND_CUDA;
  if (o.heads_q == 0) o.heads_q = gpu ? 32 : 8;
  if (o.heads_kv == 0) o.heads_kv = std::max(1, o.heads_q / 4);
  if (o.head_dim == 0) o.head_dim = gpu ? 128 : 64;
  if (o.batches.empty()) o.batches = gpu ? std::vector<int>{1, 16, 64} : std::vector<int>{1, 4};
  if (o.kv_lens.empty()) o.kv_lens = gpu ? std::vector<int>{4096, 16384, 65536} : std::vector<int>{1024, 4096};
}

struct DecodeResult {
  int batch, kv_len;
  double us = 0, gbs = 0, max_error = 0, tolerance = 0;
  bool ok = true;
};

// One shape's host inputs: q, the cache (rows x slots), lengths and block table.
struct HostDecode {
  int64_t rows, slots;
  std::vector<uint8_t> q, k, v;
  std::vector<int32_t> lens, table;
  int max_blocks = 0;
};

HostDecode make_inputs(const DecodeOptions& o, int batch, int kv_len, std::mt19937_64& rng) {
  HostDecode h;
  if (o.page_size > 0) {
    h.max_blocks = (kv_len + o.page_size - 1) / o.page_size;
    h.rows = int64_t{batch} * h.max_blocks;
    h.slots = o.page_size;
    h.table.resize(static_cast<size_t>(h.rows));
    std::iota(h.table.begin(), h.table.end(), 0);
    std::shuffle(h.table.begin(), h.table.end(), rng);
  } else {
    h.rows = batch;
    h.slots = kv_len;
  }
  const size_t cache = static_cast<size_t>(h.rows * h.slots) * o.heads_kv * o.head_dim;
  h.q = random_bytes(static_cast<size_t>(batch) * o.heads_q * o.head_dim, o.dtype, rng);
  h.k = random_bytes(cache, o.dtype, rng);
  h.v = random_bytes(cache, o.dtype, rng);
  h.lens.assign(static_cast<size_t>(batch), kv_len);
  return h;
}

fa_kvcache describe(fa_tensor* kc, fa_tensor* vc, const int32_t* table, const int32_t* lens,
                    const HostDecode& h) {
  fa_kvcache c = fa_default_kvcache();
  c.k_cache = kc;
  c.v_cache = vc;
  c.cache_seqlens = lens;
  if (!h.table.empty()) {
    c.block_table = table;
    c.max_blocks = h.max_blocks;
    c.block_table_stride = h.max_blocks;
  }
  return c;
}

// The first check_seqs sequences of `out` against the float64 reference.
void check(const DecodeOptions& o, HostDecode& h, int batch, const std::vector<uint8_t>& out,
           DecodeResult* r) {
  const int seqs = std::min(batch, o.check_seqs);
  if (seqs <= 0) return;
  fa_tensor q = make_tensor(h.q.data(), o.dtype, {seqs, 1, o.heads_q, o.head_dim}, FA_DEVICE_CPU);
  fa_tensor kc = make_tensor(h.k.data(), o.dtype, {h.rows, h.slots, o.heads_kv, o.head_dim}, FA_DEVICE_CPU);
  fa_tensor vc = make_tensor(h.v.data(), o.dtype, {h.rows, h.slots, o.heads_kv, o.head_dim}, FA_DEVICE_CPU);
  const fa_kvcache c = describe(&kc, &vc, h.table.data(), h.lens.data(), h);
  fa_options opts = fa_default_options();
  opts.backend = FA_BACKEND_CPU;
  opts.num_threads = o.threads;
  KvCacheParams kp;
  if (make_kvcache_params({&q, &c, nullptr, nullptr, &opts}, &kp) != FA_OK) {
    throw CliError(std::string("reference setup failed: ") + last_error());
  }
  const auto exact = reference::forward_kvcache(kp, reference::Precision::kFloat64).attention;
  const auto naive = reference::forward_kvcache(kp, reference::Precision::kInput).attention;
  double err = 0, base = 0;
  bool nan = false;
  for (size_t i = 0; i < exact.out.size(); ++i) {
    const double got = load_as_float(out.data(), static_cast<int64_t>(i), o.dtype);
    nan = nan || std::isnan(got);
    err = std::max(err, std::abs(got - exact.out[i]));
    base = std::max(base, std::abs(naive.out[i] - exact.out[i]));
  }
  r->max_error = nan ? NAN : err;
  r->tolerance = reference::tolerance(o.dtype, base);
  r->ok = !nan && err <= r->tolerance;
}

DecodeResult run_decode(const DecodeOptions& o, fa_backend backend, int batch, int kv_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostDecode h = make_inputs(o, batch, kv_len, rng);
  const size_t esize = dtype_size(o.dtype);
  Buffer q(backend, h.q.size()), k(backend, h.k.size()), v(backend, h.v.size()), out(backend, h.q.size());
  Buffer table(backend, std::max<size_t>(h.table.size(), 1) * 4), lens(backend, h.lens.size() * 4);
  q.upload(h.q.data());
  k.upload(h.k.data());
  v.upload(h.v.data());
  if (!h.table.empty()) table.upload(h.table.data());
  lens.upload(h.lens.data());
  out.fill_bytes(0xff);  // NaN in every float format: unwritten outputs show up
  const fa_device_type dev = device_of(backend);
  fa_tensor tq = make_tensor(q.data(), o.dtype, {batch, 1, o.heads_q, o.head_dim}, dev);
  fa_tensor tk = make_tensor(k.data(), o.dtype, {h.rows, h.slots, o.heads_kv, o.head_dim}, dev);
  fa_tensor tv = make_tensor(v.data(), o.dtype, {h.rows, h.slots, o.heads_kv, o.head_dim}, dev);
  fa_tensor to = make_tensor(out.data(), o.dtype, {batch, 1, o.heads_q, o.head_dim}, dev);
  const fa_kvcache c = describe(&tk, &tv, static_cast<const int32_t*>(table.data()),
                                static_cast<const int32_t*>(lens.data()), h);
  fa_options opts = fa_default_options();
  opts.backend = backend;
  opts.num_threads = o.threads;
  size_t ws_bytes = 0;
  if (fa_forward_kvcache_workspace_size(&tq, &c, &opts, &ws_bytes) != FA_OK) {
    throw CliError(std::string("workspace query failed: ") + fa_last_error());
  }
  Buffer ws(backend, std::max<size_t>(ws_bytes, 1));
  auto call = [&] {
    if (fa_forward_kvcache(&tq, &c, &to, nullptr, &opts, ws.data(), ws_bytes) != FA_OK) {
      throw CliError(std::string("decode call failed: ") + fa_last_error());
    }
  };
  call();
  synchronize(backend);
  std::vector<uint8_t> hout(h.q.size());
  out.download(hout.data());
  DecodeResult r{batch, kv_len};
  check(o, h, batch, hout, &r);
  std::vector<double> ms = time_calls(backend, o.warmup, o.repeats, call);
  std::sort(ms.begin(), ms.end());
  r.us = ms[ms.size() / 2] * 1e3;
  const double bytes = 2.0 * batch * double(kv_len) * o.heads_kv * o.head_dim * esize;
  r.gbs = bytes / (r.us * 1e-6) / 1e9;
  return r;
}

void print_results(const std::vector<DecodeResult>& results, const DecodeOptions& o, fa_backend backend) {
  const char* where = backend == FA_BACKEND_CUDA ? "cuda" : "cpu";
  if (o.json) {
    std::printf("{\"decode\": true, \"backend\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
                "\"heads_q\": %d, \"heads_kv\": %d, \"head_dim\": %d, \"page_size\": %d, \"results\": [\n",
                where, device_name(backend).c_str(), fa_dtype_name(o.dtype), o.heads_q, o.heads_kv,
                o.head_dim, o.page_size);
    for (size_t i = 0; i < results.size(); ++i) {
      const DecodeResult& r = results[i];
      std::printf("  {\"batch\": %d, \"kv_len\": %d, \"us\": %.3f, \"gbs\": %.2f, \"max_error\": %.6g, "
                  "\"tolerance\": %.6g, \"ok\": %s}%s\n",
                  r.batch, r.kv_len, r.us, r.gbs, std::isnan(r.max_error) ? -1.0 : r.max_error,
                  r.tolerance, r.ok ? "true" : "false", i + 1 < results.size() ? "," : "");
    }
    std::printf("]}\n");
    return;
  }
  std::printf("\nflashattn %s decode on %s (%s), %s, %d/%d heads, d%d, %s, median of %d calls\n",
              fa_version(), where, device_name(backend).c_str(), fa_dtype_name(o.dtype), o.heads_q,
              o.heads_kv, o.head_dim,
              o.page_size ? ("pages of " + std::to_string(o.page_size)).c_str() : "contiguous cache",
              o.repeats);
  std::printf("%6s %8s %10s %9s %10s %10s %s\n", "batch", "kv len", "us/call", "GB/s", "max err", "tol",
              "check");
  for (const DecodeResult& r : results) {
    std::printf("%6d %8d %10.2f %9.1f %10.2e %10.2e %s\n", r.batch, r.kv_len, r.us, r.gbs, r.max_error,
                r.tolerance, r.ok ? "ok" : "FAIL");
  }
  std::printf("GB/s: bytes of K and V read / time of one call (CUDA events around each call on a GPU, "
              "launch included; wall clock on the CPU).\n");
}

}  // namespace

int decode_bench_main(Args& args) {
  DecodeOptions o;
  o.backend = parse_backend(args.value("--backend", "auto"));
  const std::string dtype = args.value("--dtype", "");
  o.heads_q = args.int_value("--heads", 0);
  const int gqa = args.int_value("--gqa", 0);
  const std::vector<int> dims = args.int_list("--head-dims");
  o.page_size = args.int_value("--page-size", 0);
  o.warmup = args.int_value("--warmup", o.warmup);
  o.repeats = args.int_value("--repeats", o.repeats);
  o.check_seqs = args.int_value("--check-seqs", o.check_seqs);
  o.threads = args.int_value("--threads", 0);
  o.batches = args.int_list("--batches");
  o.kv_lens = args.int_list("--kv-lens");
  o.json = args.flag("--json");
  args.finish();
  if (o.repeats < 1 || o.warmup < 0 || o.page_size < 0 || o.check_seqs < 0 || gqa < 0 || dims.size() > 1) {
    throw CliError("--repeats must be >= 1, --warmup, --page-size, --check-seqs, --gqa >= 0, "
                   "one --head-dims value with --decode");
  }
  fa_backend backend = o.backend;
  if (backend == FA_BACKEND_AUTO) backend = fa_backend_available(FA_BACKEND_CUDA) ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
  if (!fa_backend_available(backend)) {
    throw CliError(std::string("backend unavailable: ") + fa_backend_unavailable_reason(backend));
  }
  o.dtype = !dtype.empty() ? parse_dtype(dtype) : (backend == FA_BACKEND_CUDA ? FA_BF16 : FA_F32);
  if (!dims.empty()) o.head_dim = dims[0];
  fill_defaults(o, backend);
  if (gqa > 0) o.heads_kv = std::max(1, o.heads_q / gqa);
  std::vector<DecodeResult> results;
  bool all_ok = true;
  for (int batch : o.batches) {
    for (int kv_len : o.kv_lens) {
      std::fprintf(stderr, "decode batch %d, %d keys ...\n", batch, kv_len);
      results.push_back(run_decode(o, backend, batch, kv_len, 7000 + results.size()));
      all_ok = all_ok && results.back().ok;
    }
  }
  print_results(results, o, backend);
  if (!all_ok) {
    std::fprintf(stderr, "error: some results exceed the tolerance versus the float64 reference\n");
    return 1;
  }
  return 0;
}

}  // namespace flashattn::tools
