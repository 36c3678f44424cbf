// The split-KV heuristic (src/cuda/decode/split.h) and the ring's chunk layout
// (src/cuda/decode/ring_layout.h): host arithmetic, tested on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/decode/ring_layout.h"
#include "cuda/decode/split.h"

namespace flashattn::cuda::decode {
namespace {

constexpr int kSms = 132;
constexpr int kKeys = 64;  // keys per tile at head dim 128

SplitShape shape(int batch, int heads_kv, int max_keys, int forced = 0, int sms = kSms) {
  return {batch, heads_kv, 1, max_keys, kKeys, sms, forced};
}

TEST(DecodeSplits, ACallThatFillsTheGpuIsNotSplit) {
  EXPECT_EQ(choose_splits(shape(64, 8, 16384)), 1);    // 512 CTAs
  EXPECT_EQ(choose_splits(shape(128, 8, 8192)), 1);
  EXPECT_EQ(choose_splits({16, 8, 3, 16384, kKeys, kSms, 0}), 1);  // 384 CTAs from query tiles
}

TEST(DecodeSplits, FewCtasSplitIntoWholeWaves) {
  // batch 1, 8 KV heads, 256k keys: 8 CTAs -> 32 splits, 256 of the 264 = 2 x 132 slots.
  EXPECT_EQ(choose_splits(shape(1, 8, 262144)), 32);
  // batch 16 x 8 heads = 128 CTAs: 2 splits (one wave of 256), not 3 (a wave and a half).
  EXPECT_EQ(choose_splits(shape(16, 8, 16384)), 2);
  // batch 1 x 64k: 32 splits of 32 tiles, not 31 (one wave too, but of 34-tile splits).
  EXPECT_EQ(choose_splits(shape(1, 8, 65536)), 32);
  EXPECT_EQ(choose_splits(shape(1, 8, 16384)), 32);
  for (int batch : {1, 2, 4, 8, 16, 32}) {
    // Within 10% of a perfect balance: every slot busy for ctas * tiles / slots tile steps.
    const int tiles = 65536 / kKeys, slots = kCtasPerSm * kSms;
    const int s = choose_splits(shape(batch, 8, 65536));
    const double ideal = static_cast<double>(batch) * 8 * tiles / slots;
    EXPECT_LE(split_steps(batch * 8, s, tiles, slots), ideal / 0.9) << batch;
    EXPECT_LE(s, kMaxSplits);
  }
}

TEST(DecodeSplits, SlotsFollowTheCtasAnSmHolds) {
  // 84 SMs holding one ring each (sm_86 / sm_89: ~100 KiB of shared memory an
  // SM) or two: batch 1 x 8 heads x 16k keys splits into one wave of either,
  // 10 ways (80 of 84 slots) or 20 (160 of 168); batch 16 (128 CTAs) already
  // fills the 84 slots.
  SplitShape one = {1, 8, 1, 16384, kKeys, 84, 0, 1};
  SplitShape two = one;
  two.ctas_per_sm = 2;
  EXPECT_EQ(choose_splits(one), 10);
  EXPECT_EQ(choose_splits(two), 20);
  one.batch = 16;
  EXPECT_EQ(choose_splits(one), 1);
}

TEST(DecodeSplits, TheRingFollowsTheDevicesSharedMemory) {
  // d128's CTAs (common.cuh's Ring): three or two 34 KiB stages (2 x 64 keys x 136
  // elements x 2 bytes) and 16 packed q rows of 136 elements.
  constexpr int kStage = 2 * 64 * 136 * 2, kQ = 16 * 136 * 2;
  constexpr int kBig = 3 * kStage + kQ, kSmall = 2 * kStage + kQ;
  // H100: 227 KiB a block, 228 KiB an SM: two of either, so the big ring.
  RingChoice c = choose_ring(232448, 233472, 1024, kBig, kSmall, false);
  EXPECT_FALSE(c.small);
  EXPECT_EQ(c.ctas_per_sm, 2);
  // A100: 163 KiB a block, 164 KiB an SM: one big-ring CTA, two small-ring ones.
  c = choose_ring(166912, 167936, 1024, kBig, kSmall, false);
  EXPECT_TRUE(c.small);
  EXPECT_EQ(c.ctas_per_sm, 2);
  // sm_86 / sm_89: 99 KiB a block, 100 KiB an SM: the big ring does not fit a block.
  c = choose_ring(101376, 102400, 1024, kBig, kSmall, false);
  EXPECT_TRUE(c.small);
  EXPECT_EQ(c.ctas_per_sm, 1);
  // The test switch, on an H100.
  c = choose_ring(232448, 233472, 1024, kBig, kSmall, true);
  EXPECT_TRUE(c.small);
  EXPECT_EQ(c.ctas_per_sm, 2);
  EXPECT_EQ(ctas_per_sm(0, 1024, kBig), 1);  // an attribute the driver did not give
}

TEST(DecodeSplits, StepsCountWavesTimesTheLongestSplit) {
  EXPECT_EQ(split_steps(8, 32, 1024, 264), 32);   // 256 CTAs: one wave of 32 tiles
  EXPECT_EQ(split_steps(8, 31, 1024, 264), 34);   // one wave, splits of ceil(1024 / 31)
  EXPECT_EQ(split_steps(128, 3, 64, 264), 44);    // 384 CTAs: two waves of 22 tiles
  EXPECT_EQ(split_steps(128, 2, 64, 264), 32);
  EXPECT_EQ(split_steps(1, 1, 1, 264), 1);
}

TEST(DecodeSplits, PiecesKeepAMinimumLength) {
  // 1000 keys = 16 tiles: at most 8 pieces of 2 tiles; 4096 keys: 32 pieces.
  EXPECT_EQ(choose_splits(shape(1, 8, 1000)), 16 / kMinTilesPerSplit);
  EXPECT_EQ(choose_splits(shape(1, 8, 4096)), 64 / kMinTilesPerSplit);
  EXPECT_EQ(choose_splits(shape(1, 8, 64)), 1);
  EXPECT_EQ(choose_splits(shape(1, 8, 0)), 1);
}

TEST(DecodeSplits, ACallerCanForceTheCountWithinTheTiles) {
  EXPECT_EQ(choose_splits(shape(64, 8, 16384, 7)), 7);
  EXPECT_EQ(choose_splits(shape(1, 1, 100, 7)), 2);       // 2 tiles: 2 pieces at most
  EXPECT_EQ(choose_splits(shape(1, 1, 1 << 20, 1000)), kMaxSplits);
}

TEST(DecodeSplits, EverySplitGetsTiles) {
  // 64 tiles: 31 splits would be 3 tiles each, 22 of them busy; the count is tight.
  for (int batch : {1, 2, 3, 5}) {
    for (int keys : {1000, 4096, 5000, 16384, 100000}) {
      const int s = choose_splits(shape(batch, 8, keys));
      EXPECT_TRUE(splits_are_tight(s, (keys + kKeys - 1) / kKeys)) << batch << " " << keys << " " << s;
    }
  }
  EXPECT_TRUE(splits_are_tight(32, 64));
  EXPECT_FALSE(splits_are_tight(31, 64));
}

TEST(DecodeSplits, TilesPerSplitIsTheLongestSplitsShare) {
  EXPECT_EQ(tiles_per_split(16384, kKeys, 32), 8);   // batch 1 x 16k: 256 tiles over 32 splits
  EXPECT_EQ(tiles_per_split(4097, kKeys, 1), 65);    // one key past 64 tiles
  EXPECT_EQ(tiles_per_split(4097, kKeys, 40), 2);    // 65 tiles: 40 splits get ceil(65 / 40)
  EXPECT_EQ(tiles_per_split(1, kKeys, 1), 1);
  EXPECT_EQ(tiles_per_split(0, kKeys, 1), 1);        // an empty cache still has its one (empty) tile
  // The kernel's own split of the tiles (tile_work) never gives a split more.
  for (int keys : {1, 63, 64, 65, 4097, 16384, 262144}) {
    const int tiles = (keys + kKeys - 1) / kKeys;
    for (int s = 1; s <= kMaxSplits; ++s) {
      const int per = tiles_per_split(keys, kKeys, s);
      EXPECT_GE(int64_t{per} * s, tiles) << keys << " " << s;
      EXPECT_LT(int64_t{per - 1} * s, std::max(tiles, 1)) << keys << " " << s;
    }
  }
}

TEST(DecodeSplits, MoreSmsNeverMeanFewerSplits) {
  int previous = 0;
  for (int sms : {1, 16, 46, 108, 132, 264}) {
    const int s = choose_splits(shape(2, 4, 32768, 0, sms));
    EXPECT_GE(s, previous) << sms;
    previous = s;
  }
}

// Chunks per row of the ring's head-dim buckets (64, 128, 256 two-byte columns).
constexpr int kRowChunks[] = {8, 16, 32};

TEST(DecodeRing, EachRowIsAPermutationOfItsChunks) {
  for (int chunks : kRowChunks) {
    for (int row = 0; row < 64; ++row) {
      std::vector<int> seen(chunks, 0);
      for (int c = 0; c < chunks; ++c) {
        const int at = ring_chunk(row, c);
        ASSERT_GE(at, 0);
        ASSERT_LT(at, chunks);
        ++seen[at];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), chunks) << "row " << row;
    }
  }
}

TEST(DecodeRing, EightRowsOfAChunkFallInEightBankGroups) {
  // An ldmatrix phase reads chunk c of rows r0 .. r0 + 7 (r0 a multiple of 8); a
  // 16-byte chunk at (row, at) lies in bank group (row * chunks + at) % 8.
  for (int chunks : kRowChunks) {
    for (int r0 = 0; r0 < 64; r0 += 8) {
      for (int c = 0; c < chunks; ++c) {
        std::vector<int> groups;
        for (int i = 0; i < 8; ++i) groups.push_back(((r0 + i) * chunks + ring_chunk(r0 + i, c)) % 8);
        std::sort(groups.begin(), groups.end());
        EXPECT_EQ(std::unique(groups.begin(), groups.end()) - groups.begin(), 8) << "rows " << r0 << ", chunk " << c;
      }
    }
  }
}

TEST(DecodeRing, ASectorOfARowLandsInOneAlignedBlock) {
  // Chunks 2k and 2k + 1 of a row are one 32-byte sector of the global row.
  for (int chunks : kRowChunks) {
    for (int row = 0; row < 64; ++row) {
      for (int k = 0; k < chunks / 2; ++k) {
        EXPECT_EQ(ring_chunk(row, 2 * k) / 2, ring_chunk(row, 2 * k + 1) / 2) << "row " << row << ", sector " << k;
      }
    }
  }
}

}  // namespace
}  // namespace flashattn::cuda::decode
