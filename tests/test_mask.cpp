#include <gtest/gtest.h>

#include "attention/mask.h"

namespace flashattn {
namespace {

// Brute force over every (window, sizes) the ranges and tile predicates must agree
// with visible().
// classify() and key_tiles() against brute force: a block is empty exactly
// when no (i, j) in it is visible, full when all are; the key-tile range
// holds every tile with a visible key and starts and ends on one.
TEST(MaskPolicy, TileClassesAndKeyTileRanges) {
  for (int sq : {1, 7, 13}) {
    for (int sk : {1, 9, 20}) {
      for (int left : {-1, 0, 3}) {
        for (int right : {-1, 0, 2}) {
          const MaskPolicy m{sq, sk, left, right};
          for (int bm : {1, 4}) {
            for (int bn : {1, 3, 8}) {
              for (int r0 = 0; r0 < sq; r0 += bm) {
                const int r1 = r0 + bm < sq ? r0 + bm : sq;
                const KeyTileRange tiles = m.key_tiles(r0, r1, bn);
                int first_seen = -1, last_seen = -1;
                for (int c0 = 0; c0 < sk; c0 += bn) {
                  const int c1 = c0 + bn < sk ? c0 + bn : sk;
                  int seen = 0;
                  for (int i = r0; i < r1; ++i)
                    for (int j = c0; j < c1; ++j) seen += m.visible(i, j) ? 1 : 0;
                  const TileClass want = seen == 0 ? TileClass::kEmpty
                                         : seen == (r1 - r0) * (c1 - c0) ? TileClass::kFull
                                                                         : TileClass::kPartial;
                  EXPECT_EQ(m.classify(r0, r1, c0, c1), want) << sq << " " << sk << " " << left << " "
                                                              << right << " " << r0 << " " << c0;
                  if (seen > 0) {
                    if (first_seen < 0) first_seen = c0 / bn;
                    last_seen = c0 / bn;
                  }
                }
                if (first_seen < 0) {
                  EXPECT_TRUE(tiles.empty());
                } else {
                  EXPECT_EQ(tiles.begin, first_seen);
                  EXPECT_EQ(tiles.end, last_seen + 1);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(MaskPolicy, RangesAgreeWithVisibility) {
  for (int sq : {1, 5, 9}) {
    for (int sk : {1, 4, 11}) {
      for (int left : {-1, 0, 2}) {
        for (int right : {-1, 0, 3}) {
          const MaskPolicy m{sq, sk, left, right};
          for (int i = 0; i < sq; ++i) {
            int seen = 0;
            for (int j = 0; j < sk; ++j) seen += m.visible(i, j) ? 1 : 0;
            EXPECT_EQ(m.keys_of_row(i), seen);
            for (int j = 0; j < sk; ++j) {
              if (m.visible(i, j)) {
                EXPECT_GE(j, m.key_begin(i));
                EXPECT_LT(j, m.key_end(i + 1));
                EXPECT_GE(i, m.query_begin(j));
                EXPECT_LT(i, m.query_end(j + 1));
              }
            }
          }
          for (int r0 = 0; r0 < sq; ++r0)
            for (int r1 = r0 + 1; r1 <= sq; ++r1)
              for (int c0 = 0; c0 < sk; ++c0)
                for (int c1 = c0 + 1; c1 <= sk; ++c1) {
                  bool all = true;
                  for (int i = r0; i < r1; ++i)
                    for (int j = c0; j < c1; ++j) all = all && m.visible(i, j);
                  EXPECT_EQ(m.tile_fully_visible(r0, r1, c0, c1), all);
                }
        }
      }
    }
  }
}

TEST(MaskPolicy, CausalIsBottomRightAligned) {
  const MaskPolicy m{2, 5, -1, 0};  // flash-attn >= 2.1: last query row sees every key
  EXPECT_TRUE(m.visible(1, 4));
  EXPECT_TRUE(m.visible(0, 3));
  EXPECT_FALSE(m.visible(0, 4));
  const MaskPolicy wide{5, 2, -1, 0};  // more queries than keys: first rows see nothing
  EXPECT_FALSE(wide.visible(0, 0));
  EXPECT_FALSE(wide.visible(2, 0));
  EXPECT_TRUE(wide.visible(3, 0));
  EXPECT_TRUE(wide.visible(4, 1));
}

}  // namespace
}  // namespace flashattn
