// The host side of the CUDA kernels' block-sparse walk: a validated block
// mask (p.block_mask, host lists) restated on one launch's tile grid
// (block_sparse.cuh) and copied to device memory on p.stream.
//
// NOTES: the lists are the caller's host memory (validated in
// core/block_mask.cpp, where every index is read anyway), so the tile lists
// are built here on the host and copied with one cudaMemcpyAsync from
// pageable memory (staged by the driver: no wait on the stream's earlier
// work); the last few are kept on the device and reused when a call brings
// the same lists for the same launch. A CUDA graph cannot capture the copy (it
// would replay a host buffer freed after the call): under capture a launch
// takes the kept lists of an earlier call (graph warm-up) and pins them for
// the process's lifetime, since the graph replays their address; without
// them it is refused.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/params.h"
#include "cuda/common/block_sparse.cuh"

namespace flashattn::cuda {

// Which lists a launch walks: the forward per query tile; the backward per
// key tile (and per query tile for the deterministic dQ order); kGroupSteps,
// the Hopper backward's, per (sequence, kv head, key tile) the (query head of
// the group, query tile) steps (inside the element mask for fixed lengths;
// varlen calls ordered by query tile, cut by the kernel), those listed in part
// flagged (kStepPartial, tested per pair against the bit table).
enum class BlockWalk { kForward, kBackward, kGroupSteps };

// One launch's tile lists on the host (block_sparse.cuh, TileList): per
// (list row, query tile) the key tiles holding a listed pair, ascending, full
// ones flagged kFullTile; for the backward also the transpose, per (list row,
// key tile) the query tiles.
struct HostTileLists {
  std::vector<int32_t> key_start{0}, key_entries;
  std::vector<int32_t> query_start, query_entries;  // kBackward only
};

// The lists of p's block mask for tiles of tile_m query rows x tile_n keys
// (FA_ERROR_UNSUPPORTED past 2^31 entries).
fa_status build_tile_lists(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, HostTileLists* out);

// The schedule of `grid` persistent CTAs over the call's batch x heads_q x
// q_tiles query tiles (TileSchedule's layout: [steps][grid], -1 past a CTA's
// last tile), balancing each CTA's work: a query tile's listed key tiles plus
// kScheduleTileCost, each CTA's tiles heaviest first.
// kScheduleTileCost: a tile's Q load and epilogue, in key tiles (the Hopper
// forward's traced tile boundary at d 128 took ~6.0k cycles against a 3.5k
// key-tile period, docs/performance.md section 4).
inline constexpr int64_t kScheduleTileCost = 2;
std::vector<int32_t> tile_schedule(const AttentionParams& p, const HostTileLists& lists, int q_tiles, int grid,
                                   int* steps);

// The device copy of one launch's BlockTiles: one kept from an earlier call
// with the same mask and launch (block_tiles.cu, TileCache), or built now.
class BlockTileBuffer {
 public:
  BlockTileBuffer() = default;
  BlockTileBuffer(const BlockTileBuffer&) = delete;
  BlockTileBuffer& operator=(const BlockTileBuffer&) = delete;
  ~BlockTileBuffer();

  // Builds and uploads the lists of p's block mask for tiles of tile_m query
  // rows x tile_n keys; no-op without a block mask (view() stays null). With
  // grid > 0 (kForward), also the tile schedule of `grid` persistent CTAs.
  fa_status build(const AttentionParams& p, int tile_m, int tile_n, BlockWalk walk, int grid = 0);
  const BlockTiles& view() const { return view_; }

 private:
  BlockTiles view_;
  std::shared_ptr<void> cached_;  // a kept buffer (reused by later calls with the same mask)
  void* device_ = nullptr;        // a buffer of this call only
  cudaStream_t stream_ = nullptr;
};

}  // namespace flashattn::cuda
