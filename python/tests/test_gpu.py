"""CUDA tensors through the PyTorch ops: values against torch's own SDPA math
kernel in float64, gradients through autograd, torch.compile (inductor), opcheck.

Run with `pytest -m gpu python/tests`. Skipped without PyTorch, without a CUDA
device, or when the loaded libflashattn has no usable CUDA backend (point
FLASHATTN_LIBRARY at a CUDA build).

Low-precision results are judged like flash-attn's own tests: the error of
flashattn against the float64 reference may be at most twice the error of
PyTorch's own SDPA in the same dtype (plus a small absolute slack).
"""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from _torch_reference import f64, ref_attention, visible_mask  # noqa: E402
from flashattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from test_variants import _torch_ref as extras_reference  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and not flashattn.backend_available("cuda"),
                       reason="libflashattn has no usable CUDA backend: "
                       + flashattn.backend_unavailable_reason("cuda")),
]

DEV = "cuda"


def sdpa_reference(q, k, v, causal=False, window=(-1, -1), dtype=torch.float64, scale=None):
    """torch SDPA (math kernel for float64) on (b, s, h, d) tensors, bottom-right masks
    given as an explicit boolean mask, GQA by repeating kv heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    hq, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    kt = kt.repeat_interleave(hq // hkv, dim=1)
    vt = vt.repeat_interleave(hq // hkv, dim=1)
    mask = None
    if causal or window != (-1, -1):
        mask = visible_mask(q.shape[1], k.shape[1], causal, window, q.device)
    backends = [SDPBackend.MATH] if dtype == torch.float64 else [
        SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(backends):
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                             scale=scale)
    return o.transpose(1, 2)


def assert_within(got, ref64, torch_lp, name, slack=1e-4):
    err = (got.double() - ref64).abs().max().item()
    torch_err = (torch_lp.double() - ref64).abs().max().item()
    assert err <= 2 * torch_err + slack, (
        f"{name}: max error {err:.3e} vs float64, torch's own {torch_err:.3e}")


def _cuda_backward_available():
    q = torch.randn(1, 8, 1, 64, device=DEV, dtype=torch.float16, requires_grad=True)
    try:
        flash_attn_func(q, q, q).sum().backward()
    except NotImplementedError as e:
        return str(e)
    return ""


def needs_backward():
    why = _cuda_backward_available()
    if why:
        pytest.skip(f"CUDA backward not available in this build: {why}")


CASES = [
    # b, sq, sk, hq, hkv, d, causal, window
    (2, 128, 128, 8, 8, 64, False, (-1, -1)),
    (2, 113, 203, 8, 2, 128, True, (-1, -1)),
    (1, 256, 256, 4, 1, 96, True, (-1, -1)),
    (2, 200, 200, 4, 4, 64, False, (32, 16)),
    (1, 77, 300, 4, 2, 256, False, (-1, -1)),
    (3, 64, 64, 2, 2, 32, True, (-1, -1)),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window", CASES)
def test_forward_vs_sdpa_math(dtype, b, sq, sk, hq, hkv, d, causal, window):
    g = torch.Generator(device=DEV).manual_seed(0)
    q = torch.randn(b, sq, hq, d, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device=DEV, dtype=dtype, generator=g)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                  return_attn_probs=True)
    assert out.dtype == dtype and out.device == q.device and out.shape == q.shape
    ref64 = sdpa_reference(q, k, v, causal, window)
    lp = sdpa_reference(q, k, v, causal, window, dtype=dtype)
    assert_within(out, ref64, lp, "out")
    _, rl = ref_attention(q, k, v, causal=causal, window=window)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-3, atol=1e-3)


def test_softcap_forward():
    g = torch.Generator(device=DEV).manual_seed(1)
    q, k, v = (torch.randn(2, 130, 4, 64, device=DEV, dtype=torch.bfloat16, generator=g) * 3
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True, softcap=15.0)
    ro, _ = ref_attention(q, k, v, causal=True, softcap=15.0)
    torch.testing.assert_close(out.double(), ro, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal,window,hkv", [(False, (-1, -1), 4), (True, (-1, -1), 2),
                                               (False, (24, 8), 1)])
def test_gradients_vs_float64(dtype, causal, window, hkv):
    needs_backward()
    g = torch.Generator(device=DEV).manual_seed(2)
    shape_q, shape_k = (2, 150, 4, 64), (2, 170, hkv, 64)
    q = torch.randn(*shape_q, device=DEV, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(*shape_k, device=DEV, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(*shape_k, device=DEV, dtype=dtype, generator=g).requires_grad_()
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = f64(q, k, v)
    r64 = sdpa_reference(q64, k64, v64, causal, window)
    rgrads = torch.autograd.grad(r64, (q64, k64, v64), dout.double())
    ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
    lp = sdpa_reference(ql, kl, vl, causal, window, dtype=dtype)
    lgrads = torch.autograd.grad(lp, (ql, kl, vl), dout)
    for name, a, r, t in zip(("dq", "dk", "dv"), grads, rgrads, lgrads):
        assert a.dtype == dtype and a.shape == r.shape
        assert_within(a, r, t, name, slack=1e-3)


def test_varlen_forward_and_backward():
    g = torch.Generator(device=DEV).manual_seed(3)
    lens_q, lens_k = [100, 1, 37, 256], [90, 64, 37, 300]
    cu_q = torch.tensor([0] + lens_q, device=DEV).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=DEV).cumsum(0).to(torch.int32)
    dt = torch.bfloat16
    q = torch.randn(int(cu_q[-1]), 8, 128, device=DEV, dtype=dt, generator=g)
    k = torch.randn(int(cu_k[-1]), 2, 128, device=DEV, dtype=dt, generator=g)
    v = torch.randn(int(cu_k[-1]), 2, 128, device=DEV, dtype=dt, generator=g)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    for i in range(len(lens_q)):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        ref64 = sdpa_reference(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], True)
        lp = sdpa_reference(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], True, dtype=dt)
        assert_within(out[None, qs:qe], ref64, lp, f"out of sequence {i}")
    needs_backward()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()


def test_varlen_forward_and_backward_in_a_cuda_graph():
    # cu_seqlens cannot be checked on the host during capture (no copy back there): the call is
    # captured, replayed with other lengths of the same total, and must match eager calls; a
    # replay with bad lengths must stay inside the tensors (rows clamped; memcheck runs this).
    g = torch.Generator(device=DEV).manual_seed(5)
    dt = torch.bfloat16
    total, hq, hkv, d = 400, 4, 2, 64
    q, k, v, dout = (torch.randn(total, h, d, device=DEV, dtype=dt, generator=g) for h in (hq, hkv, hkv, hq))
    cu = torch.tensor([0, 100, 101, 250, 400], device=DEV, dtype=torch.int32)
    kw = dict(max_seqlen_q=256, max_seqlen_k=256, causal=True)

    def step():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        out = flash_attn_varlen_func(qq, kk, vv, cu, cu, **kw)
        return (out,) + torch.autograd.grad(out, (qq, kk, vv), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture (autograd's and the allocator's first calls)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for lens in ([100, 1, 149, 150], [256, 0, 44, 100], [7, 113, 203, 77]):
        cu.copy_(torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, step()):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    cu.copy_(torch.tensor([0, 300, 100, 5000, -7], device=DEV, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()


def test_dropout_under_cuda_graph_capture_is_refused():
    """A captured call would replay its capture-time seed (the same mask every step): the
    call raises RuntimeError during capture instead; the capture ends cleanly."""
    q = torch.randn(1, 64, 2, 64, device=DEV, dtype=torch.bfloat16)
    flash_attn_func(q, q, q, dropout_p=0.1)  # eager: allowed
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="under CUDA-graph capture"):
        with torch.cuda.graph(graph):
            flash_attn_func(q, q, q, dropout_p=0.1)
    torch.cuda.synchronize()
    assert torch.isfinite(flash_attn_func(q, q, q, dropout_p=0.1)).all()


def test_runs_on_current_stream():
    g = torch.Generator(device=DEV).manual_seed(4)
    q = torch.randn(4, 512, 8, 64, device=DEV, dtype=torch.float16, generator=g)
    expected = flash_attn_func(q, q, q, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = q * 1  # produced on the side stream; the op must run after it on that stream
        out = flash_attn_func(x, x, x, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_torch_compile_inductor_fullgraph():
    g = torch.Generator(device=DEV).manual_seed(5)
    q, k, v = (torch.randn(2, 128, 4, 64, device=DEV, dtype=torch.bfloat16, generator=g)
               for _ in range(3))

    def f(q, k, v):
        return flash_attn_func(q * 0.5, k, v, causal=True).float().square().mean()

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=1e-3, atol=1e-4)


def test_torch_compile_backward():
    needs_backward()
    g = torch.Generator(device=DEV).manual_seed(6)
    q, k, v = (torch.randn(2, 96, 4, 64, device=DEV, dtype=torch.float16, generator=g)
               .requires_grad_() for _ in range(3))

    def f(q, k, v):
        return flash_attn_func(q, k, v, causal=True).float().square().sum()

    torch._dynamo.reset()
    grads = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v), (q, k, v))
    eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b_ in zip(grads, eager):
        torch.testing.assert_close(a, b_)


def test_opcheck_cuda():
    g = torch.Generator(device=DEV).manual_seed(7)
    q = torch.randn(2, 64, 4, 64, device=DEV, dtype=torch.float16, generator=g)
    k = torch.randn(2, 80, 2, 64, device=DEV, dtype=torch.float16, generator=g)
    args = (q, k, k.clone(), 0.125, True, -1, -1, 0.0, False)
    tests = ("test_schema", "test_faketensor")
    if not _cuda_backward_available():
        tests = tests + ("test_autograd_registration", "test_aot_dispatch_dynamic")
        args = tuple(t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in args)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args, test_utils=tests)


def test_cuda_errors_surface():
    x = torch.randn(1, 16, 2, 64, device=DEV)  # float32 is CPU-only
    with pytest.raises(NotImplementedError, match="f16 and bf16"):
        flash_attn_func(x, x, x)
    y = torch.randn(1, 16, 2, 64, device=DEV, dtype=torch.float16)
    with pytest.raises(ValueError):
        flash_attn_func(y, y.cpu(), y)


def _dropout_reference(q, k, v, zmask, causal, dtype):
    """Attention with the dropout factors zmask (b, h, sq, sk) in `dtype`: softmax of the
    masked scores, times zmask, times V (GQA by repeating kv heads)."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    qt, kt, vt = (t.to(dtype) for t in (q, k, v))
    kt = kt.repeat_interleave(hq // hkv, dim=2)
    vt = vt.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qt, kt) / d ** 0.5
    if causal:
        s = s.masked_fill(~visible_mask(q.shape[1], k.shape[1], True, (-1, -1), q.device), float("-inf"))
    probs = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs * zmask.to(dtype), vt)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d,causal,p", [(64, True, 0.1), (128, False, 0.5), (256, True, 0.17)])
def test_dropout_matches_float64_reference_with_its_mask(dtype, d, causal, p):
    """Dropout on CUDA (the Hopper kernels on a 9.0 GPU, else sm80): out and the
    gradients against the float64 reference with the mask return_attn_probs shows,
    judged against the same formula in the input dtype; the kept fraction within
    binomial bounds (p rounded to 8 bits); torch.manual_seed makes it reproducible."""
    needs_backward()
    g = torch.Generator(device=DEV).manual_seed(4)
    b, sq, sk, hq, hkv = 2, 113, 203, 4, 2
    q, k, v = (torch.randn(b, s, h, d, device=DEV, dtype=dtype, generator=g).requires_grad_()
               for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    torch.manual_seed(21)
    out, _, zmask = flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True)
    torch.manual_seed(21)
    assert torch.equal(out, flash_attn_func(q, k, v, dropout_p=p, causal=causal))
    assert zmask.device == q.device and zmask.shape == (b, hq, sq, sk)
    n, kept = zmask.numel(), int((zmask != 0).sum())
    p8 = min(int(p * 256 + 0.5), 255) / 256  # p as the mask draws it (docs/variants.md)
    assert abs(kept - n * (1 - p8)) <= 6 * (n * p8 * (1 - p8)) ** 0.5
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    leaves_lp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref64 = _dropout_reference(*leaves64, zmask, causal, torch.float64)
    lp = _dropout_reference(*leaves_lp, zmask, causal, dtype)
    assert_within(out, ref64.detach(), lp.detach(), "out")
    dout = torch.randn(out.shape, device=DEV, dtype=dtype, generator=g)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref64, leaves64, dout.double())
    lp_grads = torch.autograd.grad(lp, leaves_lp, dout)
    for name, gg, w, l in zip(("dq", "dk", "dv"), got, want, lp_grads):
        assert_within(gg, w, l, name, slack=1e-3)


# ----------------------------------------------------------------------------
# ALiBi (alibi_slopes) and attention sinks (sinks, learnable) in prefill, forward and backward,
# against test_variants' reference (the sink as an extra softmax column): in float64 for the
# reference, in bf16 (naive, as flash-attn's reference) for the error allowed.


def _check_extras(call, reference, leaves, has_sinks):
    """call(q, k, v, sinks) -> (out, lse) through flashattn; reference(q, k, v, sinks) -> the
    same in torch. leaves: q, k, v (bf16) and sinks (float32 (heads,), requires_grad). Checks
    out against the float64 reference within assert_within's allowance (the bf16 reference's
    error), lse to 1e-3, then dq, dk, dv and d sinks the same way."""
    def copies(to):  # leaf copies (sinks None stays None)
        return tuple(None if t is None else to(t.detach()).requires_grad_() for t in leaves)

    out, lse = call(*leaves)
    leaves64, leaves_lp = copies(torch.Tensor.double), copies(torch.Tensor.clone)
    ref64, lse64 = reference(*leaves64)
    lp, _ = reference(*leaves_lp)
    assert out.dtype == leaves[0].dtype and out.shape == leaves[0].shape
    assert_within(out, ref64.detach(), lp.detach(), "out")
    torch.testing.assert_close(lse.double(), lse64.detach(), rtol=1e-3, atol=1e-3)
    needs_backward()
    n = 4 if has_sinks else 3
    dout = torch.randn(out.shape, device=DEV, dtype=out.dtype,
                       generator=torch.Generator(device=DEV).manual_seed(11))
    got = torch.autograd.grad(out, leaves[:n], dout)
    want = torch.autograd.grad(ref64, leaves64[:n], dout.double())
    lp_grads = torch.autograd.grad(lp, leaves_lp[:n], dout)
    for name, a, r, t in zip(("dq", "dk", "dv", "dsinks"), got, want, lp_grads):
        assert a.dtype == t.dtype and a.shape == r.shape, name
        # dsinks sums over every query row of its head: its rounding error grows with the
        # rows, as its value does (0.1-0.3% of it in bf16), hence a slack relative to it.
        slack = 1e-3 + (3e-3 * r.abs().max().item() if name == "dsinks" else 0.0)
        assert_within(a, r, t, name, slack=slack)


def _extras(g, b, hq, alibi, sinks):
    """(sinks (hq,) float32 requiring grad, or None; slopes (hq,) / (b, hq) float32, or None)."""
    z = (torch.randn(hq, device=DEV, generator=g) * 2).requires_grad_() if sinks else None
    shape = {"head": (hq,), "batch": (b, hq), None: None}[alibi]
    slopes = None if shape is None else torch.rand(shape, device=DEV, generator=g) * 0.3
    return z, slopes


EXTRAS_CASES = [(113, 203, d, causal, alibi, sinks) for d in (64, 128) for causal in (False, True)
                for alibi, sinks in ((None, True), ("head", False), ("batch", False),
                                     ("head", True), ("batch", True))] + [
    (203, 113, 128, True, "head", True),   # causal, seqlen_q > seqlen_k: rows with no key (lse = sink)
    (203, 113, 64, True, None, True),
]


@pytest.mark.parametrize("sq,sk,d,causal,alibi,sinks", EXTRAS_CASES)
def test_alibi_and_sinks_forward_backward_vs_float64(sq, sk, d, causal, alibi, sinks):
    """flash_attn_func with alibi_slopes (heads) or (batch, heads) and/or learnable sinks, bf16,
    GQA 8/2, odd lengths: out, lse, dq, dk, dv and d sinks against float64."""
    g = torch.Generator(device=DEV).manual_seed(8)
    b, hq, hkv, dt = 2, 8, 2, torch.bfloat16
    q = torch.randn(b, sq, hq, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    k = torch.randn(b, sk, hkv, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    v = torch.randn(b, sk, hkv, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    z, slopes = _extras(g, b, hq, alibi, sinks)

    def call(q, k, v, z):
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes, sinks=z,
                                      return_attn_probs=True)
        return out, lse

    def reference(q, k, v, z):
        return extras_reference(q, k, v, causal, slopes, z)

    _check_extras(call, reference, (q, k, v, z), sinks)


@pytest.mark.parametrize("alibi", ["head", "batch"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_alibi_and_sinks_forward_backward_vs_float64(d, causal, alibi):
    """flash_attn_varlen_func with alibi_slopes (heads) or (sequences, heads) and learnable
    sinks, bf16, GQA 8/2: out, lse (heads, total_q), dq, dk, dv and d sinks against float64,
    each sequence's reference on its own (the last, causal, has rows with no key)."""
    g = torch.Generator(device=DEV).manual_seed(9)
    lens_q, lens_k = [113, 1, 77, 40], [203, 64, 77, 9]
    hq, hkv, dt = 8, 2, torch.bfloat16
    cu_q = torch.tensor([0] + lens_q, device=DEV).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=DEV).cumsum(0).to(torch.int32)
    q = torch.randn(sum(lens_q), hq, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    k = torch.randn(sum(lens_k), hkv, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    v = torch.randn(sum(lens_k), hkv, d, device=DEV, dtype=dt, generator=g).requires_grad_()
    z, slopes = _extras(g, len(lens_q), hq, alibi, True)

    def call(q, k, v, z):
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                             causal=causal, alibi_slopes=slopes, sinks=z,
                                             return_attn_probs=True)
        return out, lse

    def reference(q, k, v, z):
        outs, lses = [], []
        for i in range(len(lens_q)):
            qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            sl = slopes if slopes.dim() == 1 else slopes[i]
            o, l_ = extras_reference(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal, sl, z)
            outs.append(o[0])
            lses.append(l_[0])
        return torch.cat(outs), torch.cat(lses, dim=1)

    _check_extras(call, reference, (q, k, v, z), True)
