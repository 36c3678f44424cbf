// How the sm80 kernels' threads move a swizzled tile between global and
// shared memory with cp.async (in) and 16-byte stores (out).
#pragma once

#include <cstdint>

#include "cuda/common/mma.h"
#include "cuda/common/swizzle.h"
#include "cuda/sm80/fwd/tuning.h"

namespace flashattn::cuda::sm80 {

// How kThreads threads copy a swizzled [kRows][kCols] tile in 16-byte chunks.
// NOTES: each thread keeps one chunk column and steps down kRowsPerPass rows at
// a time. With kRowsPerPass a multiple of 8 the swizzle of its rows never
// changes; with 4 (4 warps on head dim 256) it alternates between two values.
// Either way the addresses are one or two bases plus a constant per step, and
// nothing per-chunk stays live in registers across the K/V loop (computing each
// chunk's address from scratch made the compiler hoist 8 64-bit pointers per
// tile and spill). Threads past kRowsPerPass * kChunks idle (head dims 96 and
// 192, whose 12/24 chunks do not divide the thread count).
template <class Tile, int kThreads, bool kFastWholeTiles = false>
struct TileCopy {
  static constexpr int kRowsPerPass = (kThreads / Tile::kChunks) >= 8
                                          ? (kThreads / Tile::kChunks) / 8 * 8
                                          : (kThreads / Tile::kChunks) / 4 * 4;
  static constexpr int kPasses = Tile::kRows / kRowsPerPass;
  static constexpr bool kTwoSwizzles = kRowsPerPass % 8 != 0;
  static_assert(kRowsPerPass >= 4 && Tile::kRows % (kTwoSwizzles ? 8 : kRowsPerPass) == 0,
                "tile copy shape");
  static constexpr uint32_t kRowBytes = Tile::kAtom * 16;

  int row, chunk;  // this thread's first row and its column chunk
  bool active;
  uint32_t smem0, smem1;  // byte offsets of (row, chunk) and (row + 4, chunk)

  __device__ __forceinline__ explicit TileCopy(int tid)
      : row(tid / Tile::kChunks), chunk(tid % Tile::kChunks),
        active(tid < kRowsPerPass * Tile::kChunks), smem0(Tile::offset(row, chunk)),
        smem1(kTwoSwizzles ? Tile::offset(row + 4, chunk) : 0u) {}

  // Byte offset of this thread's chunk in pass i.
  __device__ __forceinline__ uint32_t pass_offset(int i) const {
    if constexpr (kTwoSwizzles) {
      return (i & 1) ? smem1 + (i - 1) * kRowsPerPass * kRowBytes : smem0 + i * kRowsPerPass * kRowBytes;
    } else {
      return smem0 + i * kRowsPerPass * kRowBytes;
    }
  }

  // Rows [0, rows_valid) x columns [0, cols_valid) of a global tile (rows
  // `row_stride` elements apart) into shared memory at dst; the rest zero-filled.
  template <typename T>
  __device__ __forceinline__ void load(uint32_t dst, const T* src, int64_t row_stride,
                                       int rows_valid, int cols_valid) const {
    if (!active) return;
    const bool col_ok = chunk * 8 < cols_valid;
    // NOTES: the pointer walks down by `step`; the empty asm hides that step is
    // the same every tile, else the compiler keeps all kPasses multiples of it
    // live across the K/V loop (2 registers each), which spilled at head dim 128.
    int64_t step = kRowsPerPass * row_stride;
    asm volatile("" : "+l"(step));
    const T* g = src + row * row_stride + chunk * 8;
    // kFastWholeTiles (tuning.h): a whole tile in bounds (all K/V tiles but a
    // sequence's last, at the kernel's own head dim) takes copies without the
    // per-chunk bound test, pointer select and byte count.
    if (kFastWholeTiles && rows_valid >= Tile::kRows && cols_valid >= Tile::kCols) {
      if constexpr (kWide) {
        load_whole_wide(dst, src, row_stride);
      } else {
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          cp_async_16(dst + pass_offset(i), g);
          g += step;
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool ok = col_ok && row + i * kRowsPerPass < rows_valid;
      cp_async_16(dst + pass_offset(i), ok ? g : src, ok);
      g += step;
    }
  }

  // Whole tiles of 128-byte swizzle blocks, FlashAttention-2's thread layout:
  // 8 threads per 128-byte row segment, each copying its chunk of every
  // column block of kWideSweeps rows kWideRows apart. One pointer per row, the
  // column blocks as immediate offsets (global: 128 bytes, shared: one block),
  // and one swizzle per thread (its rows are equal mod 8).
  // NOTES: the pass layout above steps one pointer down the tile, a 64-bit
  // add per 16-byte copy (d256: 32 per K/V tile and thread, ~60 integer
  // instructions of the ~990 per warp and key tile; torch's FA2 ~24 in all, ncu).
  // (Only where every thread copies in the pass layout too: load() returns
  // early for the idle ones, and tid below is rebuilt from row and chunk.)
  static constexpr bool kWide = Tile::kAtom == 8 &&
                                Tile::kChunks >= 16 && kThreads % 8 == 0 &&
                                Tile::kRows % (kThreads / 8) == 0 &&
                                kRowsPerPass * Tile::kChunks == kThreads;
  static constexpr int kWideRows = kThreads / 8, kWideSweeps = Tile::kRows / (kThreads / 8);
  template <typename T>
  __device__ __forceinline__ void load_whole_wide(uint32_t dst, const T* src, int64_t row_stride) const {
    const int tid = row * Tile::kChunks + chunk;  // the constructor's thread index
    const int r0 = tid / 8, cc = tid % 8;
    const uint32_t d0 = dst + static_cast<uint32_t>((r0 * 8 + (cc ^ (r0 % 8))) * 16);
#pragma unroll
    for (int s = 0; s < kWideSweeps; ++s) {
      const T* g = src + static_cast<int64_t>(r0 + s * kWideRows) * row_stride + cc * 8;
#pragma unroll
      for (int b = 0; b < Tile::kChunks / 8; ++b)
        cp_async_16(d0 + (b * Tile::kRows + s * kWideRows) * 128, g + b * 64);
    }
  }

  // The reverse, for the output: rows/columns outside the bounds are not written.
  // NOTES: a whole tile (every query tile but a sequence's last) reads all its
  // chunks from shared memory first and then stores them, with no per-row
  // test: the per-row branch made each store wait for its own read in turn
  // (ncu, d256 1k: the epilogue was 6% of the warp samples for 1/16 of the work).
  template <typename T>
  __device__ __forceinline__ void store(T* dst, int64_t row_stride, const uint8_t* src_smem,
                                        int rows_valid, int cols_valid) const {
    if (!active || chunk * 8 >= cols_valid) return;
    if (kFastStores && rows_valid >= Tile::kRows) {
      uint4 v[kPasses];
#pragma unroll
      for (int i = 0; i < kPasses; ++i) v[i] = *reinterpret_cast<const uint4*>(src_smem + pass_offset(i));
      T* g = dst + row * row_stride + chunk * 8;
      const int64_t step = kRowsPerPass * row_stride;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        *reinterpret_cast<uint4*>(g) = v[i];
        g += step;
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      if (row + i * kRowsPerPass < rows_valid) {
        *reinterpret_cast<uint4*>(dst + (row + i * kRowsPerPass) * row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(src_smem + pass_offset(i));
      }
    }
  }
};

}  // namespace flashattn::cuda::sm80
