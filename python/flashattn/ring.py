"""Ring attention (context parallelism) over a torch.distributed process group.

Each rank of ``group`` holds a zigzag slice of every sequence: of the 2P chunks of a
sequence of ``seqlen`` tokens (chunk c covers [seqlen*c // 2P, seqlen*(c+1) // 2P)),
rank r holds chunks r and 2P-1-r, concatenated, for q, k and v alike
(:func:`zigzag_shard` cuts them). K/V blocks travel around the ring with point-to-point
sends overlapped with the attention of the block in hand; each step's (out, lse) is
merged into an fp32 running state; the backward sends dK/dV (fp32) along with their
blocks and reuses the global out and lse. The algorithm, the layout and what was run
are in docs/ring.md; the C++ library has the same algorithm (include/flashattn/ring.hpp).

Tensors: q (batch, local_seqlen, heads_q, head_dim), k/v (batch, local_seqlen,
heads_kv, head_dim), heads_q a multiple of heads_kv; CPU tensors need a gloo group, CUDA
tensors an NCCL one (set NCCL_NVLS_ENABLE=0: docs/ring.md).
"""

import math
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _torch_ops

__all__ = ["ring_attention", "zigzag_shard", "zigzag_unshard", "zigzag_positions",
           "local_seqlen", "plan_step"]


# ----------------------------------------------------------------------------
# The zigzag layout and the schedule (the same rules as include/flashattn/ring.hpp)


def _chunk(seqlen: int, world: int, chunk: int) -> Tuple[int, int]:
    n = 2 * world
    return seqlen * chunk // n, seqlen * (chunk + 1) // n


def _rank_chunks(world: int, rank: int) -> Tuple[int, int]:
    return rank, 2 * world - 1 - rank


def local_seqlen(seqlen: int, world: int, rank: int) -> int:
    """Tokens of one sequence that ``rank`` holds."""
    return sum(e - b for b, e in (_chunk(seqlen, world, c) for c in _rank_chunks(world, rank)))


def zigzag_positions(seqlen: int, world: int, rank: int) -> List[int]:
    """Sequence positions of the rank's local rows, in order."""
    return [p for c in _rank_chunks(world, rank) for p in range(*_chunk(seqlen, world, c))]


def zigzag_shard(x: Tensor, world: int, rank: int, dim: int = 1) -> Tensor:
    """The rank's zigzag slice of a full-sequence tensor (sequence along ``dim``)."""
    index = torch.tensor(zigzag_positions(x.shape[dim], world, rank), device=x.device)
    return x.index_select(dim, index)


def zigzag_unshard(shards: List[Tensor], dim: int = 1) -> Tensor:
    """The full-sequence tensor from every rank's slice (rank order)."""
    world = len(shards)
    seqlen = sum(s.shape[dim] for s in shards)
    order = [p for r in range(world) for p in zigzag_positions(seqlen, world, r)]
    inverse = torch.empty(seqlen, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(seqlen)
    return torch.cat(shards, dim=dim).index_select(dim, inverse.to(shards[0].device))


def _pair_visible(q_chunk: int, kv_chunk: int, causal: bool) -> str:
    """'full', 'diagonal' or 'empty': how query chunk a sees key chunk b."""
    if not causal or kv_chunk < q_chunk:
        return "full"
    return "diagonal" if kv_chunk == q_chunk else "empty"


def plan_step(world: int, rank: int, src: int, causal: bool):
    """The one call of a step: ((q halves), (kv halves), causal), or None.

    Halves index the two chunks a rank holds; the visible pairs of a zigzag step always
    form one rectangle (checked here and in python/tests/test_ring.py)."""
    kinds = {(a, b): _pair_visible(_rank_chunks(world, rank)[a], _rank_chunks(world, src)[b],
                                   causal) for a in range(2) for b in range(2)}
    seen = [ab for ab, kind in kinds.items() if kind != "empty"]
    if not seen:
        return None
    qa, qb = min(a for a, _ in seen), max(a for a, _ in seen) + 1
    ka, kb = min(b for _, b in seen), max(b for _, b in seen) + 1
    diagonal = any(kinds[ab] == "diagonal" for ab in seen)
    for a in range(qa, qb):
        for b in range(ka, kb):
            want = "full" if not diagonal else (
                "diagonal" if a == b else ("full" if b < a else "empty"))
            if kinds[(a, b)] != want or (diagonal and src != rank):
                raise RuntimeError(f"ring schedule: step of rank {rank} on block {src} "
                                   "is not one rectangle")
    return (qa, qb), (ka, kb), diagonal


def _half_rows(seqlen: int, world: int, rank: int, halves: Tuple[int, int]) -> slice:
    first = _chunk(seqlen, world, rank)[1] - _chunk(seqlen, world, rank)[0]
    begin = 0 if halves[0] == 0 else first
    end = first if halves[1] == 1 else local_seqlen(seqlen, world, rank)
    return slice(begin, end)


# ----------------------------------------------------------------------------
# The ring


class _Ring:
    """The group, this rank's place in it, and the one-hop exchange."""

    def __init__(self, group, seqlen: int):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.seqlen = seqlen
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) \
            if group is not None else (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) \
            if group is not None else (self.rank - 1) % self.world

    def rows(self, rank: int) -> int:
        return local_seqlen(self.seqlen, self.world, rank)

    def exchange(self, send: Tensor, recv: Tensor):
        """Starts sending ``send`` to the next rank and receiving ``recv`` from the previous
        one; returns the requests to wait on.

        NOTES: one batched pair (``batch_isend_irecv``): an unbatched isend / irecv made
        torch 2.11 set up a 2-rank NCCL communicator per pair, and that setup failed with an
        illegal address on a 2- and a 4-GPU H100 host where the batched pair (and the whole
        ring) runs (docs/ring.md)."""
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, group=self.group),
                                       dist.P2POp(dist.irecv, recv, self.prev, group=self.group)])

    def step_call(self, src: int, causal: bool):
        plan = plan_step(self.world, self.rank, src, causal)
        if plan is None:
            return None
        q_halves, kv_halves, step_causal = plan
        return (_half_rows(self.seqlen, self.world, self.rank, q_halves),
                _half_rows(self.seqlen, self.world, src, kv_halves), step_causal)


def _wait(requests):
    for r in requests:
        r.wait()


def _merge(acc_o: Tensor, acc_lse: Tensor, out: Tensor, lse: Tensor, rows: slice):
    """(acc_o, acc_lse) on ``rows`` absorbs the normalised partial (out, lse), in fp32:
    lse = log(e^lse_a + e^lse_b), o = o_a e^{lse_a - lse} + o_b e^{lse_b - lse}
    (the merge of src/attention/state.h)."""
    a_lse = acc_lse[:, :, rows]
    merged = torch.logaddexp(a_lse, lse)
    # NOTES: a row that is empty on both sides keeps lse -inf and its o (the merge's identity).
    safe = torch.where(torch.isinf(merged) & (merged < 0), torch.zeros_like(merged), merged)
    wa = torch.exp(a_lse - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1)
    acc_o[:, rows] = acc_o[:, rows] * wa + out.float() * wb
    acc_lse[:, :, rows] = merged


def _ring_forward(ring: _Ring, q, k, v, scale, causal):
    acc_o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    acc_lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -math.inf, dtype=torch.float32,
                         device=q.device)
    kv = torch.stack((k, v)).contiguous()
    for step in range(ring.world):
        src = (ring.rank - step) % ring.world
        requests = []
        if step + 1 < ring.world:
            incoming = torch.empty((2, k.shape[0], ring.rows((src - 1) % ring.world)) + k.shape[2:],
                                   dtype=k.dtype, device=k.device)
            requests = ring.exchange(kv, incoming)
        call = ring.step_call(src, causal)
        if call is not None:
            qr, kr, step_causal = call
            out, lse = _torch_ops._forward(q[:, qr], kv[0][:, kr], kv[1][:, kr], scale,
                                           step_causal, -1, -1, 0.0, False)
            _merge(acc_o, acc_lse, out, lse, qr)
        _wait(requests)
        if requests:
            kv = incoming
    return acc_o.to(q.dtype), acc_lse


def _ring_backward(ring: _Ring, dout, q, k, v, out, lse, scale, causal):
    """dQ stays here; dK/dV (fp32) travel with their block and come home after P hops.
    fa_backward on a block with the global out and lse gives exactly that block's share
    (docs/ring.md)."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v)).contiguous()
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=k.device)
    pending = []
    for step in range(ring.world):
        src = (ring.rank - step) % ring.world
        incoming_rows = ring.rows((src - 1) % ring.world)
        kv_requests = []
        if step + 1 < ring.world:
            incoming = torch.empty((2, k.shape[0], incoming_rows) + k.shape[2:], dtype=k.dtype,
                                   device=k.device)
            kv_requests = ring.exchange(kv, incoming)
        call = ring.step_call(src, causal)
        grads = None
        if call is not None:
            qr, kr, step_causal = call
            grads = _torch_ops._backward(dout[:, qr], q[:, qr], kv[0][:, kr], kv[1][:, kr],
                                         out[:, qr], lse[:, :, qr], scale, step_causal, -1, -1,
                                         0.0, False)
        _wait(pending)  # this block's dK/dV from the previous rank
        if grads is not None:
            dq[:, qr] += grads[0].float()
            dkv[0][:, kr] += grads[1].float()
            dkv[1][:, kr] += grads[2].float()
        pending = []
        if ring.world > 1:
            dkv_in = torch.empty((2, k.shape[0], incoming_rows) + k.shape[2:],
                                 dtype=torch.float32, device=k.device)
            pending = ring.exchange(dkv, dkv_in)
        _wait(kv_requests)
        if kv_requests:
            kv = incoming
        if pending:
            dkv = dkv_in
    _wait(pending)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, scale, causal):
        out, lse = _ring_forward(ring, q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.scale, ctx.causal = ring, scale, causal
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(ctx.ring, dout.contiguous(), q, k, v, out, lse, ctx.scale,
                                    ctx.causal)
        return dq, dk, dv, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None, causal: bool = False,
                   softmax_scale: Optional[float] = None, seqlen: Optional[int] = None,
                   return_lse: bool = False):
    """Exact attention of this rank's queries over the whole sequence held by ``group``.

    q (batch, local_seqlen, heads_q, head_dim), k/v (batch, local_seqlen, heads_kv,
    head_dim): this rank's zigzag slices (:func:`zigzag_shard`). ``seqlen``: tokens per
    sequence over all ranks (default: the sum of the ranks' local lengths, one all_reduce).
    ``causal`` is the mask of the whole sequence. Returns out like q (and, with
    ``return_lse``, the lse (batch, heads_q, local_seqlen) float32). Differentiable in
    q, k, v; every rank of the group must call it with the same arguments.
    """
    if not dist.is_initialized():
        raise RuntimeError("ring_attention needs torch.distributed initialised "
                           "(torch.distributed.init_process_group)")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (batch, local_seqlen, heads, head_dim), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if seqlen is None:
        total = torch.tensor([q.shape[1]], dtype=torch.int64,
                             device=q.device if q.is_cuda else "cpu")
        dist.all_reduce(total, group=group)
        seqlen = int(total.item())
    ring = _Ring(group, int(seqlen))
    if seqlen < 2 * ring.world:
        raise ValueError(f"seqlen {seqlen} must be at least 2 * world_size ({2 * ring.world})")
    expected = ring.rows(ring.rank)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[1] != expected:
            raise ValueError(f"{name} holds {t.shape[1]} tokens, but rank {ring.rank} of "
                             f"{ring.world} holds {expected} of a {seqlen}-token sequence "
                             "(zigzag_shard cuts the slices)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    out, lse = _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), ring, scale,
                                    bool(causal))
    return (out, lse) if return_lse else out
