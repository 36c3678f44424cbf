// The sm80 forward's work split: block index -> the query tile a CTA owns and
// the key tiles its rows can see; thread index -> a thread's place in the tile.
#pragma once

#include "attention/mask.h"
#include "core/layout.h"
#include "core/params.h"
#include "cuda/sm80/fwd/traits.h"

namespace flashattn::cuda::sm80 {

// What one CTA covers: query rows [m0, m0 + rows_valid) of head h of sequence
// b (kv head hk), and key tiles [n_first, n_first + n_tiles) (with a block
// mask, the n_tiles entries from first_entry: key_walk.cuh).
template <typename T>
struct FwdCta {
  SequenceInfo seq;
  MaskPolicy mask;
  int b, h, hk;
  int m0, rows_valid;
  bool varlen;
  const T* q;  // the tile's first query row
  const T* k;  // the sequence's first key row (of head hk), V likewise
  const T* v;
  int n_first, n_tiles;
  int first_entry;  // block-sparse walk only (ListedKeys): the first of its key-tile entries

  // The CTA's query tile, from blockIdx. The kernel exits when it starts past
  // the sequence (varlen batches launch for the longest one).
  // NOTES: blocks of one (sequence, head) are adjacent in launch order so they
  // share K/V in L2; inside it the last query block goes first, since with a
  // bottom-right mask it sees the most keys (heaviest work first, light tail).
  template <class K>
  __device__ __forceinline__ void place(const AttentionParams& p, int m_blocks) {
    const int bh = blockIdx.x / m_blocks;
    const int m_block = m_blocks - 1 - static_cast<int>(blockIdx.x % m_blocks);
    h = bh % p.heads_q;
    b = bh / p.heads_q;
    seq = sequence_info(p, b);
    m0 = m_block * K::kM;
  }
  __device__ __forceinline__ bool past_sequence() const { return m0 >= seq.seqlen_q; }

  // The rest, for a tile in the sequence: its rows, the operands' first rows
  // and the key tiles the mask leaves visible.
  template <class K>
  __device__ __forceinline__ void plan(const AttentionParams& p) {
    mask = mask_for(p, seq);
    varlen = p.cu_seqlens_q != nullptr;
    hk = h / (p.heads_q / p.heads_kv);
    rows_valid = min(K::kM, seq.seqlen_q - m0);
    q = static_cast<const T*>(p.q) +
        row_offset(b, seq.row_q, m0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride, varlen);
    k = static_cast<const T*>(p.k) +
        row_offset(b, seq.row_k, 0, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride, varlen);
    v = static_cast<const T*>(p.v) +
        row_offset(b, seq.row_k, 0, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride, varlen);
    // Key tiles [n_first, n_first + n_tiles): only those some row here can see.
    const int key_lo = mask.key_begin(m0), key_hi = mask.key_end(m0 + rows_valid);
    n_first = key_lo / K::kN;
    n_tiles = key_hi > key_lo ? (key_hi + K::kN - 1) / K::kN - n_first : 0;
  }
};

// A thread's place in the tile, fixed for the kernel. Element e of its S
// (and O) n8 tile nt of m16 tile mt: row warp_row + 16 mt + g + 8 (e >> 1),
// column 8 nt + 2 t + (e & 1) of its keys (its O columns).
struct FwdThread {
  int tid, warp, lane;
  int g, t;      // lane / 4 (the accumulator row), lane % 4 (its column pair)
  int half;      // which half of the keys / head dim (pair split)
  int warp_row;  // first row of this warp in the tile
  int key_off;   // first key column of this warp's S

  template <class K>
  __device__ __forceinline__ void place() {
    tid = threadIdx.x;
    warp = tid / 32;
    lane = tid % 32;
    g = lane / 4;
    t = lane % 4;
    half = warp % K::kSplit;
    warp_row = warp / K::kSplit * K::kWarpRows;
    key_off = half * K::kWarpKeys;
  }
};

}  // namespace flashattn::cuda::sm80
