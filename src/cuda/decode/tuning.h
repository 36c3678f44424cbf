// Tuning of the split-KV decode kernels, one place, one reason each.
#pragma once

namespace flashattn::cuda::decode {

// Threads per CTA: four warps share one K/V tile, enough loads in flight per SM
// with two or more CTAs resident.
constexpr int kThreads = 128;
// Packed query rows (query positions x the query heads of one KV head) per CTA:
// GQA groups of up to 8 at seqlen_q 2 fit one tile, so K/V are read once per group.
constexpr int kMaxRows = 16;
// Shared memory a CTA's K/V ring may take: three 64-key stages at head dim 128
// (32 KiB each; two in flight while one is read), and two such CTAs per SM fit
// the 228 KiB of an H100 SM: ~136 KiB in flight per SM, several times what
// HBM latency (~1 us) x per-SM bandwidth (3 TB/s / 132 = 23 GB/s) asks for.
constexpr int kRingBytes = 102 * 1024;
// The ring on GPUs whose blocks may not take kRingBytes' ring (sm_86 / sm_89:
// RTX 30 / 40, A10, L4, L40 allow ~99 KiB a block and 100 KiB an SM) or whose
// SMs hold two CTAs of this one but one of that (the A100's 164 KiB; split.h's
// choose_ring): two 32 KiB stages at head dims 128 and 256, four 16 KiB ones at
// 64, so a CTA (ring + q) stays under 80 KiB. Reasoned, not measured (no such
// GPU here): those GPUs read less per SM than the H100, so one stage in flight
// per CTA covers their memory latency if it covers the H100's; on the H100
// this ring at two CTAs an SM read 0.94-1.02x the big one at d128
// (docs/inference.md).
constexpr int kSmallRingBytes = 68 * 1024;
// Pipeline depth bounds: at least double buffering; at most five stages, what
// head dim 64's 18 KiB stages of padded rows filled the ring with when this was
// measured (its 16 KiB stages since would fit six; the other buckets' 32 KiB
// stages fit three). Measured on the H100 (docs/performance.md 3.6): five
// stages at d64 against four read 1.15-1.27x at batch 64 x 4k-16k, 1.02 at
// 128 x 8k, level at batch 1-16.
constexpr int kMinStages = 2;
constexpr int kMaxStages = 5;
// The split heuristic aims at this many CTAs per SM, so memory latency is hidden
// by a second resident CTA (fewer where an SM's shared memory holds fewer
// rings: api.cu counts them per device).
constexpr int kCtasPerSm = 2;
// A split reads at least this many key tiles: fewer makes the combine's extra
// traffic (one partial O per split) and the split's start (Q load, pipeline
// fill) a visible fraction of the K/V read. Measured on the H100 with the
// parallel combine (docs/performance.md 3.6): at batch 1 x 4k keys 32 splits of
// 2 tiles read 1171 GB/s against 1082 for 16 of 4.
constexpr int kMinTilesPerSplit = 2;
// The split count takes the fewest splits whose tile steps (split.h) are
// within this factor of the best count's (more splits only add partials to combine).
constexpr double kWaveSlack = 0.95;
// Upper bound on splits (workspace and combine loop length).
constexpr int kMaxSplits = 64;
// A split of at most this many key tiles (contiguous caches) also has the tile
// after its ring's requested into the L2 (prefetch.global.L2). Reasoned: it
// shortens the ring's ramp, which only a short split feels, and costs a long
// stream extra L2 requests. Measured on the H100 (docs/performance.md 3.6), with this bound
// batch 1 x 16k (8 tiles a split) read 1.063x of the kernel without either
// L2 change and the other shapes 0.991-1.002x; with the prefetch in every split,
// 16 x 4k (32 tiles) read 0.96x and 64 x 16k (256 tiles) 0.97x of that kernel.
constexpr int kPrefetchMaxSplitTiles = 16;
// Splits whose partial O a combine thread loads before the merge weights are
// known (float4 registers): all of them for 32 splits at head dim 128 (four
// thread groups), so the O loads overlap the lse round trip.
constexpr int kCombinePrefetch = 8;

// How far (log2 units) a row's max may grow past the softmax's reference max
// before the warp rescales O (kernel.cuh, slice_softmax): P then stays below
// 2^8 = 256, far inside f32 and 16-bit P's range, while the rescale (32
// multiplies a thread at head dim 128 and one row tile) and the row max's
// shuffles are skipped once the maxima settle.
constexpr float kRescaleSlack = 8.0f;

// Query rows per sequence from which a KV-cache call on an sm_90 device runs
// the Hopper forward over the cache instead of these kernels (api.cu's route:
// chunked prefill). Reasoned, not measured: the forward's smallest query tile
// is 128 rows of one query head, so below 64 rows most of it is empty, and it
// reads a K/V tile once per query head where these kernels pack a GQA group's
// heads into one 16-row tile and read it once per group; from 64 rows on, the
// decode kernel re-reads K/V once per 16 packed rows (at 512 rows with GQA 4:
// 128 times) and reached 0.06-0.09x of the forward's TFLOP/s (issue 28).
constexpr int kForwardMinQueryRows = 64;

// Keys per K/V tile: 64 rows of up to 128 columns, 32 rows at head dim 256, so
// one stage of K and V is 32 KiB (a multiple of the 16-key mma slice).
constexpr int block_keys(int head_dim_bucket) { return head_dim_bucket > 128 ? 32 : 64; }

}  // namespace flashattn::cuda::decode
