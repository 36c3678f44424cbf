// The CUDA kernels' tile lists of a block mask (cuda/common/block_tiles.h),
// built on the host, against a pair-by-pair computation: for every list row
// and every (query tile, key tile) of a launch, the tile is listed exactly
// when one of its (row, key) pairs lies in a listed block, flagged full
// exactly when all of them do, and the backward's transpose holds the same
// pairs; the Hopper forward's tile schedule. Host code only: runs without a
// GPU (in any CUDA build).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/harness.h"
#include "common/suites.h"
#include "core/block_mask.h"
#include "cuda/common/block_sparse.cuh"
#include "cuda/common/block_tiles.h"

namespace flashattn::testing {
namespace {

using cuda::BlockWalk;
using cuda::HostTileLists;
using cuda::kFullTile;

// listed[(row * q_blocks + qb) * k_blocks + kb] from the validated lists.
std::vector<bool> listed_pairs(const BlockMaskView& m) {
  std::vector<bool> listed(static_cast<size_t>(m.batch) * m.heads * m.q_blocks * m.k_blocks, false);
  for (int b = 0; b < m.batch; ++b)
    for (int h = 0; h < m.heads; ++h)
      for (int qb = 0; qb < m.q_blocks; ++qb)
        for (const BlockList* l : {&m.partial, &m.full})
          for (int n = 0; n < l->count(b, h, qb); ++n)
            listed[((static_cast<size_t>(b) * m.heads + h) * m.q_blocks + qb) * m.k_blocks + l->index(b, h, qb, n)] =
                true;
  return listed;
}

// The expected entry of (list row, query tile qt, key tile nt): -1 when no
// pair is listed, else nt (or qt, `transposed`) with kFullTile when all are.
int32_t expected_entry(const BlockMaskView& m, const std::vector<bool>& listed, int row, int qt, int nt, int tile_m,
                       int tile_n, int seqlen_q, int seqlen_k, bool transposed) {
  int any = 0, all = 1;
  for (int i = qt * tile_m; i < std::min(seqlen_q, (qt + 1) * tile_m); ++i) {
    for (int j = nt * tile_n; j < std::min(seqlen_k, (nt + 1) * tile_n); ++j) {
      const bool on = listed[(static_cast<size_t>(row) * m.q_blocks + i / m.block_q) * m.k_blocks + j / m.block_k];
      any |= on;
      all &= on;
    }
  }
  if (!any) return -1;
  return (transposed ? qt : nt) | (all ? kFullTile : 0);
}

// One direction of the lists: per (list row, outer tile) the entries of the
// inner tiles whose expected(row, outer, inner) is not -1, ascending.
void expect_direction(const std::vector<int32_t>& start, const std::vector<int32_t>& entries, int rows, int outer,
                      int inner, const char* what, const std::function<int32_t(int, int, int)>& expected) {
  ASSERT_EQ(start.size(), static_cast<size_t>(rows) * outer + 1) << what;
  for (int row = 0; row < rows; ++row) {
    for (int o = 0; o < outer; ++o) {
      std::vector<int32_t> want;
      for (int i = 0; i < inner; ++i) {
        if (const int32_t e = expected(row, o, i); e >= 0) want.push_back(e);
      }
      const size_t r = static_cast<size_t>(row) * outer + o;
      const std::vector<int32_t> have(entries.begin() + start[r], entries.begin() + start[r + 1]);
      EXPECT_EQ(have, want) << what << " " << o << ", list row " << row;
    }
  }
}

void expect_lists(const Problem& problem, int tile_m, int tile_n) {
  AttentionParams p = problem.host_params();
  p.block_mask = BlockMaskView{};
  (void)problem.extras();
  ASSERT_EQ(apply_block_mask(&problem.block_mask, &p), FA_OK) << fa_last_error();
  HostTileLists got;
  ASSERT_EQ(build_tile_lists(p, tile_m, tile_n, BlockWalk::kBackward, &got), FA_OK) << fa_last_error();
  const BlockMaskView& m = p.block_mask;
  const std::vector<bool> listed = listed_pairs(m);
  const int q_tiles = (p.seqlen_q + tile_m - 1) / tile_m, k_tiles = (p.seqlen_k + tile_n - 1) / tile_n;
  const int rows = m.batch * m.heads;
  expect_direction(got.key_start, got.key_entries, rows, q_tiles, k_tiles, "key tiles of query tile",
                   [&](int row, int qt, int nt) {
                     return expected_entry(m, listed, row, qt, nt, tile_m, tile_n, p.seqlen_q, p.seqlen_k, false);
                   });
  expect_direction(got.query_start, got.query_entries, rows, k_tiles, q_tiles, "query tiles of key tile",
                   [&](int row, int nt, int qt) {
                     return expected_entry(m, listed, row, qt, nt, tile_m, tile_n, p.seqlen_q, p.seqlen_k, true);
                   });
}

// Random lists (shuffled, junk past each count) of every density and block
// shape of the suites, on the forward's and the backward's tile shapes.
TEST(BlockTiles, MatchPairByPairVisibility) {
  const std::vector<std::pair<int, int>> tiles = {{128, 64}, {64, 128}, {64, 64}, {128, 128}};
  const std::vector<std::pair<int, int>> blocks = {{128, 128}, {16, 48}, {7, 13}, {1, 3}, {64, 64}, {32, 16}};
  uint64_t seed = 7000;
  for (auto [sq, sk] : std::vector<std::pair<int, int>>{{113, 203}, {203, 113}, {1, 1}, {7, 7}, {256, 128}}) {
    for (auto [bq, bk] : blocks) {
      for (double density : {0.0, 0.1, 0.5, 1.0}) {
        Case c = make_case(FA_BF16, sq, sk, 64, seed++);
        c.heads_q = 2;
        c.heads_kv = 1;
        c.batch = 2;
        c.block_q = bq;
        c.block_k = bk;
        c.block_density = density;
        const Problem p = make_problem(c);
        for (auto [tm, tn] : tiles) {
          SCOPED_TRACE(c.name() + " tiles " + std::to_string(tm) + "x" + std::to_string(tn));
          expect_lists(p, tm, tn);
        }
      }
    }
  }
}

// The Hopper forward's schedule (tile_schedule): every query tile of the
// call exactly once, each CTA's steps contiguous from step 0 and heaviest
// first, and the CTAs' work balanced as longest-processing-time-first
// guarantees: the most loaded CTA holds at most the least loaded one's work
// plus one tile's.
TEST(BlockTiles, ScheduleTakesEveryTileOnceBalanced) {
  uint64_t seed = 7500;
  for (const int grid : {1, 7, 132}) {
    for (const double density : {0.1, 0.5}) {
      Case c = make_case(FA_BF16, 1000, 1500, 64, seed++);
      c.batch = 2;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.block_q = 128;
      c.block_k = 96;
      c.block_density = density;
      const Problem problem = make_problem(c);
      AttentionParams p = problem.host_params();
      (void)problem.extras();
      ASSERT_EQ(apply_block_mask(&problem.block_mask, &p), FA_OK) << fa_last_error();
      const int tile_m = 128, q_tiles = (p.seqlen_q + tile_m - 1) / tile_m;
      HostTileLists lists;
      ASSERT_EQ(build_tile_lists(p, tile_m, 128, BlockWalk::kForward, &lists), FA_OK) << fa_last_error();
      int steps = 0;
      const std::vector<int32_t> schedule = cuda::tile_schedule(p, lists, q_tiles, grid, &steps);
      SCOPED_TRACE(c.name() + " grid " + std::to_string(grid));
      ASSERT_EQ(schedule.size(), static_cast<size_t>(steps) * grid);
      const int tiles = p.batch * p.heads_q * q_tiles;
      const auto cost = [&](int32_t t) {
        const int bh = t / q_tiles, b = bh / p.heads_q, h = bh % p.heads_q;
        const int64_t r = cuda::BlockTiles::list_row(p.block_mask, b, h) * q_tiles + t % q_tiles;
        return lists.key_start[r + 1] - lists.key_start[r] + cuda::kScheduleTileCost;
      };
      std::vector<int> seen(static_cast<size_t>(tiles), 0);
      std::vector<int64_t> load(static_cast<size_t>(grid), 0);
      int64_t heaviest = 0;
      for (int cta = 0; cta < grid; ++cta) {
        bool ended = false;
        int64_t last = INT64_MAX;
        for (int s = 0; s < steps; ++s) {
          const int32_t t = schedule[static_cast<size_t>(s) * grid + cta];
          if (t < 0) {
            ended = true;
            continue;
          }
          ASSERT_FALSE(ended) << "a tile after the end of CTA " << cta << "'s walk";
          ASSERT_LT(t, tiles);
          ++seen[t];
          EXPECT_LE(cost(t), last) << "CTA " << cta << " step " << s;
          last = cost(t);
          load[cta] += cost(t);
          heaviest = std::max(heaviest, cost(t));
        }
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), tiles) << "every tile exactly once";
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      if (tiles >= grid) EXPECT_LE(*hi, *lo + heaviest);
    }
  }
}

}  // namespace
}  // namespace flashattn::testing
