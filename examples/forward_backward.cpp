// Exact attention with the C++ API on the CPU backend: forward with the
// logsumexp, then gradients. Build: see examples/CMakeLists.txt.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashattn/flashattn.hpp"

int main() {
  const int batch = 2, seqlen = 128, heads = 8, heads_kv = 2, head_dim = 64;  // GQA 4:1
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const size_t nq = size_t(batch) * seqlen * heads * head_dim;
  const size_t nkv = size_t(batch) * seqlen * heads_kv * head_dim;
  std::vector<float> q = randn(nq), k = randn(nkv), v = randn(nkv), dout = randn(nq);
  std::vector<float> out(nq), lse(size_t(batch) * heads * seqlen), dq(nq), dk(nkv), dv(nkv);

  // flash-attn layout: (batch, seqlen, heads, head_dim); lse is (batch, heads, seqlen).
  auto rows = [&](std::vector<float>& x, int h) {
    return flashattn::make_tensor(x.data(), FA_F32, {batch, seqlen, h, head_dim});
  };
  fa_tensor tq = rows(q, heads), tk = rows(k, heads_kv), tv = rows(v, heads_kv), to = rows(out, heads);
  fa_tensor tdo = rows(dout, heads), tdq = rows(dq, heads), tdk = rows(dk, heads_kv), tdv = rows(dv, heads_kv);
  fa_tensor tlse = flashattn::make_tensor(lse.data(), FA_F32, {batch, heads, seqlen});

  const auto options = flashattn::Options{}.with_causal().with_softcap(30.0f);
  try {
    flashattn::forward(tq, tk, tv, to, &tlse, options);
    flashattn::backward(tq, tk, tv, to, tdo, tlse, tdq, tdk, tdv, options);
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "flashattn failed: %s\n", e.what());
    return 1;
  }
  double norm = 0;
  for (float x : dk) norm += double(x) * x;
  std::printf("out[0] = %.6f  lse[0] = %.6f  |dk| = %.4f\n", out[0], lse[0], std::sqrt(norm));

  // Bad input is an exception with a message, never a crash.
  fa_tensor bad_k = tk, bad_v = tv;
  bad_k.shape[2] = bad_v.shape[2] = 3;  // 8 query heads are not a multiple of 3 kv heads
  try {
    flashattn::forward(tq, bad_k, bad_v, to, nullptr, options);
  } catch (const flashattn::Error& e) {
    std::printf("as expected: %s\n", e.what());
  }
  return 0;
}
