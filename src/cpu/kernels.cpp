// The CPU backend's dense inner loops, in two builds chosen at run time so one
// binary runs on any x86-64 and uses AVX2+FMA where the CPU has it:
//   - blocked: register-blocked with GCC vector types, compiled for AVX2+FMA;
//   - simple: row-at-a-time loops that the compiler vectorizes for the baseline
//     ISA (the blocked code, lowered to SSE2, ran 6x slower than these).

#include <cmath>
#include <cstdint>

#include "core/numeric.h"
#include "cpu/tiles.h"

#define FA_ALWAYS_INLINE __attribute__((always_inline)) inline
#if defined(__x86_64__) && defined(__GNUC__)
#define FA_HAVE_AVX2_VARIANT 1
#define FA_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define FA_TARGET_AVX2
#endif

namespace flashattn::cpu {
namespace {

// NOTES: register blocking. A row-at-a-time update reads and writes C in L1 for
// every multiply-add (one store per FMA caps it far below peak); here a block
// of kRowBlock rows x 16 columns of C stays in 8 vector registers for the whole
// reduction. Written with GCC vector types, not left to the auto-vectorizer,
// which turned the blocked loops into shuffles and stack traffic. Rows are done
// in blocks of kRowBlock: the callers' tiles hold kBlockQ rows, zero-filled past
// `rows`, so the padded rows are computed harmlessly.
using v8 = float __attribute__((vector_size(32)));  // two SSE or one AVX register
constexpr int kLanes = 8;
constexpr int kRowBlock = 4;
static_assert(kBlockQ % kRowBlock == 0 && kBlockK % (2 * kLanes) == 0, "tiles must fit the blocks");

FA_ALWAYS_INLINE v8 load8(const float* p) {
  v8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
FA_ALWAYS_INLINE void store8(float* p, v8 v) { __builtin_memcpy(p, &v, sizeof v); }

FA_ALWAYS_INLINE void matmul_a_bt_blocked(const float* a, const float* bt, int rows, int d, float* c) {
  for (int i0 = 0; i0 < rows; i0 += kRowBlock) {
    for (int j0 = 0; j0 < kBlockK; j0 += 2 * kLanes) {
      v8 acc[kRowBlock][2] = {};
      for (int k = 0; k < d; ++k) {
        const v8 b0 = load8(bt + k * kBlockK + j0), b1 = load8(bt + k * kBlockK + j0 + kLanes);
#pragma GCC unroll 4
        for (int r = 0; r < kRowBlock; ++r) {
          const float ark = a[(i0 + r) * d + k];
          acc[r][0] += ark * b0;
          acc[r][1] += ark * b1;
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRowBlock; ++r) {
        store8(c + (i0 + r) * kBlockK + j0, acc[r][0]);
        store8(c + (i0 + r) * kBlockK + j0 + kLanes, acc[r][1]);
      }
    }
  }
}

// C[i0 .. i0+kRowBlock)[c0 .. c0 + kVectors*8) += P * B over `cols` keys.
template <int kVectors>
FA_ALWAYS_INLINE void acc_p_b_block(const float* p, const float* b, int i0, int cols, int d, int c0,
                                    float* c) {
  v8 acc[kRowBlock][kVectors];
#pragma GCC unroll 4
  for (int r = 0; r < kRowBlock; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < kVectors; ++v) acc[r][v] = load8(c + (i0 + r) * d + c0 + v * kLanes);
  for (int j = 0; j < cols; ++j) {
    v8 bj[kVectors];
#pragma GCC unroll 2
    for (int v = 0; v < kVectors; ++v) bj[v] = load8(b + j * d + c0 + v * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < kRowBlock; ++r) {
      const float prj = p[(i0 + r) * kBlockK + j];
#pragma GCC unroll 2
      for (int v = 0; v < kVectors; ++v) acc[r][v] += prj * bj[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRowBlock; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < kVectors; ++v) store8(c + (i0 + r) * d + c0 + v * kLanes, acc[r][v]);
}

FA_ALWAYS_INLINE void matmul_acc_p_b_blocked(const float* p, const float* b, int rows, int cols, int d,
                                          float* c) {
  // d is a multiple of 8: blocks of 16 columns, and one of 8 for the rest.
  for (int i0 = 0; i0 < rows; i0 += kRowBlock) {
    int c0 = 0;
    for (; c0 + 2 * kLanes <= d; c0 += 2 * kLanes) acc_p_b_block<2>(p, b, i0, cols, d, c0, c);
    if (c0 < d) acc_p_b_block<1>(p, b, i0, cols, d, c0, c);
  }
}

// NOTES: the softmax's exp. Calling expf per score cost as much as both tile
// products together (perf: ~40% of the forward). This exp is branch-free, so
// the loop vectorizes: exp(x) = 2^n * 2^f with n = round(x log2 e), |f| <= 1/2,
// and 2^f = e^(f ln 2) by its degree-6 Taylor polynomial (relative error
// < 2e-7, below f32's own rounding of the inputs). Below 2^-126 (and for -inf,
// the masked scores) the result is exactly 0.
constexpr float kMinExponent = -126.0f;
constexpr float kMaxExponent = 127.0f;

using v8i = int32_t __attribute__((vector_size(32)));
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (y + M) - M rounds y to an integer

FA_ALWAYS_INLINE v8 splat(float x) { return v8{} + x; }

// Written in vector types like the products: the scalar form was not vectorized.
FA_ALWAYS_INLINE v8 exp_approx(v8 x) {
  const v8 y_raw = x * kLog2e;
  const v8 y_low = y_raw < splat(kMinExponent) ? splat(kMinExponent) : y_raw;
  const v8 y = y_low > splat(kMaxExponent) ? splat(kMaxExponent) : y_low;
  const v8 n = (y + kRoundMagic) - kRoundMagic;
  const v8 t = (y - n) * kLn2;
  v8 p = splat(1.0f / 720);
  p = p * t + 1.0f / 120;
  p = p * t + 1.0f / 24;
  p = p * t + 1.0f / 6;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 two_n;
  __builtin_memcpy(&two_n, &bits, sizeof two_n);
  return y_raw < splat(kMinExponent) ? splat(0.0f) : p * two_n;
}

FA_ALWAYS_INLINE float exp_shifted_body(float* s, float shift) {
  v8 partial = {};
  for (int j = 0; j < kBlockK; j += kLanes) {
    const v8 e = exp_approx(load8(s + j) - shift);
    store8(s + j, e);
    partial += e;
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += partial[l];
  return sum;
}

FA_TARGET_AVX2 float exp_shifted_avx2(float* s, float shift) { return exp_shifted_body(s, shift); }

float exp_shifted_simple(float* s, float shift) {
  float sum = 0.0f;
  for (int j = 0; j < kBlockK; ++j) {
    s[j] = std::exp(s[j] - shift);
    sum += s[j];
  }
  return sum;
}

void matmul_a_bt_simple(const float* a, const float* bt, int rows, int d, float* c) {
  for (int i = 0; i < rows; ++i) {
    float* ci = c + i * kBlockK;
    for (int j = 0; j < kBlockK; ++j) ci[j] = 0.0f;
    for (int k = 0; k < d; ++k) {
      const float aik = a[i * d + k];
      const float* bk = bt + k * kBlockK;
      for (int j = 0; j < kBlockK; ++j) ci[j] += aik * bk[j];
    }
  }
}

void matmul_acc_p_b_simple(const float* p, const float* b, int rows, int cols, int d, float* c) {
  for (int i = 0; i < rows; ++i) {
    float* ci = c + i * d;
    for (int j = 0; j < cols; ++j) {
      const float pij = p[i * kBlockK + j];
      const float* bj = b + j * d;
      for (int k = 0; k < d; ++k) ci[k] += pij * bj[k];
    }
  }
}

FA_TARGET_AVX2 void matmul_a_bt_avx2(const float* a, const float* bt, int rows, int d, float* c) {
  matmul_a_bt_blocked(a, bt, rows, d, c);
}

FA_TARGET_AVX2 void matmul_acc_p_b_avx2(const float* p, const float* b, int rows, int cols, int d,
                                        float* c) {
  matmul_acc_p_b_blocked(p, b, rows, cols, d, c);
}

bool cpu_has_avx2_fma() {
#ifdef FA_HAVE_AVX2_VARIANT
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

}  // namespace

void matmul_a_bt(const float* a, const float* bt, int rows, int d, float* c) {
  cpu_has_avx2_fma() ? matmul_a_bt_avx2(a, bt, rows, d, c) : matmul_a_bt_simple(a, bt, rows, d, c);
}

void matmul_acc_p_b(const float* p, const float* b, int rows, int cols, int d, float* c) {
  cpu_has_avx2_fma() ? matmul_acc_p_b_avx2(p, b, rows, cols, d, c)
                     : matmul_acc_p_b_simple(p, b, rows, cols, d, c);
}

float exp_shifted(float* s, float shift) {
  return cpu_has_avx2_fma() ? exp_shifted_avx2(s, shift) : exp_shifted_simple(s, shift);
}

}  // namespace flashattn::cpu
