// The Hopper forward's producer (the K/V source): one thread of warpgroup 0
// issues TMA loads of Q and of K/V tiles into the kStages-deep ring, in the
// order the consumers walk them (key tiles from the highest down).
#pragma once

#include <cuda.h>

#include "core/params.h"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/traits.h"
#include "cuda/sm90/sync.h"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda::sm90 {

// Walk: DenseKeys or ListedKeys (scheduler.cuh), the consumers' walk.
template <class K, typename T, bool kSplit, class Walk = DenseKeys>
struct TmaProducer {
  const CUtensorMap* tma_q;
  const CUtensorMap* tma_k;
  const CUtensorMap* tma_v;
  const AttentionParams& p;
  const FwdArgs& a;
  const typename Walk::Tiles& blocks;
  const FwdSmem<K, T>& sm;
  int qt = 0;  // tiles with loads so far: Q buffer qt % kQStages
  int it = 0;  // key tiles loaded so far: ring stage it % kStages

  // What a tile's loads need, and no more (the producer runs on kProducerRegs registers).
  struct Loads {
    int row_q, row_k0, h, bq, n_begin, n_end;
    int e_first, e_last;  // ListedKeys
    // The key tiles' range and entries, as the walk reads them.
    __device__ __forceinline__ TileWork tiles() const {
      TileWork w;
      w.n_begin = n_begin;
      w.n_end = n_end;
      w.e_first = e_first;
      w.e_last = e_last;
      return w;
    }
  };

  // The next tile of this CTA's walk that has loads, from step `step` on
  // (the consumers skip the same tiles: invalid, or no visible key).
  __device__ __forceinline__ bool next_tile(int& step, Loads& l) const {
    const bool varlen = p.is_varlen();
    for (; step < a.num_steps; ++step) {
      TileWork w;
      SplitSegment seg;
      if (!work_at<K::kBlockM, K::kBlockN, kSplit, K::kCache, Walk>(p, a, blocks, step, w, seg)) continue;
      if (!w.valid || w.n_end <= w.n_begin) continue;
      l.row_q = (varlen ? static_cast<int>(w.seq.row_q) : 0) + w.m0;
      l.row_k0 = varlen ? static_cast<int>(w.seq.row_k) : 0;
      l.h = w.h;
      l.bq = varlen ? 0 : w.b;
      l.n_begin = w.n_begin;
      l.n_end = w.n_end;
      l.e_first = w.e_first;
      l.e_last = w.e_last;
      return true;
    }
    return false;
  }

  __device__ __forceinline__ void issue_q(const Loads& l) {
    const int qs = qt % K::kQStages;
    const uint32_t q_phase = (qt / K::kQStages) & 1;
    ++qt;
    mbar_wait(&sm.empty_q[qs], q_phase ^ 1);
    mbar_arrive_expect_tx(&sm.full_q[qs], K::kQBytes);
#pragma unroll
    for (int c = 0; c < K::kColBlocks; ++c)
      tma_load_4d(sm.q + (qs * K::kColBlocks + c) * K::kBlockM * 64, tma_q, &sm.full_q[qs], c * 64, l.row_q,
                  l.h, l.bq);
  }

  // K or V of key tile n (of the tile l, K/V head hk) into the stage of the
  // i-th key tile walked.
  __device__ __forceinline__ void load_kv(bool is_k, int i, int n, const Loads& l, int hk) {
    const int s = K::ring_stage(i);
    const uint32_t ph = K::ring_phase(i);
    uint64_t* full = is_k ? &sm.full_k[s] : &sm.full_v[s];
    mbar_wait(is_k ? &sm.empty_k[s] : &sm.empty_v[s], ph ^ 1);
    mbar_arrive_expect_tx(full, K::kKVBytes);
    T* dst = (is_k ? sm.k : sm.v) + s * K::kColBlocks * K::kBlockN * 64;
    const CUtensorMap* map = is_k ? tma_k : tma_v;
    if constexpr (K::kCache) {
      if (a.pages.block_table != nullptr) {
        load_pages(dst, map, full, n, l, hk);
        return;
      }
    }
#pragma unroll
    for (int c = 0; c < K::kColBlocks; ++c)
      tma_load_4d(dst + c * K::kBlockN * 64, map, full, c * 64, l.row_k0 + n * K::kBlockN, hk, l.bq);
  }

  // Key tile n of a paged cache (a.pages): pieces of box = min(page, kBlockN)
  // rows, each within one page (pages_fit), at its row of the page. A piece
  // past the sequence's keys (a tile is loaded only if it holds some, so the
  // count is >= 1) takes the sequence's last page: only the table entries of
  // its own pages are read, which the append kernel checked (api.cu); the rows
  // loaded there are masked, and their V zeroed (mainloop.cuh).
  // NOTES: power-of-two pages (shifts, no division) and the key count read
  // here rather than carried in Loads: the producer runs on kProducerRegs
  // registers, and a division and one more field of the two Loads it holds
  // spilled ~150 bytes at every head dim (-Xptxas -v).
  __device__ __forceinline__ void load_pages(T* dst, const CUtensorMap* map, uint64_t* full, int n, const Loads& l,
                                             int hk) const {
    const int shift = a.pages.page_shift;
    const int box = min(1 << shift, K::kBlockN);
    const int32_t* table = a.pages.block_table + l.bq * a.pages.table_stride;
    const int last = (p.seqused_k[l.bq] - 1) >> shift;
    for (int r = 0; r < K::kBlockN; r += box) {
      const int key = n * K::kBlockN + r;
      const int pool_page = table[min(key >> shift, last)];
#pragma unroll 1
      for (int c = 0; c < K::kColBlocks; ++c)
        tma_load_4d(dst + (c * K::kBlockN + r) * 64, map, full, c * 64, key & ((1 << shift) - 1), hk, pool_page);
    }
  }

  // NOTES: with two Q buffers, the next tile's Q is requested right after the
  // current tile's first kStages - 1 K/V tiles, not after all of them
  // (K::kQLead). The last of those went into the stage of the previous tile's
  // second-to-last key tile: its V was released after that tile's P V, which
  // completes after the previous tile's last S = Q K^T (wgmma groups complete
  // in order), after which its Q buffer (the one the next Q goes into) was
  // released: so the Q wait returns at once, and the next Q gets most of a
  // tile of lead. One Q buffer: the next Q can only follow the current tile's
  // last S, after all its K/V loads (earlier, it would wait on K/V not yet
  // loaded: a deadlock).
  // NOTES: K of key tile n is requested before V of tile n + 1 (the one walked
  // before it): K's stage frees when S = Q K^T of two tiles back completes,
  // V's only when that tile's P V has, so K does not wait behind V's release
  // and gets about half a period more lead.
  __device__ __forceinline__ void run() {
    tma_prefetch_map(tma_q);
    tma_prefetch_map(tma_k);
    tma_prefetch_map(tma_v);
    const int group = p.heads_q / p.heads_kv;
    int step = 0;
    Loads w;
    bool have = next_tile(step, w);
    if (have) issue_q(w);
    while (have) {
      int step_next = step + 1;
      Loads wn;
      const bool have_next = next_tile(step_next, wn);
      const int hk = w.h / group;
      const TileWork tiles = w.tiles();
      int loaded = 0;
      for (typename Walk::Step k = Walk::first(blocks, tiles); k.n >= w.n_begin;
           Walk::advance(blocks, tiles, k), ++it) {
        load_kv(true, it, k.n, w, hk);
        if (Walk::has_above(tiles, k)) load_kv(false, it - 1, Walk::above(k), w, hk);
        if (++loaded == K::kQLead && have_next) issue_q(wn);
      }
      if (loaded > 0) load_kv(false, it - 1, w.n_begin, w, hk);
      if (loaded < K::kQLead && have_next) issue_q(wn);
      w = wn;
      step = step_next;
      have = have_next;
    }
  }
};

}  // namespace flashattn::cuda::sm90
