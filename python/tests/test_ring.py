"""flashattn.ring_attention on CPU over gloo: the zigzag layout and schedule, one rank in
this process, and 2-3 real ranks in spawned processes, forward and backward, causal and
not, GQA, against single-process attention and a float64 reference. Skipped when PyTorch
is not installed."""

import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import flashattn  # noqa: E402
from _torch_reference import ref_attention  # noqa: E402
from flashattn import ring  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("seqlen_of", [lambda w: 2 * w, lambda w: 14 * w + 3])
def test_schedule_sees_exactly_the_causal_pairs(world, seqlen_of):
    seqlen = seqlen_of(world)
    for causal in (False, True):
        for rank in range(world):
            pq = ring.zigzag_positions(seqlen, world, rank)
            seen = set()
            for src in range(world):
                pk = ring.zigzag_positions(seqlen, world, src)
                plan = ring.plan_step(world, rank, src, causal)
                if plan is None:
                    continue
                qr = ring._half_rows(seqlen, world, rank, plan[0])
                kr = ring._half_rows(seqlen, world, src, plan[1])
                nq, nk = qr.stop - qr.start, kr.stop - kr.start
                for j in range(qr.start, qr.stop):
                    for k in range(kr.start, kr.stop):
                        a, b = j - qr.start, k - kr.start
                        if not plan[2] or b <= a + nk - nq:
                            seen.add((pq[j], pk[k]))
            want = {(i, j) for i in pq for j in range(seqlen) if not causal or j <= i}
            assert seen == want, (world, seqlen, causal, rank)


def test_shard_round_trip():
    x = torch.arange(2 * 31 * 3).reshape(2, 31, 3)
    shards = [ring.zigzag_shard(x, 3, r) for r in range(3)]
    assert [s.shape[1] for s in shards] == [ring.local_seqlen(31, 3, r) for r in range(3)]
    assert torch.equal(ring.zigzag_unshard(shards), x)


def _inputs(seqlen, dtype, heads_kv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen, 4, 32, generator=gen).to(dtype)
    k = torch.randn(2, seqlen, heads_kv, 32, generator=gen).to(dtype)
    v = torch.randn(2, seqlen, heads_kv, 32, generator=gen).to(dtype)
    dout = torch.randn(2, seqlen, 4, 32, generator=gen).to(dtype)
    return q, k, v, dout


def _ring_shard_run(rank, world, q, k, v, dout, causal):
    """This rank's out, lse and gradients (full-sequence inputs in, local results out)."""
    local = [ring.zigzag_shard(t, world, rank).requires_grad_(t is not dout)
             for t in (q, k, v, dout)]
    out, lse = ring.ring_attention(*local[:3], causal=causal, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, local[:3], local[3])
    return [t.detach() for t in (out, lse, dq, dk, dv)]


CASES = [(causal, dtype, heads_kv) for causal in (False, True)
         for dtype, heads_kv in ((torch.float32, 4), (torch.bfloat16, 2))]


def _case_inputs(world, index):
    causal, dtype, heads_kv = CASES[index]
    return _inputs(14 * world + 3, dtype, heads_kv, seed=10 * world + index) + (causal,)


def _worker(rank, world, store, result_dir):
    """One rank: every case of CASES (one process start for all of them)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = [_ring_shard_run(rank, world, *_case_inputs(world, i)) for i in range(len(CASES))]
        torch.save(results, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_world(world, tmp_path):
    """Every case's full-sequence results from `world` spawned ranks (here when world is 1)."""
    store = str(tmp_path / "store")
    if world == 1:
        _worker(0, 1, store, str(tmp_path))
    else:
        torch.multiprocessing.spawn(_worker, args=(world, store, str(tmp_path)), nprocs=world,
                                    join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    dims = [1, 2, 1, 1, 1]  # sequence dim of out, lse, dq, dk, dv
    return [[ring.zigzag_unshard([p[c][i] for p in per_rank], dim=d) for i, d in enumerate(dims)]
            for c in range(len(CASES))]


def _max_error(x, ref):
    assert not torch.isnan(x).any()
    return (x.double() - ref).abs().max().item()


def _check_case(got, q, k, v, dout, causal):
    # Single-process attention and the float64 reference on the whole sequences.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
    single = [out.detach(), lse] + list(torch.autograd.grad(out, leaves, dout))
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = ref_attention(*ref_leaves, causal=causal)
    ref = [ref_out.detach(), ref_lse.detach()] + list(
        torch.autograd.grad(ref_out, ref_leaves, dout.double()))
    # The project's rule with the single-process call as the baseline: the ring's error
    # vs fp64 at most twice that call's, plus a small atol for the dtype.
    atol = 1e-5 if q.dtype == torch.float32 else 1e-2
    for name, g, s, r in zip(("out", "lse", "dq", "dk", "dv"), got, single, ref):
        assert g.shape == r.shape, name
        assert _max_error(g, r) <= 2 * _max_error(s, r) + atol, name


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ring_attention_matches_reference(world, tmp_path):
    """Causal and not, f32 (heads 4/4) and bf16 with GQA (4/2), length 14P+3."""
    for index, got in enumerate(_run_world(world, tmp_path)):
        _check_case(got, *_case_inputs(world, index))


def test_bad_slice_is_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        q, k, v, _ = _inputs(9, torch.float32, 4, seed=0)
        with pytest.raises(ValueError, match="holds 9 tokens"):
            ring.ring_attention(q, k, v, seqlen=12)
        with pytest.raises(ValueError, match="seqlen 1"):
            ring.ring_attention(q[:, :1], k[:, :1], v[:, :1])
    finally:
        dist.destroy_process_group()
