// libFuzzer target: the C ABI's argument validation against a model of what
// must be accepted. Each input decodes to a valid call (random shapes, row
// padding, GQA, varlen cu_seqlens, options, and from the input's tail a block
// mask) and at most one mutation (of the call, and of the block mask) with a
// known verdict: a valid call must succeed and write every output (finite
// results from finite inputs), a broken one must fail with a message and
// touch nothing. Buffers are exactly as large as each tensor's extent, so
// AddressSanitizer sees any read or write outside them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "flashattn/flashattn.h"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

// Bytes of the fuzzer's input as bounded choices (zeros once exhausted).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | (pos_ < size_ ? data_[pos_++] : 0);
    return v;
  }
  int pick(int lo, int hi) { return lo + static_cast<int>(byte() % static_cast<unsigned>(hi - lo + 1)); }
  bool flag() { return byte() & 1; }

 private:
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A tensor and a buffer of exactly its byte extent.
struct Tensor {
  fa_tensor desc{};
  std::unique_ptr<uint8_t[]> memory;
  size_t bytes = 0;
};

size_t item_size(fa_dtype t) { return flashattn::dtype_size(t); }

bool is_empty(const fa_tensor& t) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}

// Rows (the dims before heads) x heads x dim, rows padded by `pad` elements.
Tensor make(fa_dtype dtype, std::vector<int64_t> shape, int pad) {
  Tensor t;
  t.desc.dtype = dtype;
  t.desc.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.desc.ndim - 1; i >= 0; --i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = stride;
    stride *= shape[i];
    if (i == t.desc.ndim - 2 && t.desc.ndim >= 3) stride += pad;  // after heads x dim: a row
  }
  int64_t last = 0;
  for (int i = 0; i < t.desc.ndim; ++i) last += (shape[i] - 1) * t.desc.strides[i];
  t.bytes = is_empty(t.desc) ? 0 : static_cast<size_t>(last + 1) * item_size(dtype);
  t.memory.reset(new uint8_t[t.bytes == 0 ? 1 : t.bytes]);
  t.desc.data = t.bytes == 0 ? nullptr : t.memory.get();
  return t;
}

// fn(element offset) for every element of a non-empty tensor (row padding excluded).
template <typename Fn>
void for_each_element(const fa_tensor& t, Fn&& fn) {
  if (is_empty(t)) return;
  int64_t index[FA_MAX_DIMS] = {};
  for (;;) {
    int64_t offset = 0;
    for (int i = 0; i < t.ndim; ++i) offset += index[i] * t.strides[i];
    fn(offset);
    int i = t.ndim - 1;
    while (i >= 0 && ++index[i] == t.shape[i]) index[i--] = 0;
    if (i < 0) return;
  }
}

// Finite values in [-2, 2) for inputs, NaN (poison) for outputs.
void fill(Tensor& t, uint32_t seed, bool output) {
  for_each_element(t.desc, [&](int64_t i) {
    seed = seed * 1664525u + 1013904223u;
    const float x = output ? NAN : static_cast<float>(static_cast<int>(seed >> 20) - 2048) / 1024.0f;
    flashattn::store_from_float(t.memory.get(), i, t.desc.dtype, x);
  });
}

bool all_finite(const Tensor& t) {
  bool finite = true;
  for_each_element(t.desc, [&](int64_t i) {
    finite = finite && std::isfinite(flashattn::load_as_float(t.memory.get(), i, t.desc.dtype));
  });
  return finite;
}

struct Problem {
  bool varlen = false;
  std::vector<int32_t> cu_q, cu_k;
  fa_varlen vl{};
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  fa_options o{};
  // Block mask lists (int32, exact extents), used when mask.block_q != 0.
  Tensor counts, indices, full_counts, full_indices;
  fa_block_mask mask{};
  int q_blocks = 0, k_blocks = 0;
  const fa_varlen* varlen_ptr() const { return varlen ? &vl : nullptr; }
};

std::vector<int32_t> cumulative(Input& in, int batch, int max_len, int* longest) {
  std::vector<int32_t> cu{0};
  for (int b = 0; b < batch; ++b) {
    const int n = in.pick(0, max_len);
    *longest = n > *longest ? n : *longest;
    cu.push_back(cu.back() + n);
  }
  return cu;
}

void build(Input& in, Problem& p) {
  const fa_dtype dtype = static_cast<fa_dtype>(in.pick(0, 2));
  const int hkv = in.pick(1, 3), hq = hkv * in.pick(1, 3), d = 8 * in.pick(1, 4), batch = in.pick(0, 3);
  p.varlen = in.flag();
  int sq = in.pick(0, 40), sk = in.pick(0, 40);
  std::vector<int64_t> rows_q{batch, sq}, rows_k{batch, sk}, lse_shape{batch, hq, sq};
  if (p.varlen) {
    sq = sk = 0;
    p.cu_q = cumulative(in, batch, 40, &sq);
    p.cu_k = cumulative(in, batch, 40, &sk);
    p.vl = {p.cu_q.data(), p.cu_k.data(), batch, sq, sk};
    rows_q = {p.cu_q.back()};
    rows_k = {p.cu_k.back()};
    lse_shape = {hq, p.cu_q.back()};
  }
  auto with = [](std::vector<int64_t> rows, int64_t h, int64_t dim) {
    rows.push_back(h);
    rows.push_back(dim);
    return rows;
  };
  Tensor* qlike[] = {&p.q, &p.out, &p.dout, &p.dq};
  for (Tensor* t : qlike) *t = make(dtype, with(rows_q, hq, d), 8 * in.pick(0, 2));
  for (Tensor* t : {&p.k, &p.v, &p.dk, &p.dv}) *t = make(dtype, with(rows_k, hkv, d), 8 * in.pick(0, 2));
  p.lse = make(FA_F32, lse_shape, 0);
  const uint32_t seed = in.u32();
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.dout}) fill(*t, seed + static_cast<uint32_t>(t->bytes), false);
  for (Tensor* t : {&p.out, &p.dq, &p.dk, &p.dv, &p.lse}) fill(*t, 0, true);
  p.o = fa_default_options();
  p.o.backend = FA_BACKEND_CPU;
  p.o.causal = in.flag();
  p.o.window_left = in.pick(-1, 50);
  p.o.window_right = in.pick(-1, 50);
  p.o.softcap = in.flag() ? 5.0f : 0.0f;
  p.o.softmax_scale = in.flag() ? 0.3f : 0.0f;
  p.o.num_threads = in.pick(0, 3);
}

// A call's arguments, by pointer, so a mutation can replace one.
struct Args {
  fa_tensor q, k, v, out, lse, dout, dq, dk, dv;
  fa_varlen vl;
  fa_options o;
};

int64_t int32_choice(Input& in) {
  const int64_t choices[] = {INT32_MAX, INT32_MIN, -1, 1 << 29, (1 << 29) + 1, 0};
  return choices[in.pick(0, 5)];
}

// One mutation of the arguments; returns whether the call must still succeed.
bool mutate(Input& in, const Problem& p, bool backward, Args& a) {
  fa_tensor* outputs[] = {&a.out, &a.dq, &a.dk, &a.dv};
  fa_tensor* any[] = {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv};
  fa_tensor& t = *any[in.pick(0, backward ? 7 : 3)];  // a tensor the call reads or writes
  const int kind = in.pick(0, 13);
  switch (kind) {
    case 1: {  // a hostile stride on a dimension that matters
      const int dim = in.pick(0, t.ndim - 1);
      if (t.shape[dim] < 2 || is_empty(t)) return true;
      const int64_t bad[] = {0, -1, -(int64_t{1} << 40), int64_t{1} << 62, INT64_MAX};
      t.strides[dim] = bad[in.pick(0, 4)];
      return false;
    }
    case 2: t.shape[t.ndim - 1] += 8; return false;  // head_dim mismatch
    case 3: a.o.window_left = -2 - in.pick(0, 100); return false;
    case 4: a.o.reserved[in.pick(0, 6)] = in.pick(1, 255); return false;
    case 5: { int32_t code = in.pick(3, 200); std::memcpy(&a.o.backend, &code, 4); return false; }
    case 6: { int32_t code = in.pick(2, 200); std::memcpy(&t.device, &code, 4); return false; }
    case 7: { int32_t code = -in.pick(1, 100); std::memcpy(&t.dtype, &code, 4); return false; }
    case 8: {  // an output aliasing q (an empty q has no memory to alias)
      fa_tensor& o = *outputs[backward ? in.pick(1, 3) : 0];
      if (is_empty(a.q)) return true;
      o.data = a.q.data;
      return is_empty(o);
    }
    case 9: a.o.softcap = NAN; return false;
    case 10: a.o.num_threads = -in.pick(1, 100); return false;
    case 11: {  // window sizes at or past the range mean unbounded
      a.o.window_left = in.flag() ? INT32_MAX : INT32_MAX - in.pick(0, 100);
      return true;
    }
    case 12: a.lse.shape[a.lse.ndim - 1] += 1; return false;
    case 13: {  // max_seqlen_q: valid iff it bounds every sequence and FA_MAX_SEQLEN
      if (!p.varlen) return true;
      const int64_t m = in.flag() ? int32_choice(in) : a.vl.max_seqlen_q - in.pick(0, 1);
      if (m == 1 << 29) return true;  // valid, but walks 2^23 empty tiles: too slow here
      a.vl.max_seqlen_q = static_cast<int32_t>(m);
      return m >= p.vl.max_seqlen_q && m <= FA_MAX_SEQLEN;
    }
    default: return true;
  }
}

// cu_seqlens_k corrupted in place: valid iff the model's 64-bit checks pass.
bool corrupt_cu(Input& in, Problem& p) {
  if (!p.varlen || !in.flag()) return true;
  const size_t i = static_cast<size_t>(in.pick(0, static_cast<int>(p.cu_k.size()) - 1));
  p.cu_k[i] = static_cast<int32_t>(in.u32());
  if (p.cu_k[0] != 0 || p.cu_k.back() != p.k.desc.shape[0]) return false;
  for (size_t b = 0; b + 1 < p.cu_k.size(); ++b) {
    const int64_t len = int64_t{p.cu_k[b + 1]} - p.cu_k[b];
    if (len < 0 || len > p.vl.max_seqlen_k) return false;
  }
  return true;
}

int32_t* ints(Tensor& t) { return reinterpret_cast<int32_t*>(t.memory.get()); }

// Lists of (B, H, q_blocks) rows, each a random subset of the key blocks split
// between the partial and the full list, junk past the counts.
void fill_lists(Input& in, Problem& p) {
  const int64_t rows = p.counts.desc.shape[0] * p.counts.desc.shape[1] * p.q_blocks;
  const int cap = static_cast<int>(p.indices.desc.shape[3]), full_cap = static_cast<int>(p.full_indices.desc.shape[3]);
  std::vector<int32_t> order(static_cast<size_t>(p.k_blocks));
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < p.k_blocks; ++i) order[i] = i;
    for (int i = p.k_blocks - 1; i > 0; --i) std::swap(order[i], order[in.pick(0, i)]);
    const int n = in.pick(0, std::min(cap, p.k_blocks));
    const int n_full = in.pick(0, std::min(full_cap, p.k_blocks - n));
    ints(p.counts)[r] = n;
    ints(p.full_counts)[r] = n_full;
    for (int e = 0; e < cap; ++e) ints(p.indices)[r * cap + e] = e < n ? order[e] : static_cast<int32_t>(in.u32());
    for (int e = 0; e < full_cap; ++e)
      ints(p.full_indices)[r * full_cap + e] = e < n_full ? order[n + e] : static_cast<int32_t>(in.u32());
  }
}

// A block mask from the input's tail (none when it is exhausted).
void build_block_mask(Input& in, Problem& p, int batch, int heads, int seqlen_q, int seqlen_k) {
  if (!in.flag()) return;
  p.mask.block_q = in.pick(1, 20);
  p.mask.block_k = in.pick(1, 20);
  p.q_blocks = (seqlen_q + p.mask.block_q - 1) / p.mask.block_q;
  p.k_blocks = (seqlen_k + p.mask.block_k - 1) / p.mask.block_k;
  const int64_t b = in.flag() ? 1 : batch, h = in.flag() ? 1 : heads;
  p.counts = make(FA_I32, {b, h, p.q_blocks}, 0);
  p.indices = make(FA_I32, {b, h, p.q_blocks, in.pick(0, p.k_blocks + 1)}, 0);
  p.full_counts = make(FA_I32, {b, h, p.q_blocks}, 0);
  p.full_indices = make(FA_I32, {b, h, p.q_blocks, in.pick(0, p.k_blocks + 1)}, 0);
  fill_lists(in, p);
  p.mask.kv_num_blocks = &p.counts.desc;
  p.mask.kv_indices = &p.indices.desc;
  p.mask.full_kv_num_blocks = &p.full_counts.desc;
  p.mask.full_kv_indices = &p.full_indices.desc;
}

// One mutation of the block mask's lists or descriptors; returns whether the
// call must still succeed. Buffers stay exactly as large as before: a shape
// grown past them must be refused before anything is read.
bool mutate_block_mask(Input& in, Problem& p) {
  if (p.mask.block_q == 0) return true;
  Tensor& counts = in.flag() ? p.counts : p.full_counts;
  Tensor& indices = &counts == &p.counts ? p.indices : p.full_indices;
  const int64_t rows = counts.desc.shape[0] * counts.desc.shape[1] * p.q_blocks;
  const int cap = static_cast<int>(indices.desc.shape[3]);
  const int kind = in.pick(0, 8);
  if (rows == 0 && kind <= 4) return true;  // no list entry to change
  const int64_t r = rows > 0 ? in.pick(0, 255) % rows : 0;
  const int n = rows > 0 ? ints(counts)[r] : 0;
  switch (kind) {
    case 1: ints(counts)[r] = in.flag() ? cap + 1 + in.pick(0, 9) : -1 - in.pick(0, 9); return false;
    case 2: {  // an index outside [0, k_blocks)
      if (n == 0) return true;
      ints(indices)[r * cap + in.pick(0, n - 1)] = in.flag() ? p.k_blocks + in.pick(0, 9) : INT32_MIN + in.pick(0, 9);
      return false;
    }
    case 3: {  // a key block twice in one list
      if (n < 2) return true;
      ints(indices)[r * cap + n - 1] = ints(indices)[r * cap];
      return false;
    }
    case 4: {  // junk past the count is never read
      if (n >= cap) return true;
      ints(indices)[r * cap + in.pick(n, cap - 1)] = static_cast<int32_t>(in.u32());
      return true;
    }
    case 5: p.mask.block_q = -in.pick(0, 9); return false;
    case 6: counts.desc.shape[2] += 1 + in.pick(0, 9); return false;  // q_blocks mismatch
    case 7: counts.desc.shape[0] = indices.desc.shape[0] = counts.desc.shape[0] + 2; return false;
    case 8: indices.desc.dtype = FA_F32; return false;
    default: return true;
  }
}

fa_status call(bool backward, Args& a, const Problem& p) {
  const fa_varlen* vl = p.varlen ? &a.vl : nullptr;
  fa_extras x = fa_default_extras();
  if (p.mask.block_q != 0 || p.mask.kv_num_blocks != nullptr) x.block_mask = &p.mask;
  if (!backward) return fa_forward_ex(&a.q, &a.k, &a.v, &a.out, &a.lse, vl, &a.o, &x);
  return fa_backward_ex(&a.q, &a.k, &a.v, &a.out, &a.dout, &a.lse, &a.dq, &a.dk, &a.dv, vl, &a.o, &x, nullptr, 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Problem p;
  build(in, p);
  const bool backward = in.flag();
  Args a{p.q.desc, p.k.desc, p.v.desc, p.out.desc, p.lse.desc, p.dout.desc, p.dq.desc, p.dk.desc, p.dv.desc, p.vl, p.o};
  if (backward) require(call(false, a, p) == FA_OK);  // the backward's out and lse
  bool valid = corrupt_cu(in, p);
  valid = mutate(in, p, backward, a) && valid;
  // The mask joins valid calls only (so its verdict is the call's), sized by
  // the lengths the library will see (a valid max_seqlen mutation included).
  if (valid) {
    const int batch = static_cast<int>(p.varlen ? p.vl.batch : p.q.desc.shape[0]);
    const int heads = static_cast<int>(p.q.desc.shape[p.q.desc.ndim - 2]);
    build_block_mask(in, p, batch, heads, p.varlen ? a.vl.max_seqlen_q : static_cast<int>(p.q.desc.shape[1]),
                     p.varlen ? a.vl.max_seqlen_k : static_cast<int>(p.k.desc.shape[1]));
    valid = mutate_block_mask(in, p);
  }
  // A valid mutation may change the mask (window, cu_seqlens): out and lse
  // again under the same arguments, or the backward's P = exp(S - lse) could
  // overflow legitimately.
  if (backward && valid) require(call(false, a, p) == FA_OK);
  const fa_status status = call(backward, a, p);
  if (!valid) {
    require(status != FA_OK && fa_last_error()[0] != '\0');
    return 0;
  }
  require(status == FA_OK);
  if (backward) {
    require(all_finite(p.dq) && all_finite(p.dk) && all_finite(p.dv));
  } else {
    require(all_finite(p.out));
  }
  return 0;
}
