// Per-tile timeline of the Hopper forward's consumers, for finding where the
// cycles between key tiles go (docs/perf-notes.md). Compiled in only with
// -DFLASHATTN_SM90_TRACE=1 (scripts/build_sm90_fwd_variant.sh); otherwise the
// hooks are empty. Thread 0 of each consumer warpgroup stamps clock64() at
// the events below for the first kTraceTiles tiles of each CTA (the CTA's
// own SM clock: compare stamps within a CTA only); the host reads them with
// flashattn_sm90_fwd_trace_<D>() (bench/trace_sm90_fwd.py; head dims 128 and
// 256). The first-S and loop-end stamps are in the intra-warpgroup-overlap
// path only (the shipped one, tuning.h's kIntraWgOverlap); a tile primed by
// the previous one's last turn (kCrossTile) has no Q-ready or first-S stamp.
#pragma once

#include <cstdint>

#ifndef FLASHATTN_SM90_TRACE
#define FLASHATTN_SM90_TRACE 0
#endif

namespace flashattn::cuda::sm90 {

enum TraceEvent : int {
  kTraceTileStart,  // tile known (work_at), before waiting for its Q
  kTraceQReady,     // Q landed
  kTraceFirstS,     // the first key tile's S = Q K^T completed (prologue)
  kTraceLoopEnd,    // the last P V completed
  kTraceTileEnd,    // O and the logsumexp stored (issued)
  kTraceEvents
};
inline constexpr int kTraceCtas = 132, kTraceTiles = 32, kTraceWarpgroups = 2;

// The steady state: for one tile per CTA (kTraceStepTile, the CTA's fourth),
// stamps at each key tile of the overlapped loop (kernel.cuh), in order.
enum TraceStep : int {
  kStepTop,       // loop top: this key tile's K and the previous one's V requested
  kStepLoaded,    // both landed (full barriers)
  kStepTurn,      // ping-pong turn acquired
  kStepIssued,    // S = Q K^T and P V issued, turn handed over
  kStepSReady,    // S completed (wgmma wait 1)
  kStepSoftmax,   // online softmax done
  kStepPvReady,   // P V completed (wgmma wait 0)
  kStepEvents
};
inline constexpr int kTraceStepTile = 3, kTraceSteps = 32;

// kCrossTile's fused last turn of the same tile (kTraceStepTile), in order.
enum TraceFused : int {
  kFusedTop,       // the last loop step done
  kFusedLookedUp,  // the next tile looked up (next_tile)
  kFusedVReady,    // the last key tile's V landed
  kFusedQReady,    // the next tile's Q landed
  kFusedKReady,    // the next tile's first K landed
  kFusedIssued,    // last P V and the next S issued, turn handed over
  kFusedPvReady,   // the last P V completed
  kFusedPacked,    // epilogue: O / l packed for the store
  kFusedOStored,   // epilogue: O in shared memory and its TMA store issued
  kFusedFinished,  // epilogue done (logsumexp stored)
  kFusedSReady,    // the next tile's first S completed
  kFusedEvents
};

#if FLASHATTN_SM90_TRACE
// One array per translation unit (per head dim), [cta][tile][warpgroup][event].
static __device__ unsigned long long g_trace[kTraceCtas][kTraceTiles][kTraceWarpgroups][kTraceEvents];

__device__ __forceinline__ void trace(int tile, int wg, int tid, TraceEvent e) {
  if (tid == 0 && blockIdx.x < kTraceCtas && tile < kTraceTiles && wg < kTraceWarpgroups)
    g_trace[blockIdx.x][tile][wg][e] = clock64();
}
static __device__ unsigned long long g_steps[kTraceCtas][kTraceWarpgroups][kTraceSteps][kStepEvents];
static __device__ unsigned long long g_fused[kTraceCtas][kTraceWarpgroups][kFusedEvents];

__device__ __forceinline__ void trace_step(int tile, int wg, int tid, int step, TraceStep e) {
  if (tid == 0 && tile == kTraceStepTile && blockIdx.x < kTraceCtas && wg < kTraceWarpgroups &&
      step < kTraceSteps)
    g_steps[blockIdx.x][wg][step][e] = clock64();
}
__device__ __forceinline__ void trace_fused(int tile, int wg, int tid, TraceFused e) {
  if (tid == 0 && tile == kTraceStepTile && blockIdx.x < kTraceCtas && wg < kTraceWarpgroups)
    g_fused[blockIdx.x][wg][e] = clock64();
}
// Copies one stamp array to the host: 0, -1 if `bytes` is too small, else the cudaError_t.
template <typename Stamps>
int copy_stamps(void* host, size_t bytes, const Stamps& stamps) {
  if (bytes < sizeof(stamps)) return -1;
  return static_cast<int>(cudaMemcpyFromSymbol(host, stamps, sizeof(stamps)));
}
// Defines the host accessors of this translation unit's stamps.
#define FLASHATTN_SM90_TRACE_ACCESSOR(D)                                             \
  extern "C" int flashattn_sm90_fwd_trace_##D(void* host, size_t bytes) {            \
    return flashattn::cuda::sm90::copy_stamps(host, bytes, flashattn::cuda::sm90::g_trace); \
  }                                                                                  \
  extern "C" int flashattn_sm90_fwd_steps_##D(void* host, size_t bytes) {            \
    return flashattn::cuda::sm90::copy_stamps(host, bytes, flashattn::cuda::sm90::g_steps); \
  }                                                                                  \
  extern "C" int flashattn_sm90_fwd_fused_##D(void* host, size_t bytes) {            \
    return flashattn::cuda::sm90::copy_stamps(host, bytes, flashattn::cuda::sm90::g_fused); \
  }
#else
__device__ __forceinline__ void trace(int, int, int, TraceEvent) {}
__device__ __forceinline__ void trace_step(int, int, int, int, TraceStep) {}
__device__ __forceinline__ void trace_fused(int, int, int, TraceFused) {}
#define FLASHATTN_SM90_TRACE_ACCESSOR(D)
#endif

}  // namespace flashattn::cuda::sm90
