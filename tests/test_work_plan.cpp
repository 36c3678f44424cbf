// The Hopper forward kernel's tile order (src/attention/work_plan.h), on the
// CPU: every query tile of every (batch, head) pair is dealt exactly once, the
// groups are as planned, and ranks fall in cost within a group; and the
// deterministic backward's dQ turn order for rotated walks.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention/work_plan.h"

namespace flashattn {
namespace {

// Every key tile in exactly one split, splits contiguous and in order, sizes
// within one of each other.
TEST(KeySplit, CoversEveryTileOnceEvenly) {
  for (int tiles : {1, 2, 7, 64, 1000}) {
    for (int splits : {1, 2, 3, 7, 64}) {
      if (splits > tiles) continue;
      const KeySplit ks{tiles, splits};
      EXPECT_EQ(ks.begin(0), 0);
      EXPECT_EQ(ks.end(splits - 1), tiles);
      int lo = tiles, hi = 0;
      for (int s = 0; s < splits; ++s) {
        if (s > 0) EXPECT_EQ(ks.begin(s), ks.end(s - 1));
        const int n = ks.end(s) - ks.begin(s);
        EXPECT_GE(n, 1);
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
      }
      EXPECT_LE(hi - lo, 1) << tiles << " tiles in " << splits;
    }
  }
}

struct Shape {
  int num_m_blocks, num_bh, grid;
  double l2_fit;
  bool masked;
};

// The protocol's shapes on 132 SMs (16k tokens, hidden 2048, 128-row tiles,
// half of a 50 MB L2 over 4 * seqlen * d bytes of K/V per head) and odd ones:
// fewer tiles than CTAs, a fit below one head, remainders of every size.
std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (int d : {64, 128, 256}) {
    for (int s = 512; s <= 16384; s *= 2) {
      const int m = s / 128, bh = (16384 / s) * (2048 / d);
      const double fit = (25.0 * (1 << 20)) / (4.0 * s * d);
      v.push_back({m, bh, 132, fit, false});
      v.push_back({m, bh, 132, fit, true});
    }
  }
  for (int bh : {1, 2, 3, 7, 17, 33, 100}) {
    for (int m : {1, 3, 8, 65}) {
      for (double fit : {0.5, 2.0, 5.0, 1e9}) {
        const int grid = m * bh < 132 ? m * bh : 132;
        v.push_back({m, bh, grid, fit, false});
        v.push_back({m, bh, grid, fit, true});
      }
    }
  }
  return v;
}

TEST(Sm90Schedule, EveryTileOnceAndHeaviestFirstWithinAGroup) {
  for (const TileOrderPolicy policy :
       {TileOrderPolicy{false, false, false}, TileOrderPolicy{true, false, false},
        TileOrderPolicy{true, true, false}, TileOrderPolicy{true, false, true},
        TileOrderPolicy{true, true, true}}) {
    for (const Shape& s : shapes()) {
      const TileOrder o = plan_tile_order(s.num_m_blocks, s.num_bh, s.grid, s.l2_fit, s.masked, policy);
      SCOPED_TRACE(testing::Message() << "m " << s.num_m_blocks << " bh " << s.num_bh << " grid "
                                      << s.grid << " fit " << s.l2_fit << " masked " << s.masked
                                      << " groups " << o.group_heads << " +1 x" << o.group_extra);
      ASSERT_EQ(o.num_tiles, s.num_m_blocks * s.num_bh);
      ASSERT_GE(o.group_heads, 1);
      ASSERT_LE(o.group_extra * (o.group_heads + 1), s.num_bh);
      ASSERT_EQ(o.paired, policy.causal_pairs && s.num_m_blocks >= 2 ? 1 : 0);
      // The kernel's walk: CTA c takes rank_of(o, round, grid, c) for each of
      // num_rounds rounds while it is below num_ranks (mb = -1: nothing).
      std::vector<int> seen(o.num_tiles, 0);
      for (int c = 0; c < s.grid; ++c) {
        int pair_bh = -1, pair_mb = -1;
        for (int round = 0; round < o.num_rounds; ++round) {
          const int t = rank_of(o, round, s.grid, c);
          if (t >= o.num_ranks) continue;
          int bh = -1, mb = -1;
          tile_of_rank(o, s.num_bh, t, bh, mb);
          ASSERT_GE(bh, 0);
          ASSERT_LT(bh, s.num_bh);
          ASSERT_GE(mb, o.paired ? -1 : 0);
          ASSERT_LT(mb, s.num_m_blocks);
          if (o.paired && round % 2 == 0) {
            pair_bh = bh;
            pair_mb = mb;
          } else if (o.paired) {
            // The second half: the same head, the complementary query tile.
            ASSERT_EQ(bh, pair_bh);
            ASSERT_TRUE(mb == -1 ? 2 * pair_mb == s.num_m_blocks - 1 : mb + pair_mb == s.num_m_blocks - 1);
          }
          if (mb >= 0) ++seen[bh * s.num_m_blocks + mb];
        }
      }
      for (int i = 0; i < o.num_tiles; ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
      if (o.paired) continue;
      // Within a group (consecutive ranks over the same pairs) the query tile
      // never rises: the heaviest causal tiles come first.
      int prev_bh = -1, prev_mb = 0, group_first_bh = -1;
      for (int t = 0; t < o.num_ranks; ++t) {
        int bh, mb;
        tile_of_rank(o, s.num_bh, t, bh, mb);
        const bool new_group = bh > prev_bh && mb == s.num_m_blocks - 1 && (t == 0 || prev_mb == 0);
        if (new_group) group_first_bh = bh;
        if (t > 0 && !new_group) ASSERT_LE(mb, prev_mb) << "rank " << t;
        ASSERT_GE(bh, group_first_bh);
        prev_bh = bh;
        prev_mb = mb;
      }
    }
  }
}

// The plan's group sizes for (query tiles per head, pairs, L2 fit), causal, on 132 CTAs.
void expect_causal_groups(int num_m_blocks, int num_bh, double l2_fit, bool balanced, int heads,
                          int extra) {
  const TileOrder o = plan_tile_order(num_m_blocks, num_bh, 132, l2_fit, true, {balanced, false, false});
  EXPECT_EQ(o.group_heads, heads) << "m " << num_m_blocks << " bh " << num_bh;
  EXPECT_EQ(o.group_extra, extra) << "m " << num_m_blocks << " bh " << num_bh;
}

TEST(Sm90Schedule, BalancedGroupsDifferByAtMostOneAndSpanTwoRounds) {
  // hdim 128, 4k, causal: 64 pairs, 12 fit, 32 tiles per head: 6 groups of
  // 10-11 rather than 5 of 12 and one of 4.
  expect_causal_groups(32, 64, 12.5, true, 10, 4);
  expect_causal_groups(32, 64, 12.5, false, 12, 0);
  // hdim 256, 1k, causal: 128 pairs, 8 tiles each, two rounds need 33 pairs:
  // four equal groups of 32 would span under two rounds, and the remainder
  // (29) is over two thirds of a group: 33s and a rest.
  expect_causal_groups(8, 128, 25.0, true, 33, 0);
  // hdim 256, 4k, causal: 32 pairs, two rounds need 9, the remainder 5 of a
  // 9-group is under two thirds: three groups of 10-11; 8k: 16 pairs in
  // groups of 5, remainder 1: three groups of 5-6.
  expect_causal_groups(32, 32, 6.25, true, 10, 2);
  expect_causal_groups(64, 16, 3.1, true, 5, 1);
  TileOrder o;
  // Every balanced plan keeps each group at two rounds or more.
  for (const Shape& s : shapes()) {
    if (s.masked) {
      o = plan_tile_order(s.num_m_blocks, s.num_bh, s.grid, s.l2_fit, true, {true, false, false});
      if (o.group_extra > 0 || s.num_bh % o.group_heads == 0) {
        const int smallest = o.group_heads < s.num_bh ? o.group_heads : s.num_bh;
        EXPECT_TRUE(smallest * s.num_m_blocks >= 2 * s.grid || smallest == s.num_bh)
            << "m " << s.num_m_blocks << " bh " << s.num_bh;
      }
    }
  }
}

// Head-major ranks: consecutive ranks walk one head's query tiles (or causal
// pairs), heaviest first, then the next head's; masked runs without pairs
// keep the snake's groups.
TEST(Sm90Schedule, HeadMajorWalksOneHeadAtATime) {
  const TileOrderPolicy policy{true, false, true};
  // hdim 256, 2k: 16 query tiles per head, 64 heads, 132 CTAs; and 16k.
  for (int m : {16, 128}) {
    const int bh_count = 1024 / m;
    const TileOrder o = plan_tile_order(m, bh_count, 132, 12.5, false, policy);
    ASSERT_EQ(o.head_major, 1);
    for (int t = 0; t < o.num_ranks; ++t) {
      int bh, mb;
      tile_of_rank(o, bh_count, t, bh, mb);
      EXPECT_EQ(bh, t / m);
      EXPECT_EQ(mb, m - 1 - t % m);
    }
  }
  EXPECT_EQ(plan_tile_order(16, 64, 132, 12.5, true, policy).head_major, 0);
  EXPECT_EQ(plan_tile_order(16, 64, 132, 12.5, false, {true, false, false}).head_major, 0);
  // Causal pairs, head-major: pair k of head h is ranks 2 * (h * 8 + k) and
  // 2 * (h * 8 + k) + 1 (query tiles 15 - k and k).
  const TileOrder o = plan_tile_order(16, 64, 132, 12.5, true, {true, true, true});
  ASSERT_EQ(o.paired, 1);
  ASSERT_EQ(o.head_major, 1);
  for (int t = 0; t < o.num_ranks; ++t) {
    int bh, mb;
    tile_of_rank(o, 64, t, bh, mb);
    EXPECT_EQ(bh, (t / 2) / 8);
    EXPECT_EQ(mb, t % 2 == 0 ? 15 - (t / 2) % 8 : (t / 2) % 8);
  }
}

// The split tail: every key tile of every tail tile is walked by exactly one
// CTA, each CTA's chunk differs from the others by at most one key tile, a
// tail tile's parts are numbered 0 .. parts-1 in key order and agree on
// `parts`, and no tile is cut over more than max_parts CTAs.
TEST(Sm90Schedule, SplitTailCoversEveryKeyTileOnce) {
  int split_plans = 0;
  for (int grid : {1, 5, 8, 132}) {
    for (int tiles : {1, 7, 12, 131, 133, 160, 1024, 2048, 2112}) {
      for (int key_tiles : {1, 2, 3, 8, 13, 26, 128}) {
        const SplitTail s = plan_split_tail(tiles, grid, key_tiles, true);
        EXPECT_EQ(plan_split_tail(tiles, grid, key_tiles, false).tiles, 0);
        if (s.tiles == 0) {
          EXPECT_TRUE(tiles <= grid || tiles % grid == 0 || (tiles % grid) * key_tiles < kMinSplitChunk * grid);
          continue;
        }
        ++split_plans;
        EXPECT_EQ(s.first_rank + s.tiles, tiles);
        EXPECT_EQ(s.first_rank % grid, 0);
        std::vector<int> seen(static_cast<size_t>(s.tiles) * key_tiles, 0);
        std::vector<int> parts(s.tiles, -1), next_part(s.tiles, 0), next_key(s.tiles, 0);
        int min_chunk = 1 << 30, max_chunk = 0;
        for (int c = 0; c < grid; ++c) {
          int chunk = 0;
          SplitSegment seg;
          for (int k = 0; split_segment(s, grid, c, k, seg); ++k) {
            ASSERT_GE(seg.tile, 0);
            ASSERT_LT(seg.tile, s.tiles);
            ASSERT_LT(seg.key_lo, seg.key_hi);
            EXPECT_LE(seg.parts, s.max_parts);
            if (parts[seg.tile] < 0) parts[seg.tile] = seg.parts;
            EXPECT_EQ(parts[seg.tile], seg.parts);
            EXPECT_EQ(seg.part, next_part[seg.tile]++);  // CTAs in order, one part each
            EXPECT_EQ(seg.key_lo, next_key[seg.tile]);   // parts in key order, no gap
            next_key[seg.tile] = seg.key_hi;
            for (int kt = seg.key_lo; kt < seg.key_hi; ++kt) ++seen[seg.tile * key_tiles + kt];
            chunk += seg.key_hi - seg.key_lo;
          }
          min_chunk = std::min(min_chunk, chunk);
          max_chunk = std::max(max_chunk, chunk);
        }
        EXPECT_LE(max_chunk - min_chunk, 1);
        EXPECT_GE(min_chunk, kMinSplitChunk - 1);
        for (int v : seen) EXPECT_EQ(v, 1);
        for (int i = 0; i < s.tiles; ++i) EXPECT_EQ(next_part[i], parts[i]);
      }
    }
  }
  EXPECT_GT(split_plans, 20);
}

// Every query tile's adds form one chain through all n key tiles, in the
// order the rotated walks meet the tile (by step, then the highest key tile
// first), and a key tile's predecessor met the tile no later than it did.
TEST(DqTurns, RotatedTurnsChainEveryKeyTileInTheOrderTheWalksMeetTheTile) {
  for (int n = 1; n <= 40; ++n) {
    for (int n_m = 1; n_m <= 40; ++n_m) {
      for (int m = 0; m < n_m; ++m) {
        auto step = [&](int k) { return ((m - k) % n_m + n_m) % n_m; };
        std::vector<int> order(n);
        for (int k = 0; k < n; ++k) order[k] = k;
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return step(a) != step(b) ? step(a) < step(b) : a > b;
        });
        for (int i = 0; i < n; ++i) {
          const int k = order[i];
          const DqTurn turn = rotated_dq_turn(k, k % n_m, n, n_m);
          const int before = step(k) >= turn.from_step ? turn.before : -1;
          ASSERT_EQ(before, i == 0 ? -1 : order[i - 1]) << "n " << n << " n_m " << n_m << " m " << m << " k " << k;
          if (before >= 0) {
            EXPECT_LE(step(before), step(k));
            if (step(before) == step(k)) EXPECT_GT(before, k);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashattn
