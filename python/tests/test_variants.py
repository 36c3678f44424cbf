"""ALiBi (alibi_slopes) and attention sinks (sinks), CPU backend: NumPy through the C ABI
against a float64 NumPy reference written here (the sink as one more column of the
softmax), and the torch functions against float64 torch autograd (skipped without torch)."""

import numpy as np
import pytest

import flashattn
from flashattn import _capi


def _alibi_bias(slopes_h, sq, sk):
    """(h, sq, sk): -slope * |i + sk - sq - j|."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return -np.asarray(slopes_h, np.float64)[:, None, None] * np.abs(i + sk - sq - j)[None]


def _mask(sq, sk, causal):
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return (j <= i + sk - sq) if causal else np.ones((sq, sk), bool)


def ref_forward_one(q, k, v, causal, slopes_h, sinks):
    """One sequence in float64: q (sq, h, d), k/v (sk, h, d) (already expanded for GQA);
    the sink is an extra column of every row's softmax whose value is 0."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    sq, h, d = q.shape
    sk = k.shape[0]
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    if slopes_h is not None:
        s = s + _alibi_bias(slopes_h, sq, sk)
    s = np.where(_mask(sq, sk, causal)[None], s, -np.inf)
    z = np.full((h, sq, 1), -np.inf) if sinks is None else np.broadcast_to(
        np.asarray(sinks, np.float64)[:, None, None], (h, sq, 1))
    full = np.concatenate([s, z], axis=-1)
    m = full.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(full - m)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)[..., :sk]
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)), -np.inf)
    return np.einsum("hqk,khd->qhd", p, v), lse


def ref_forward(q, k, v, causal, slopes, sinks):
    b, sq, hq, d = q.shape
    rep = hq // k.shape[2]
    outs, lses = [], []
    for bi in range(b):
        slopes_h = None if slopes is None else (slopes[bi] if slopes.ndim == 2 else slopes)
        o, l_ = ref_forward_one(q[bi], np.repeat(k[bi], rep, 1), np.repeat(v[bi], rep, 1), causal,
                                slopes_h, sinks)
        outs.append(o)
        lses.append(l_)
    return np.stack(outs), np.stack(lses)


CASES = [
    # b, sq, sk, hq, hkv, d, causal, alibi ("head", "batch" or None), sinks
    (2, 33, 47, 4, 2, 64, True, "head", False),
    (1, 50, 20, 2, 1, 32, True, None, True),      # rows with no key: lse = sink
    (2, 29, 61, 4, 4, 16, False, "batch", True),
    (1, 1, 7, 2, 2, 128, False, "head", True),
]


def _inputs(rng, b, sq, sk, hq, hkv, d, alibi, sinks):
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    slopes = None
    if alibi == "head":
        slopes = rng.uniform(0.01, 0.3, hq).astype(np.float32)
    elif alibi == "batch":
        slopes = rng.uniform(0.01, 0.3, (b, hq)).astype(np.float32)
    z = rng.standard_normal(hq).astype(np.float32) * 2 if sinks else None
    return q, k, v, slopes, z


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,alibi,sinks", CASES)
def test_numpy_forward_matches_reference(rng, b, sq, sk, hq, hkv, d, causal, alibi, sinks):
    q, k, v, slopes, z = _inputs(rng, b, sq, sk, hq, hkv, d, alibi, sinks)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes, sinks=z,
                                         return_attn_probs=True)[:2]
    ro, rl = ref_forward(q, k, v, causal, slopes, z)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)


def test_numpy_sink_gradient_matches_finite_differences(rng):
    q, k, v, slopes, z = _inputs(rng, 2, 19, 23, 2, 2, 32, "head", True)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    kw = dict(causal=True, alibi_slopes=slopes, sinks=z)
    out, lse = np.empty_like(q), np.empty((2, 2, 19), np.float32)
    _capi.forward(q, k, v, out, lse, **kw)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dsinks = np.full(2, np.nan, np.float32)
    _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, dsinks=dsinks, **kw)
    eps = 1e-3
    for h in range(2):
        up, down = z.astype(np.float64).copy(), z.astype(np.float64).copy()
        up[h] += eps
        down[h] -= eps
        loss = [np.sum(ref_forward(q, k, v, True, slopes, zz)[0] * dout) for zz in (up, down)]
        np.testing.assert_allclose(dsinks[h], (loss[0] - loss[1]) / (2 * eps), rtol=1e-3, atol=1e-4)


def test_numpy_backward_needs_dsinks_with_sinks(rng):
    q, k, v, slopes, z = _inputs(rng, 1, 5, 5, 2, 2, 16, None, True)
    out, lse = np.empty_like(q), np.empty((1, 2, 5), np.float32)
    _capi.forward(q, k, v, out, lse, sinks=z)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    with pytest.raises(ValueError, match="dsinks is a null pointer"):
        _capi.backward(q, k, v, out, q, lse, dq, dk, dv, sinks=z)
    with pytest.raises(ValueError, match="sinks has 1 x 3 entries, expected 2"):
        _capi.forward(q, k, v, out, lse, sinks=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="alibi_slopes must be f32"):
        _capi.forward(q, k, v, out, lse, alibi_slopes=np.zeros(2, np.float16))


def _rounded_p(p):
    """p as the mask draws it: a multiple of 1/256, at most 255/256 (docs/variants.md)."""
    return min(int(p * 256 + 0.5), 255) / 256


def test_numpy_dropout_matches_reference_with_the_visible_mask(rng):
    b, sq, sk, h, d, p = 2, 23, 31, 2, 32, 0.3
    q, k, v, _, _ = _inputs(rng, b, sq, sk, h, h, d, None, False)
    kw = dict(causal=True, dropout_p=p, dropout_seed=1234, dropout_offset=8)
    mask = np.empty((b, h, sq, sk), np.float32)
    _capi.dropout_mask(mask, p, 1234, 8)
    kept = np.count_nonzero(mask)
    n = mask.size
    p8 = _rounded_p(p)
    assert abs(kept - n * (1 - p8)) <= 6 * np.sqrt(n * p8 * (1 - p8))
    assert set(np.unique(mask)) <= {0.0, np.float32(1 / (1 - p8))}
    out, lse = np.empty_like(q), np.empty((b, h, sq), np.float32)
    _capi.forward(q, k, v, out, lse, **kw)
    # reference: softmax without dropout, times the mask, times V
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    s = np.where(_mask(sq, sk, True)[None, None], s, -np.inf)
    probs = np.exp(s - s.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ref = np.einsum("bhqk,bkhd->bqhd", probs * mask, v.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5)
    # the backward regenerates the mask from the same seed and offset: dv = (P z)^T dO
    dout = rng.standard_normal(q.shape).astype(np.float32)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, **kw)
    ref_dv = np.einsum("bhqk,bqhd->bkhd", probs * mask, dout.astype(np.float64))
    np.testing.assert_allclose(dv, ref_dv, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------
# torch: the sinks are a differentiable input


def _torch_ref(q, k, v, causal, slopes, sinks):
    """Reference attention with autograd, on the inputs' device: the sink as an extra softmax
    column (sinks None: no sink column). float64 inputs give the float64 reference; 16-bit
    inputs naive attention in their precision, as flash-attn's reference computes it (test_gpu):
    the products in that dtype, the scores with the ALiBi bias and the sinks, and the softmax,
    in float32, P rounded to the dtype before P V."""
    import torch
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dev, acc = q.device, torch.promote_types(q.dtype, torch.float32)
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k).to(acc) / d ** 0.5
    if slopes is not None:
        sl = slopes.to(dev, acc).reshape(-1 if slopes.dim() == 1 else b, hq)
        i, j = torch.arange(sq, device=dev)[:, None], torch.arange(sk, device=dev)[None, :]
        s = s - sl.reshape(-1, hq, 1, 1) * (i + sk - sq - j).abs().to(acc)
    if causal:
        mask = torch.arange(sk, device=dev)[None, :] <= torch.arange(sq, device=dev)[:, None] + sk - sq
        s = s.masked_fill(~mask, float("-inf"))
    full = s
    if sinks is not None:
        full = torch.cat([s, sinks.to(acc).reshape(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    p = torch.softmax(full, dim=-1)[..., :sk].to(v.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), torch.logsumexp(full, dim=-1)


@pytest.mark.parametrize("alibi", [None, "head", "batch"])
def test_torch_values_and_gradients_with_sinks(alibi):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    b, sq, sk, hq, hkv, d = 2, 37, 29, 4, 2, 32  # causal with sq > sk: rows with no key
    q = torch.randn(b, sq, hq, d, generator=gen).requires_grad_()
    k = torch.randn(b, sk, hkv, d, generator=gen).requires_grad_()
    v = torch.randn(b, sk, hkv, d, generator=gen).requires_grad_()
    sinks = (torch.randn(hq, generator=gen) * 2).requires_grad_()
    slopes = None
    if alibi is not None:
        shape = (hq,) if alibi == "head" else (b, hq)
        slopes = torch.rand(shape, generator=gen) * 0.3
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes,
                                            sinks=sinks, return_attn_probs=True)
    leaves = tuple(t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    ro, rl = _torch_ref(*leaves[:3], True, slopes, leaves[3])
    torch.testing.assert_close(out.double(), ro.detach(), rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(lse.double(), rl.detach(), rtol=1e-5, atol=1e-5)
    dout = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v, sinks), dout)
    want = torch.autograd.grad(ro, leaves, dout.double())
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_torch_varlen_and_compile_with_sinks():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(1)
    lens = [7, 12]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), 2, 32, generator=gen).requires_grad_()
    sinks = torch.randn(2, generator=gen).requires_grad_()
    slopes = torch.rand(2, generator=gen) * 0.2
    out = flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 12, 12, causal=True,
                                           alibi_slopes=slopes, sinks=sinks)
    for i in range(2):
        s, e = int(cu[i]), int(cu[i + 1])
        x = q[None, s:e].detach().double()
        ro, _ = _torch_ref(x, x, x, True, slopes, sinks.detach())
        torch.testing.assert_close(out[s:e].double(), ro[0], rtol=1e-4, atol=2e-5)

    def f(q, sinks):
        return flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 12, 12, causal=True,
                                                alibi_slopes=slopes, sinks=sinks).sum()

    torch._dynamo.reset()
    loss = torch.compile(f, fullgraph=True)(q, sinks)
    torch.testing.assert_close(loss, f(q, sinks))
    (g_eager,) = torch.autograd.grad(f(q, sinks), (sinks,))
    (g_comp,) = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, sinks), (sinks,))
    torch.testing.assert_close(g_comp, g_eager)


def test_torch_opcheck_with_extras():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 9, 2, 32, generator=gen)
    sinks, slopes = torch.randn(2, generator=gen), torch.rand(2, generator=gen)
    args = (q, q, q, 0.2, True, -1, -1, 0.0, False, slopes, sinks)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (torch.randn(out.shape, generator=gen), q, q, q, out, lse) + args[3:])


def test_torch_dropout_is_reproducible_and_matches_its_mask():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    b, sq, sk, h, d, p = 2, 21, 33, 2, 32, 0.2
    q = torch.randn(b, sq, h, d, generator=gen).requires_grad_()
    k = torch.randn(b, sk, h, d, generator=gen).requires_grad_()
    v = torch.randn(b, sk, h, d, generator=gen).requires_grad_()
    torch.manual_seed(11)
    out, _, zmask = flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=True,
                                              return_attn_probs=True)
    torch.manual_seed(11)
    again = flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=True)
    assert torch.equal(out, again)
    assert not torch.equal(out, flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=True))
    assert zmask.shape == (b, h, sq, sk)
    n, kept = zmask.numel(), int((zmask != 0).sum())
    p8 = _rounded_p(p)
    assert abs(kept - n * (1 - p8)) <= 6 * (n * p8 * (1 - p8)) ** 0.5
    assert set(zmask.unique().tolist()) <= {0.0, float(np.float32(1 / (1 - p8)))}
    # float64 reference with the same mask; autograd gives its gradients
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / d ** 0.5
    causal = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
    probs = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    ref = torch.einsum("bhqk,bkhd->bqhd", probs * zmask.double(), v64)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-4, atol=2e-5)
    dout = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_torch_compiled_dropout_draws_a_new_mask_per_step():
    """Under torch.compile(fullgraph=True) the Philox seed is drawn in the graph: each call
    a new mask, the same one again (values and gradients) after torch.manual_seed."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 17, 2, 16, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(1, 17, 2, 16, generator=gen)

    def f(q, k, v):
        return flashattn.flash_attn_func(q, k, v, dropout_p=0.3)

    torch._dynamo.reset()
    step = torch.compile(f, fullgraph=True)

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        out = step(q, k, v)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    first, second, again = run(21), run(), run(21)
    plain = flashattn.flash_attn_func(q, k, v)
    assert not torch.equal(first[0], second[0])
    assert not torch.equal(first[0], plain)
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), name
        assert torch.isfinite(a).all(), name
