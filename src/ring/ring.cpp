// Ring attention over a Transport: the schedule (plan_step), the forward
// (merge of per-block partials in fp32) and the backward (dK/dV travelling
// with their blocks). docs/ring.md derives both.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "flashattn/ring.hpp"
#include "ring/ops.h"

namespace flashattn::ring {

StepCall plan_step(int world, int rank, int src, bool causal) {
  // The bounding rectangle of the visible (query half, key half) pairs.
  StepCall call;
  int q_lo = 2, q_hi = -1, kv_lo = 2, kv_hi = -1;
  bool diagonal = false;
  PairKind kinds[2][2];
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      kinds[a][b] = pair_kind(rank_chunk(world, rank, a), rank_chunk(world, src, b), causal);
      if (kinds[a][b] == PairKind::kEmpty) continue;
      diagonal |= kinds[a][b] == PairKind::kDiagonal;
      q_lo = std::min(q_lo, a), q_hi = std::max(q_hi, a);
      kv_lo = std::min(kv_lo, b), kv_hi = std::max(kv_hi, b);
    }
  }
  if (q_hi < 0) return call;
  call = {false, q_lo, q_hi + 1, kv_lo, kv_hi + 1, diagonal};
  // A causal call over the rectangle must see exactly the visible pairs: full
  // pairs below the diagonal, empty above (the rank's own block); a
  // non-causal one needs every pair in it full.
  for (int a = q_lo; a <= q_hi; ++a) {
    for (int b = kv_lo; b <= kv_hi; ++b) {
      const PairKind want = !diagonal ? PairKind::kFull
                            : a == b  ? PairKind::kDiagonal
                                      : (b < a ? PairKind::kFull : PairKind::kEmpty);
      if (kinds[a][b] != want || (diagonal && src != rank)) {
        throw Error(FA_ERROR_INTERNAL, "ring schedule: step of rank " + std::to_string(rank) +
                                           " on block " + std::to_string(src) +
                                           " is not one rectangle");
      }
    }
  }
  return call;
}

namespace {

// ---- Arguments ----

void require(bool ok, const std::string& what) {
  if (!ok) throw Error(FA_ERROR_INVALID_ARGUMENT, "ring attention: " + what);
}

bool contiguous(const fa_tensor& t) {
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != stride) return false;
    stride *= t.shape[d];
  }
  return true;
}

std::string shape_of(const fa_tensor& t) {
  std::string s = "(";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + ")";
}

void check_tensor(const fa_tensor& t, const char* name, int64_t d0, int64_t d1, int64_t d2,
                  int64_t d3, const fa_tensor& like_q, bool f32) {
  const int ndim = d3 < 0 ? 3 : 4;
  require(t.data != nullptr, std::string(name) + " is a null pointer");
  require(t.ndim == ndim && t.shape[0] == d0 && t.shape[1] == d1 && t.shape[2] == d2 &&
              (ndim == 3 || t.shape[3] == d3),
          std::string(name) + " has shape " + shape_of(t) + ", expected (" + std::to_string(d0) +
              ", " + std::to_string(d1) + ", " + std::to_string(d2) +
              (ndim == 4 ? ", " + std::to_string(d3) : std::string()) + ")");
  require(contiguous(t), std::string(name) + " must be contiguous");
  require(t.dtype == (f32 ? FA_F32 : like_q.dtype),
          std::string(name) + " has dtype " + fa_dtype_name(t.dtype) + ", expected " +
              fa_dtype_name(f32 ? FA_F32 : like_q.dtype));
  require(t.device == like_q.device && t.device_index == like_q.device_index,
          std::string(name) + " is not on q's device");
}

// The problem one rank sees, validated once.
struct Shape {
  int world = 1, rank = 0;
  int64_t seqlen = 0, batch = 0, heads_q = 0, heads_kv = 0, dim = 0;
  fa_dtype dtype = FA_F32;
  int64_t local(int r) const { return local_seqlen(seqlen, world, r); }
  // Start of half h of rank r's slice, in rows of its local tensors.
  int64_t half_begin(int r, int h) const {
    return h == 0 ? 0 : chunk_range(seqlen, world, rank_chunk(world, r, 0)).size();
  }
  int64_t half_end(int r, int h) const { return h == 0 ? half_begin(r, 1) : local(r); }
};

Shape check_problem(const Transport& t, int64_t seqlen, const fa_tensor& q, const fa_tensor& k,
                    const fa_tensor& v, const Options& options) {
  Shape s;
  s.world = t.world_size();
  s.rank = t.rank();
  require(s.world >= 1 && s.rank >= 0 && s.rank < s.world,
          "transport rank " + std::to_string(s.rank) + " of " + std::to_string(s.world));
  // NOTES: every chunk non-empty (seqlen >= 2P) keeps every rank's slice and
  // every block non-empty.
  require(seqlen >= 2 * static_cast<int64_t>(s.world) && seqlen <= INT32_MAX,
          "seqlen " + std::to_string(seqlen) + " out of [2 * world_size, 2^31) (world_size " +
              std::to_string(s.world) + ")");
  require(q.ndim == 4, "q must be (batch, local_seqlen, heads_q, head_dim), got " + shape_of(q));
  require(k.ndim == 4, "k must be (batch, local_seqlen, heads_kv, head_dim), got " + shape_of(k));
  require(options.window_left < 0 && options.window_right < 0,
          "sliding windows are not supported (window_left/window_right must be -1)");
  s.seqlen = seqlen;
  s.batch = q.shape[0];
  s.heads_q = q.shape[2];
  s.heads_kv = k.shape[2];
  s.dim = q.shape[3];
  s.dtype = q.dtype;
  require(s.batch >= 1 && s.heads_q >= 1 && s.heads_kv >= 1 && s.dim >= 1,
          "empty q or k: q " + shape_of(q) + ", k " + shape_of(k));
  require(s.heads_q % s.heads_kv == 0, "heads_q " + std::to_string(s.heads_q) +
                                           " is not a multiple of heads_kv " +
                                           std::to_string(s.heads_kv));
  const int64_t n = s.local(s.rank);
  check_tensor(q, "q", s.batch, n, s.heads_q, s.dim, q, false);
  check_tensor(k, "k", s.batch, n, s.heads_kv, s.dim, q, false);
  check_tensor(v, "v", s.batch, n, s.heads_kv, s.dim, q, false);
  return s;
}

// ---- Memory ----

const DeviceOps& ops_for(const fa_tensor& t) {
  const DeviceOps& ops = t.device == FA_DEVICE_CUDA ? cuda_ops() : cpu_ops();
  ops.require_device(t.device_index);
  return ops;
}

class Buffer {
 public:
  Buffer(const DeviceOps& ops, size_t bytes, void* stream)
      : ops_(ops), stream_(stream), p_(ops.allocate(bytes, stream)) {}
  ~Buffer() { ops_.release(p_, stream_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T = void>
  T* get() const { return static_cast<T*>(p_); }

 private:
  const DeviceOps& ops_;
  void* stream_;
  void* p_;
};

fa_tensor view(void* data, fa_dtype dtype, const fa_tensor& like, int64_t b, int64_t rows,
               int64_t heads, int64_t dim) {
  return make_tensor(data, dtype, {b, rows, heads, dim}, like.device, like.device_index);
}

// Rows [begin, end) of a contiguous (batch, rows, heads, dim) tensor.
fa_tensor row_slice(const fa_tensor& t, int64_t begin, int64_t end) {
  fa_tensor s = t;
  s.data = static_cast<char*>(t.data) + begin * t.strides[1] * dtype_size(t.dtype);
  s.shape[1] = end - begin;
  return s;
}

// Rows [begin, end) of a (batch, heads, rows) lse.
fa_tensor lse_slice(const fa_tensor& t, int64_t begin, int64_t end) {
  fa_tensor s = t;
  s.data = static_cast<float*>(t.data) + begin;
  s.shape[2] = end - begin;
  return s;
}

// A K/V block (K then V, each (batch, rows, heads_kv, dim)) in one buffer of
// the largest block any rank holds; elem bytes per value.
struct BlockLayout {
  const Shape& s;
  size_t elem;
  int64_t max_rows() const {
    int64_t m = 0;
    for (int r = 0; r < s.world; ++r) m = std::max(m, s.local(r));
    return m;
  }
  size_t part_bytes(int r) const {
    return static_cast<size_t>(s.batch * s.local(r) * s.heads_kv * s.dim) * elem;
  }
  size_t bytes(int r) const { return 2 * part_bytes(r); }
  size_t capacity() const {
    return 2 * static_cast<size_t>(s.batch * max_rows() * s.heads_kv * s.dim) * elem;
  }
  void* second(void* base, int r) const { return static_cast<char*>(base) + part_bytes(r); }
};

// The sub-problem of one step: rows of the local queries and of the block.
struct StepRows {
  int64_t q_begin, q_end, kv_begin, kv_end;
  bool empty() const { return q_end <= q_begin || kv_end <= kv_begin; }
};

StepRows step_rows(const Shape& s, int src, const StepCall& c) {
  return {s.half_begin(s.rank, c.q_begin), s.half_end(s.rank, c.q_end - 1),
          s.half_begin(src, c.kv_begin), s.half_end(src, c.kv_end - 1)};
}

Options step_options(const Options& options, bool causal) {
  Options o = options;
  o.causal = causal;
  return o;
}

RowBlock q_rows(const Shape& s, const StepRows& r) {
  return {s.batch, s.local(s.rank), r.q_begin, r.q_end, s.heads_q, s.dim};
}

}  // namespace

// NOTES (forward): with every step's (O_step normalised, lse_step) of the
// local queries against the block in hand, the running state (O, lse) in
// fp32 absorbs it by the one merge of state.h; after P steps every key of
// the sequence has been merged once, so (O, lse) is exact attention. The
// step's O is in the input dtype (one rounding per step, as a single call
// rounds once); the sum over steps is never rounded to it.
void forward(Transport& transport, int64_t seqlen, const fa_tensor& q, const fa_tensor& k,
             const fa_tensor& v, fa_tensor& out, fa_tensor& lse, const Options& options) {
  const Shape s = check_problem(transport, seqlen, q, k, v, options);
  const int64_t n = s.local(s.rank);
  check_tensor(out, "out", s.batch, n, s.heads_q, s.dim, q, false);
  check_tensor(lse, "lse", s.batch, s.heads_q, n, -1, q, true);
  const DeviceOps& ops = ops_for(q);
  void* stream = options.stream;
  const int64_t q_values = s.batch * n * s.heads_q * s.dim, lse_values = s.batch * s.heads_q * n;
  const size_t elem = dtype_size(s.dtype);
  const BlockLayout layout{s, elem};

  Buffer acc_o(ops, q_values * sizeof(float), stream), acc_lse(ops, lse_values * sizeof(float), stream);
  Buffer step_o(ops, q_values * elem, stream), step_lse(ops, lse_values * sizeof(float), stream);
  Buffer kv0(ops, layout.capacity(), stream), kv1(ops, layout.capacity(), stream);
  ops.fill(acc_o.get<float>(), q_values, 0.0f, stream);
  ops.fill(acc_lse.get<float>(), lse_values, -INFINITY, stream);
  void* cur = kv0.get();
  void* next = kv1.get();
  ops.copy(cur, k.data, layout.part_bytes(s.rank), stream);
  ops.copy(layout.second(cur, s.rank), v.data, layout.part_bytes(s.rank), stream);
  const fa_tensor step_o_t = view(step_o.get(), s.dtype, q, s.batch, n, s.heads_q, s.dim);
  const fa_tensor step_lse_t =
      make_tensor(step_lse.get(), FA_F32, {s.batch, s.heads_q, n}, q.device, q.device_index);

  for (int step = 0; step < s.world; ++step) {
    const int src = (s.rank - step + s.world) % s.world;
    const int incoming = (src - 1 + s.world) % s.world;
    const bool more = step + 1 < s.world;
    if (more) transport.start(cur, layout.bytes(src), next, layout.bytes(incoming), stream);
    const StepCall call = plan_step(s.world, s.rank, src, options.causal);
    const StepRows rows = step_rows(s, src, call);
    if (!call.none && !rows.empty()) {
      const fa_tensor kb = view(cur, s.dtype, q, s.batch, s.local(src), s.heads_kv, s.dim);
      const fa_tensor vb = view(layout.second(cur, src), s.dtype, q, s.batch, s.local(src),
                                s.heads_kv, s.dim);
      fa_tensor o_t = row_slice(step_o_t, rows.q_begin, rows.q_end);
      fa_tensor l_t = lse_slice(step_lse_t, rows.q_begin, rows.q_end);
      flashattn::forward(row_slice(q, rows.q_begin, rows.q_end),
                         row_slice(kb, rows.kv_begin, rows.kv_end),
                         row_slice(vb, rows.kv_begin, rows.kv_end), o_t, &l_t,
                         step_options(options, call.causal));
      ops.merge(acc_o.get<float>(), acc_lse.get<float>(), step_o.get(), step_lse.get<float>(),
                s.dtype, q_rows(s, rows), stream);
    }
    if (more) {
      transport.finish(stream);
      std::swap(cur, next);
    }
  }
  ops.store(out.data, s.dtype, acc_o.get<float>(), q_values, stream);
  ops.copy(lse.data, acc_lse.get(), lse_values * sizeof(float), stream);
}

// NOTES (backward): with the global lse L_i and D_i = rowsum(dO_i * O_i) of
// the global O, P_ij = exp(s_ij - L_i) is the final probability of every
// pair, and
//   dV_j = sum_i P_ij dO_i,  dS_ij = P_ij (dO_i . V_j - D_i),
//   dQ_i = scale sum_j dS_ij K_j,  dK_j = scale sum_i dS_ij Q_i.
// Every term is one (i, j) pair's, so the sums split over any partition of
// the keys: fa_backward on the local queries against one block, given the
// global out and lse (from which it takes P and D), returns exactly that
// block's share of dQ and the local queries' share of the block's dK, dV.
// dQ sums over the blocks in place (fp32); dK/dV sum in fp32 buffers that
// travel with their block and come home after P hops.
void backward(Transport& transport, int64_t seqlen, const fa_tensor& q, const fa_tensor& k,
              const fa_tensor& v, const fa_tensor& out, const fa_tensor& dout,
              const fa_tensor& lse, fa_tensor& dq, fa_tensor& dk, fa_tensor& dv,
              const Options& options) {
  const Shape s = check_problem(transport, seqlen, q, k, v, options);
  const int64_t n = s.local(s.rank);
  check_tensor(out, "out", s.batch, n, s.heads_q, s.dim, q, false);
  check_tensor(dout, "dout", s.batch, n, s.heads_q, s.dim, q, false);
  check_tensor(lse, "lse", s.batch, s.heads_q, n, -1, q, true);
  check_tensor(dq, "dq", s.batch, n, s.heads_q, s.dim, q, false);
  check_tensor(dk, "dk", s.batch, n, s.heads_kv, s.dim, q, false);
  check_tensor(dv, "dv", s.batch, n, s.heads_kv, s.dim, q, false);
  const DeviceOps& ops = ops_for(q);
  void* stream = options.stream;
  const int64_t q_values = s.batch * n * s.heads_q * s.dim;
  const size_t elem = dtype_size(s.dtype);
  const BlockLayout kv_layout{s, elem}, grad_layout{s, sizeof(float)};

  Buffer dq_acc(ops, q_values * sizeof(float), stream), dq_step(ops, q_values * elem, stream);
  Buffer dkv_step(ops, kv_layout.capacity(), stream);
  Buffer kv0(ops, kv_layout.capacity(), stream), kv1(ops, kv_layout.capacity(), stream);
  Buffer g0(ops, grad_layout.capacity(), stream), g1(ops, grad_layout.capacity(), stream);
  ops.fill(dq_acc.get<float>(), q_values, 0.0f, stream);
  ops.fill(g0.get<float>(), static_cast<int64_t>(grad_layout.bytes(s.rank) / sizeof(float)), 0.0f,
           stream);
  void *kv = kv0.get(), *kv_next = kv1.get(), *g = g0.get(), *g_next = g1.get();
  ops.copy(kv, k.data, kv_layout.part_bytes(s.rank), stream);
  ops.copy(kv_layout.second(kv, s.rank), v.data, kv_layout.part_bytes(s.rank), stream);
  const fa_tensor dq_step_t = view(dq_step.get(), s.dtype, q, s.batch, n, s.heads_q, s.dim);

  for (int step = 0; step < s.world; ++step) {
    const int src = (s.rank - step + s.world) % s.world;
    const int incoming = (src - 1 + s.world) % s.world;
    if (step + 1 < s.world) {
      transport.start(kv, kv_layout.bytes(src), kv_next, kv_layout.bytes(incoming), stream);
    }
    const StepCall call = plan_step(s.world, s.rank, src, options.causal);
    const StepRows rows = step_rows(s, src, call);
    const int64_t m = s.local(src);
    const fa_tensor kb = view(kv, s.dtype, q, s.batch, m, s.heads_kv, s.dim);
    const fa_tensor vb = view(kv_layout.second(kv, src), s.dtype, q, s.batch, m, s.heads_kv, s.dim);
    fa_tensor dkb = view(dkv_step.get(), s.dtype, q, s.batch, m, s.heads_kv, s.dim);
    fa_tensor dvb = view(kv_layout.second(dkv_step.get(), src), s.dtype, q, s.batch, m,
                         s.heads_kv, s.dim);
    const bool work = !call.none && !rows.empty();
    if (work) {
      auto qs = [&](const fa_tensor& t) { return row_slice(t, rows.q_begin, rows.q_end); };
      auto ks = [&](const fa_tensor& t) { return row_slice(t, rows.kv_begin, rows.kv_end); };
      fa_tensor dq_t = qs(dq_step_t), dk_t = ks(dkb), dv_t = ks(dvb);
      flashattn::backward(qs(q), ks(kb), ks(vb), qs(out), qs(dout),
                          lse_slice(lse, rows.q_begin, rows.q_end), dq_t, dk_t, dv_t,
                          step_options(options, call.causal));
    }
    // The block's gradient buffer (sent by the previous rank last step) and
    // the next K/V block have arrived.
    transport.finish(stream);
    if (work) {
      ops.accumulate(dq_acc.get<float>(), dq_step.get(), s.dtype, q_rows(s, rows), stream);
      const RowBlock kv_rows{s.batch, m, rows.kv_begin, rows.kv_end, s.heads_kv, s.dim};
      ops.accumulate(static_cast<float*>(g), dkb.data, s.dtype, kv_rows, stream);
      ops.accumulate(static_cast<float*>(grad_layout.second(g, src)), dvb.data, s.dtype, kv_rows, stream);
    }
    if (s.world > 1) {
      transport.start(g, grad_layout.bytes(src), g_next, grad_layout.bytes(incoming), stream);
      std::swap(g, g_next);
    }
    std::swap(kv, kv_next);
  }
  // After P hops the buffer in hand holds this rank's own block's gradients.
  transport.finish(stream);
  ops.store(dq.data, s.dtype, dq_acc.get<float>(), q_values, stream);
  const int64_t kv_values = s.batch * n * s.heads_kv * s.dim;
  ops.store(dk.data, s.dtype, static_cast<float*>(g), kv_values, stream);
  ops.store(dv.data, s.dtype, static_cast<float*>(grad_layout.second(g, s.rank)), kv_values,
            stream);
}

}  // namespace flashattn::ring
