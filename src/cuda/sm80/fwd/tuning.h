// Every tuning choice of the sm80 forward kernel, per head dim, in one place.
//
//   kBlockM   query rows per CTA; kWarps warps split them, kBlockM / kWarps
//             rows each (16 or 32: one or two m16 tiles per warp; two let a
//             K/V fragment read from shared memory feed two mma's).
//   kBlockN   keys per K/V tile.
//   kStages   K/V tiles in flight. 1: K and V load separately, the next K
//             during P V and V during Q K^T (FlashAttention-2's overlap, two
//             barriers per tile, least shared memory). >= 2: K and V load
//             together kStages - 1 tiles ahead, one barrier per tile.
//   kQInRegs  keep the Q fragments in registers for the whole K/V loop
//             instead of re-reading them from shared memory every tile.
//   kFastWholeTiles  K/V tiles wholly in bounds load without per-chunk bound
//             tests (a second copy loop: fewer instructions per tile, more
//             code and registers; d 64 and d 128 spill with it).
//   kMinBlocksPerSm  __launch_bounds__ occupancy hint: caps registers so that
//             many CTAs fit on an SM (65536 registers / SM).
// Shared memory = (kBlockM + 2 * kStages * kBlockN) * head_dim * 2 bytes; it
// must stay under the 163 KB an sm_80 CTA can have (H100: 227 KB).
#pragma once

namespace flashattn::cuda::sm80 {

// How a kernel reaches the NaN/Inf rules' fix after its tile's store
// (common/nonfinite.cuh, docs/hardening.md): the out-of-line call
// (fix_nonfinite_tile), or the same recompute inlined as one flat loop
// (flat_fix.cuh) where the K/V loop has no register to spare.
enum class NonfiniteFix { kCall, kFlatInline };

// The epilogue stores O through shared memory with one swizzle per lane and
// copies whole query tiles out without per-row tests (the epilogue was 6% of
// warp samples at d256 1k before).
inline constexpr bool kFastStores = true;

// One tile shape. Defaults: 4 warps, 2 CTAs per SM (every shape sits at
// 190..255 registers with no spills), Q re-read from shared memory per tile,
// bounds-
// checked K/V copies, no pair split. The measurements behind each choice are in
// docs/performance.md (3.2).
template <int BlockM, int BlockN, int Stages, bool QInRegs = false, bool FastWholeTiles = false,
          bool PairSplit = false>
struct Sm80Tile {
  static constexpr int kBlockM = BlockM, kBlockN = BlockN, kWarps = 4, kStages = Stages;
  static constexpr bool kQInRegs = QInRegs;
  static constexpr bool kFastWholeTiles = FastWholeTiles;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr bool kPairSplit = PairSplit;
  static constexpr NonfiniteFix kNonfiniteFix = NonfiniteFix::kCall;
};

template <int HeadDim>
struct ForwardTuning;

// d32: d64's shape with Q in registers (16 registers at d32); N = 128 spills in
// the sm_80 build. 32 KB.
template <>
struct ForwardTuning<32> : Sm80Tile<128, 64, 2, true> {};

// d64: FA2's tile, 4 warps x 32 rows, N = 128 (half the per-tile barriers of
// N = 64), two stages with one barrier per tile: +11..17% over 128x64. 80 KB.
template <>
struct ForwardTuning<64> : Sm80Tile<128, 128, 2> {};

// d96: 16 rows per warp, N = 128, one stage (not re-measured). 60 KB.
template <>
struct ForwardTuning<96> : Sm80Tile<64, 128, 1> {};

// d128: FA2's shape, 4 warps x 32 rows (each K/V fragment feeds 2 mma's), N =
// 64, two stages: +3..15% over one stage. 96 KB. The NaN/Inf fix inlined as
// one flat loop (flat_fix.cuh): the call spilled 156 bytes in the K/V loop
// (sm_90a, 255 registers) and ran at 0.89-0.91 of the kernel without a fix,
// the flat loop spills none and runs 1.5-2.8% below it (H100, docs/hardening.md).
template <>
struct ForwardTuning<128> : Sm80Tile<128, 64, 2> {
  static constexpr NonfiniteFix kNonfiniteFix = NonfiniteFix::kFlatInline;
};

// d192: 16 rows per warp (O = 96 registers), 72 KB: two CTAs of 4 warps beat
// one of 8.
template <>
struct ForwardTuning<192> : Sm80Tile<64, 64, 1> {};

// d256: as d192 (O = 128 registers), whole K/V tiles copied without bounds
// tests in FA2's thread layout (+1.4..3.8%), and two warps per 32 rows each
// keeping half the keys of S and half the columns of O (kPairSplit: 28% fewer
// shared-memory bytes, +2..8%). 106.5 KB.
template <>
struct ForwardTuning<256> : Sm80Tile<64, 64, 1, false, true, true> {};

// With dropout: the tile's keep bits and the Philox rounds (dropout.cuh) need
// registers on top of S and O. The shapes above that sit at 255 registers
// spilled with them (sm_90a build, -Xptxas -v): d 64 and d 128 by 8..24 bytes
// at 128 x 64, 128 x 32, 64 x 128 (two m16 tiles per warp, or 16 n8 tiles);
// 64 x 64 (one m16 tile per warp) holds both without spills (201 / 243
// registers). d 256 spilled 8 bytes at 64 x 64 and takes 32-key tiles. FA2
// also runs dropout on narrower tiles. The rest keep their shape (d 96's
// 64 x 128 spills 4 bytes in the sm_80 build, none in sm_90a).
template <int HeadDim>
struct DropoutTuning : ForwardTuning<HeadDim> {};
template <>
struct DropoutTuning<64> : Sm80Tile<64, 64, 2> {};
template <>
struct DropoutTuning<128> : Sm80Tile<64, 64, 2> {};
template <>
struct DropoutTuning<256> : Sm80Tile<64, 32, 1, false, true, true> {};

// With a block mask (ListedKeys, key_walk.cuh): the masked body of a tile the
// mask cuts reads a listed-bits word per row on top of the element mask. At
// the dense shapes d 128 (128 x 64) spilled 112 bytes and d 64 (128 x 128) 20
// bytes (sm_90a; 248 at d 128 on sm_80). d 128 takes 128 x 32, one stage (the
// S tile halved; no spill on sm_80 or sm_90a): 1.949 ms at density 1 against
// 2.138 for 64 x 64 (two stages), 2.596 for 64 x 128 and 3.170 for 64 x 64
// with three stages (the last two hold one CTA per SM); 128 x 32 with two or
// three stages spilled 8 bytes (sm_90a / sm_80). H100,
// bench/probes/block_sparse_cuda.py, docs/variants.md. d 64 takes 64 x 128
// (one m16 tile per warp; not measured against others). The rest keep their
// shape.
template <int HeadDim>
struct BlockSparseTuning : ForwardTuning<HeadDim> {};
template <>
struct BlockSparseTuning<64> : Sm80Tile<64, 128, 2> {};
template <>
struct BlockSparseTuning<128> : Sm80Tile<128, 32, 1> {};

// A block mask with dropout: DropoutTuning's shapes, but d 96's 64 x 128
// (one stage) spilled 4 bytes with both (sm_80 and sm_90a): 64 x 64.
template <int HeadDim>
struct BlockSparseDropoutTuning : DropoutTuning<HeadDim> {};
template <>
struct BlockSparseDropoutTuning<96> : Sm80Tile<64, 64, 1> {};

// Warp layout of a tile shape: with kPairSplit, warps 2i and 2i+1 share a
// block of rows; each keeps S for its half of the keys and O for its half of
// the head dim, so P and the row maxima (and, at the end, the row sums) cross
// between the two through shared memory (mainloop.cuh, softmax.cuh).
template <class Cfg>
struct PairSplit {
  static constexpr int kWarpsPerRows = Cfg::kPairSplit ? 2 : 1;
  static constexpr int kWarpRows = Cfg::kBlockM * kWarpsPerRows / Cfg::kWarps;
  // One warp's P: kWarpRows rows of kBlockN / 2 16-bit values plus 16 bytes,
  // so rows start 20 banks apart: the 8 rows of a fragment store (4 bytes per
  // lane) or of an ldmatrix read (16 bytes per row) hit distinct banks.
  static constexpr int kPRowBytes = Cfg::kBlockN + 16;
  static constexpr int kPBytes = Cfg::kPairSplit ? kWarpRows * kPRowBytes : 0;
  static constexpr int kRowValueBytes = Cfg::kPairSplit ? kWarpRows * 4 : 0;  // a float per row
  static constexpr int kSmemBytes = Cfg::kWarps * (kPBytes + kRowValueBytes);
};

template <class Cfg>
constexpr int forward_smem_bytes(int head_dim) {
  return (Cfg::kBlockM + 2 * Cfg::kStages * Cfg::kBlockN) * head_dim * 2 + PairSplit<Cfg>::kSmemBytes;
}

// Every shape must run on sm_80 too (163 KB of shared memory per CTA).
constexpr int kSm80MaxSmem = 163 * 1024;
static_assert(forward_smem_bytes<ForwardTuning<32>>(32) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<64>>(64) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<96>>(96) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<128>>(128) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<192>>(192) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<ForwardTuning<256>>(256) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<DropoutTuning<256>>(256) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<BlockSparseTuning<64>>(64) <= kSm80MaxSmem, "smem");
static_assert(forward_smem_bytes<BlockSparseTuning<128>>(128) <= kSm80MaxSmem, "smem");

}  // namespace flashattn::cuda::sm80
