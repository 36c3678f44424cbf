// The work plan: how a call's work is cut into pieces and dealt to CTAs.
// Plain C++ (host and device), so the CPU tests check that every piece is
// taken exactly once.
//   KeySplit     a key range cut into near-equal runs of whole key tiles
//                (split-KV decoding, ring attention's shards, the split tail)
//   TileOrder    which query tile each persistent CTA takes in each round
//   SplitTail    the last round's tiles cut along the keys over all CTAs
//   DqTurn       the deterministic backward's order of dQ adds into a
//                query tile when its key tiles walk rotated
//
// NOTES: the persistent walk. Rank t goes to CTA c in round r (rank_of);
// rank -> query tile (tile_of_rank) in one of three orders:
//  - unmasked runs: head-major, a head's query tiles on consecutive ranks,
//    so the CTAs of a round walk ~grid / num_m_blocks heads in step and each
//    head's K/V is read from DRAM about once (plan_tile_order's NOTES);
//  - plain causal masks (fixed lengths): pairs of query tiles of equal total
//    cost, also head-major;
//  - everything else (windows, variable lengths with a mask): a snake. Round
//    r gives rank r*G + c to CTA c when r is even and r*G + G-1-c when r is
//    odd (G = gridDim.x), so a CTA that drew an expensive tile in one round
//    draws a cheap one in the next. (batch, head) pairs are cut into groups
//    whose K/V fit in half the L2; a group's tiles come query tile outer,
//    heaviest (last, for bottom-right causal) first, (batch, head) inner, so
//    ranks fall in cost within a group (a longest-first greedy with the
//    snake).
// (Measured before: plain round-robin over (batch, head)-outer ranks gave CTA c
// the query tiles c, c+4, c+8, ... of every head when G = 132 and there are
// 128 tiles per head: some CTAs only heavy tiles, others only light ones:
// 396 TFLOP/s at hdim 128, 16k, causal vs 490 at 8k. Head-major ranks dealt
// in rounds do not do that: a round takes consecutive ranks.)
#pragma once

#include <cstdint>

#include "attention/host_device.h"

namespace flashattn {

// key_tiles key tiles cut into `splits` runs whose sizes differ by at most
// one: split s covers [begin(s), end(s)). Every split is non-empty when
// splits <= key_tiles.
struct KeySplit {
  int key_tiles = 0;
  int splits = 1;
  FA_HOST_DEVICE int begin(int s) const {
    return static_cast<int>(static_cast<int64_t>(key_tiles) * s / splits);
  }
  FA_HOST_DEVICE int end(int s) const { return begin(s + 1); }
};

struct TileOrder {
  int num_m_blocks;  // query tiles per (sequence, head), from the longest sequence
  int num_tiles;     // num_m_blocks * number of (batch, head) pairs
  int group_heads;   // (batch, head) pairs per L2 group
  int group_extra;   // the first group_extra groups have one pair more
  int paired;        // 1: causal pairs (see plan_tile_order), 0: single tiles
  int head_major;    // 1: ranks walk (batch, head) outer, query tile (or pair) inner; no groups
  int num_ranks;     // ranks dealt: num_tiles, or twice the pairs
  int num_rounds;    // rounds of gridDim.x ranks the CTAs walk
};

FA_HOST_DEVICE int snake_rank(int round, int grid, int cta) {
  return round * grid + ((round & 1) ? grid - 1 - cta : cta);
}

// The rank CTA `cta` takes in round `round`: the snake, or with pairs the two
// halves of pair round / 2 * grid + cta in rounds 2k and 2k + 1.
FA_HOST_DEVICE int rank_of(const TileOrder& o, int round, int grid, int cta) {
  return o.paired ? 2 * ((round >> 1) * grid + cta) + (round & 1) : snake_rank(round, grid, cta);
}

// Rank t -> (batch, head) pair bh and query tile mb; mb = -1: nothing (the
// second half of the middle pair when num_m_blocks is odd).
FA_HOST_DEVICE void tile_of_rank(const TileOrder& o, int num_bh, int t, int& bh, int& mb) {
  // Items: query tiles, or pairs of them (query tiles i and num_m_blocks-1-i).
  const int per_head = o.paired ? (o.num_m_blocks + 1) / 2 : o.num_m_blocks;
  const int item = o.paired ? t >> 1 : t;
  int i;  // the item's index within its head, heaviest first
  if (o.head_major) {
    bh = item / per_head;
    i = item - bh * per_head;
  } else {
    // Groups 0 .. group_extra - 1 have group_heads + 1 pairs, the rest
    // group_heads (the last one fewer where the partition is not balanced).
    const int big = (o.group_heads + 1) * per_head;
    const int split = o.group_extra * big;
    int r, bh0, n_bh;
    if (item < split) {
      const int g = item / big;
      r = item - g * big;
      bh0 = g * (o.group_heads + 1);
      n_bh = o.group_heads + 1;
    } else {
      const int per_group = o.group_heads * per_head;
      const int g = (item - split) / per_group;
      r = item - split - g * per_group;
      bh0 = o.group_extra * (o.group_heads + 1) + g * o.group_heads;
      n_bh = o.group_heads < num_bh - bh0 ? o.group_heads : num_bh - bh0;
    }
    i = r / n_bh;
    bh = bh0 + r % n_bh;
  }
  mb = o.num_m_blocks - 1 - i;
  if (o.paired && (t & 1)) mb = i == mb ? -1 : i;
}

// What shapes the order besides the problem size.
struct TileOrderPolicy {
  bool balanced_groups;  // equal groups (+-1) instead of full ones and a remainder
  bool causal_pairs;     // the mask is plain causal (no window), fixed lengths: pair tiles
  bool head_major;       // unmasked runs and causal pairs: head-major ranks, no groups
};

// grid: CTAs; l2_fit: (batch, head) pairs whose K/V fill half the L2.
inline TileOrder plan_tile_order(int num_m_blocks, int num_bh, int grid, double l2_fit, bool masked,
                                 TileOrderPolicy policy) {
  TileOrder o;
  o.num_m_blocks = num_m_blocks;
  o.num_tiles = num_m_blocks * num_bh;
  o.paired = 0;
  o.head_major = 0;
  o.num_ranks = o.num_tiles;
  o.num_rounds = (o.num_tiles + grid - 1) / grid;
  // NOTES (head-major): with (batch, head) groups walked query tile outer
  // (the snake's order), a group spans more than one round, so every head of
  // it straddles two rounds and its K/V was read from DRAM twice (hdim 256,
  // 2k: 334 MB read for 192 MB of Q, K, V; head-major 208 MB; cuDNN 201,
  // ncu). One cold call takes the same cycles either way, but the kernel runs
  // at the 700 W power cap, and the DRAM traffic it saves goes to the SM
  // clock: +2-7% at 1k-4k non-causal (d64, d128, d256), +0-2.5% at 8k/16k,
  // causal pairs +0-6% (H100, bf16, A/B runs; docs/performance.md). It
  // replaced tight groups (the
  // smallest group spanning one round, +3-5% at 2k over the L2-sized groups).
  if (policy.causal_pairs && num_m_blocks >= 2) {
    // NOTES (causal pairs): causal query tile i walks i + 1 + c key tiles, so
    // tiles i and num_m_blocks-1-i together cost the same for every i. A CTA
    // takes both halves of a pair in two consecutive rounds: every CTA's
    // work per two rounds is the same, with no snake, no two-round minimum
    // for a group and no heavy tail in the last round (the snake's small last
    // group, and its groups straddling rounds, cost 4-12% at causal 4k-16k:
    // the balanced-groups NOTES below). Measured against the balanced snake
    // (H100, bf16, docs/performance.md): d128 causal
    // +4-6% at 1k-16k, d256 8k/16k +7.5%, d64 4k +8%, the rest within +-2%.
    // Without head-major: groups of the heads one round of pairs spans.
    const int per_head = (num_m_blocks + 1) / 2;
    int group = (grid + per_head - 1) / per_head;
    if (group > num_bh) group = num_bh;
    const int n_groups = (num_bh + group - 1) / group;
    o.paired = 1;
    o.head_major = policy.head_major ? 1 : 0;
    o.group_heads = policy.head_major ? num_bh : num_bh / n_groups;
    o.group_extra = policy.head_major ? 0 : num_bh % n_groups;
    const int pairs = per_head * num_bh;
    o.num_ranks = 2 * pairs;
    o.num_rounds = 2 * ((pairs + grid - 1) / grid);
    return o;
  }
  if (policy.head_major && !masked) {
    o.head_major = 1;
    o.group_heads = num_bh;
    o.group_extra = 0;
    return o;
  }
  // The snake. At least two rounds of tiles per group: the snake evens out
  // costs only where ranks fall in cost across a pair of rounds. (With one
  // head per group at hdim 256, 16k, causal, a round spanned two groups: 416
  // TFLOP/s.) What must stay in L2 is then the band of keys the group's CTAs
  // walk in step.
  const int min_group = (2 * grid + num_m_blocks - 1) / num_m_blocks;
  int group = l2_fit >= num_bh ? num_bh : static_cast<int>(l2_fit);
  if (group < min_group) group = min_group;
  if (group > num_bh) group = num_bh;
  // NOTES (balanced groups): the pairs are split into as many groups as groups
  // of `group` pairs would need, of equal size (+-1), rather than into groups
  // of `group` and a remainder. A small last group puts its heaviest causal
  // tiles (the whole key range) into the last round, where most CTAs are
  // idle: with 64 heads in groups of 12 (hdim 128, 4k), a 4-head last group.
  // One group of all pairs (no tail, no L2 grouping) measured +6-10% at
  // 8k/16k causal (d128, d256) and -16..-35% at 1k/2k (L2 misses); fewer,
  // larger equal groups (num_bh / group of them) +4-11% at most 4k-16k causal
  // cells and -3..-16% at 1k/2k, where they outgrew half the L2: hence groups no
  // larger than `group` where that keeps them at min_group or more: equal
  // groups of 32 pairs where min_group was 33 (hdim 256, 1k-8k causal)
  // spanned just under two rounds and lost 16-20%. Otherwise the remainder
  // joins the other groups (num_bh / group of them, each a little over
  // `group`) only when it is at most two thirds of a group: there the tail
  // cost more than the L2 spill (hdim 256 causal: 9,9,9,5 -> 11,11,10 at 4k
  // +11%, 5,5,5,1 -> 6,5,5 at 8k +9%; 17,17,17,13 -> 22,21,21 at 2k -7.5%,
  // 33,33,33,29 -> 43,43,42 at 1k -16%).
  const int n_small = (num_bh + group - 1) / group;
  const int n_large = num_bh / group;
  const int n_groups = num_bh / n_small >= min_group ? n_small
                       : 3 * (num_bh % group) <= 2 * group ? n_large : 0;
  if (policy.balanced_groups && n_groups > 0) {
    o.group_heads = num_bh / n_groups;
    o.group_extra = num_bh % n_groups;
  } else {
    o.group_heads = group;
    o.group_extra = 0;
  }
  return o;
}

// NOTES (split tail): with every tile of the same cost (no mask, fixed
// lengths) and T tiles on G CTAs, the last of ceil(T / G) rounds has only
// T mod G tiles: at the protocol's shapes 2048 tiles on 132 SMs (hdim 128)
// leave the last round half empty, 1024 (hdim 256) a quarter. The tiles of
// that round (ranks from first_rank on) are cut along the keys instead: their
// key tiles, tail tile after tail tile, are dealt to the G CTAs in equal
// contiguous chunks, walked by a second kernel, and a tail tile cut over
// several CTAs is finished by the last of them (kernel.cuh: partial O, max
// and sum through a workspace). Where it pays: tuning.h's kSplitTailMinKeys.
struct SplitTail {
  int first_rank;  // ranks below it are whole tiles, dealt in rounds
  int tiles;       // tail tiles, ranks first_rank .. first_rank + tiles - 1 (0: no split)
  int key_tiles;   // key tiles of every tile
  int max_parts;   // the most CTAs a tail tile is cut over
};

// Units: tail tile i's key tile k is unit i * key_tiles + k; CTA c holds
// units [c * U / G, (c+1) * U / G) (U = tiles * key_tiles). 32-bit: the plan
// keeps U * G below 2^31 (the producer, on few registers, does this math).
FA_HOST_DEVICE int split_unit_begin(const SplitTail& s, int grid, int cta) {
  return cta * (s.tiles * s.key_tiles) / grid;
}
// The CTA whose chunk holds unit u.
FA_HOST_DEVICE int split_unit_owner(const SplitTail& s, int grid, int u) {
  return ((u + 1) * grid - 1) / (s.tiles * s.key_tiles);
}

// One CTA's piece of a tail tile: key tiles [key_lo, key_hi) of tail tile
// `tile`, part `part` of `parts` (parts in CTA order).
struct SplitSegment {
  int tile, key_lo, key_hi, part, parts;
};

// Segment `k` of CTA `cta`'s chunk; false past its last one.
FA_HOST_DEVICE bool split_segment(const SplitTail& s, int grid, int cta, int k, SplitSegment& seg) {
  const int u0 = split_unit_begin(s, grid, cta), u1 = split_unit_begin(s, grid, cta + 1);
  if (u1 <= u0) return false;
  const int n = s.key_tiles;
  const int tile = u0 / n + k;
  if (tile > (u1 - 1) / n) return false;
  const int t0 = tile * n;
  seg.tile = tile;
  seg.key_lo = (u0 > t0 ? u0 : t0) - t0;
  seg.key_hi = (u1 < t0 + n ? u1 : t0 + n) - t0;
  const int first = split_unit_owner(s, grid, t0);
  seg.part = cta - first;
  seg.parts = split_unit_owner(s, grid, t0 + n - 1) - first + 1;
  return true;
}

// The most segments a CTA's chunk has (tail tiles it touches).
inline int max_split_segments(const SplitTail& s, int grid) {
  int most = 0;
  for (int c = 0; c < grid; ++c) {
    const int u0 = split_unit_begin(s, grid, c), u1 = split_unit_begin(s, grid, c + 1);
    const int n = u1 > u0 ? (u1 - 1) / s.key_tiles - u0 / s.key_tiles + 1 : 0;
    if (n > most) most = n;
  }
  return most;
}

// kMinSplitChunk: key tiles per CTA below which the tail is not split (each piece
// pays a prologue, an epilogue and its part of the merge).
constexpr int kMinSplitChunk = 2;

// The split tail for num_tiles tiles of key_tiles key tiles each on `grid`
// CTAs, where `uniform` (every tile the same cost); tiles = 0: none.
inline SplitTail plan_split_tail(int num_tiles, int grid, int key_tiles, bool uniform) {
  SplitTail s{num_tiles, 0, key_tiles, 1};
  const int tail = num_tiles % grid;
  if (!uniform || num_tiles <= grid || tail == 0 || key_tiles < 1) return s;
  const int64_t units = static_cast<int64_t>(tail) * key_tiles;
  if (units < static_cast<int64_t>(kMinSplitChunk) * grid) return s;
  if (units * (grid + 1) >= (int64_t{1} << 31)) return s;  // the 32-bit unit math
  s.first_rank = num_tiles - tail;
  s.tiles = tail;
  for (int i = 0; i < tail; ++i) {
    const int t0 = i * key_tiles;
    const int parts = split_unit_owner(s, grid, t0 + key_tiles - 1) - split_unit_owner(s, grid, t0) + 1;
    if (parts > s.max_parts) s.max_parts = parts;
  }
  return s;
}

// The deterministic backward's dQ turns: which key tile adds into a query
// tile right before key tile k, and from which step of k's walk there is one.
// A key tile walks one head's n_m query tiles; before == -1: never.
struct DqTurn {
  int before = -1;
  int from_step = 0;
};

// The turns when the n key tiles of a head walk rotated (the Hopper backward,
// cuda/sm90/bwd/scheduler.cuh): every key tile sees all n_m query tiles, key
// tile k walks them from query tile k mod n_m on, so it meets query tile m at
// step s = (m - k) mod n_m. The adds into m go in the order the key tiles
// meet it: by step, and within one step (key tiles k, k + n_m, ... when
// n > n_m) from the highest key tile down. The key tile before k at m is
//   k + n_m                when k + n_m < n (the next higher one of step s);
//   (k + 1) mod n_m        otherwise, the lowest one of step s - 1, if s > 0
//                          and that key tile exists;
//   0                      otherwise (k = n - 1 < n_m - 1: steps s - 1 ..
//                          s - (n_m - 1 - k) hold none) if s >= n_m - k;
// none otherwise: k adds first. One turn per key tile, from a step on.
// NOTES: in this order a key tile's predecessor met m one step before it (or
// at the same step), so key tiles running side by side add in step: a handoff
// waits about one step at most. With one fixed order for every query tile
// (highest key tile first, the walks unrotated) the CTAs of a head fall a
// handoff further apart per key tile: the lowest waits n - 1 handoffs. The
// cost: a turn may wait on a key tile dispatched later, so this order needs
// all n key tiles of a head resident at once.
// rot = k mod n_m, the walk's rotation (the kernel holds it; no division).
FA_HOST_DEVICE DqTurn rotated_dq_turn(int k, int rot, int n, int n_m) {
  if (k + n_m < n) return DqTurn{k + n_m, 0};
  const int j = rot + 1 < n_m ? rot + 1 : 0;  // (k + 1) mod n_m
  if (j < n) return DqTurn{j, 1};
  return DqTurn{0, n_m - k};
}

}  // namespace flashattn
