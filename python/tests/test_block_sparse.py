"""Block-sparse masks (block_mask=), CPU backend: NumPy through the C ABI against a float64
NumPy reference that expands the lists into a dense mask itself; a duck-typed mask object;
the torch functions with FlexAttention's create_block_mask (causal, sliding window,
document masks) against float64 torch autograd, and under torch.compile (skipped without
torch); errors."""

import re

import numpy as np
import pytest

import flashattn
from flashattn import _capi


def _element_mask(sq, sk, causal, window):
    """(sq, sk) visible pairs of the element mask (bottom-right aligned, as the library)."""
    i = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = np.ones((sq, sk), bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def _listed(mask, b, h, sq, sk, grid=None):
    """(sq, sk) pairs whose block sequence b, head h lists (partial or full), read from the
    mask's own arrays: the reference's reading of the lists, independent of the library.
    grid: the (max) lengths the lists were made for, when longer than (sq, sk) (varlen)."""
    gq, gk = grid or (sq, sk)
    block = mask.BLOCK_SIZE
    bq, bk = (block, block) if isinstance(block, int) else block
    out = np.zeros(((gq + bq - 1) // bq, (gk + bk - 1) // bk), bool)
    for num, idx in ((mask.kv_num_blocks, mask.kv_indices),
                     (getattr(mask, "full_kv_num_blocks", None), getattr(mask, "full_kv_indices", None))):
        if num is None:
            continue
        num, idx = np.asarray(num), np.asarray(idx)
        lb, lh = (0 if num.shape[0] == 1 else b), (0 if num.shape[1] == 1 else h)
        for qb in range(out.shape[0]):
            out[qb, idx[lb, lh, qb, :num[lb, lh, qb]]] = True
    return np.kron(out, np.ones((bq, bk), bool))[:sq, :sk]


def _ref_forward(q, k, v, causal, window, mask):
    """float64 out and lse; rows that see no key: out 0, lse -inf."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    lse = np.full((b, hq, sq), -np.inf)
    for bi in range(b):
        for h in range(hq):
            vis = _element_mask(sq, sk, causal, window) & _listed(mask, bi, h, sq, sk)
            s = q[bi, :, h] @ k[bi, :, h // (hq // hkv)].T / np.sqrt(d)
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            seen = np.isfinite(m[:, 0])
            e = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
            l_ = e.sum(axis=1)
            out[bi, seen, h] = (e[seen] / l_[seen, None]) @ v[bi, :, h // (hq // hkv)]
            lse[bi, h, seen] = m[seen, 0] + np.log(l_[seen])
    return out, lse


def _random_mask(rng, batch, heads, sq, sk, block, density):
    """A flashattn.BlockMask of int32 NumPy arrays: each block pair listed with probability
    `density`, half of them as full; lists in random order, junk past each count."""
    bq, bk = block
    nq, nk = (sq + bq - 1) // bq, (sk + bk - 1) // bk
    cls = np.where(rng.random((batch, heads, nq, nk)) < density, rng.integers(1, 3, (batch, heads, nq, nk)), 0)
    lists = []
    for kind in (1, 2):
        num = (cls == kind).sum(-1).astype(np.int32)
        idx = np.full((batch, heads, nq, nk + 1), 10 ** 6, np.int32)
        for pos in np.ndindex(batch, heads, nq):
            blocks = rng.permutation(np.flatnonzero(cls[pos] == kind))
            idx[pos][:len(blocks)] = blocks
        lists += [num, idx]
    return flashattn.BlockMask(lists[0], lists[1], lists[2], lists[3], BLOCK_SIZE=block)


CASES = [  # b, sq, sk, hq, hkv, causal, window, block, density
    (1, 1, 1, 1, 1, False, (-1, -1), (128, 128), 1.0),
    (2, 7, 7, 2, 1, True, (-1, -1), (1, 3), 0.5),
    (1, 113, 203, 4, 2, False, (-1, -1), (16, 48), 0.1),
    (2, 203, 113, 2, 2, True, (-1, -1), (32, 16), 0.5),
    (1, 113, 203, 2, 2, False, (30, 0), (16, 16), 0.5),
    (1, 64, 64, 2, 2, False, (-1, -1), (16, 16), 0.0),
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,window,block,density", CASES)
def test_numpy_forward_matches_reference(rng, b, sq, sk, hq, hkv, causal, window, block, density):
    q = rng.standard_normal((b, sq, hq, 32)).astype(np.float32)
    k = rng.standard_normal((b, sk, hkv, 32)).astype(np.float32)
    v = rng.standard_normal((b, sk, hkv, 32)).astype(np.float32)
    mask = _random_mask(rng, b, hq, sq, sk, block, density)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                            block_mask=mask, return_attn_probs=True)
    ro, rl = _ref_forward(q, k, v, causal, window, mask)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(rl))
    np.testing.assert_allclose(lse[np.isfinite(rl)], rl[np.isfinite(rl)], rtol=1e-5, atol=1e-5)


def test_numpy_shared_lists_and_every_block_equal_dense(rng):
    """Lists of shape (1, 1, ...) apply to every sequence and head; listing every block
    gives the dense result bit for bit."""
    q = rng.standard_normal((2, 50, 3, 16)).astype(np.float32)
    k = rng.standard_normal((2, 70, 3, 16)).astype(np.float32)
    mask = _random_mask(rng, 1, 1, 50, 70, (16, 32), 1.0)
    dense = flashattn.flash_attn_func(q, k, k, causal=True)
    sparse = flashattn.flash_attn_func(q, k, k, causal=True, block_mask=mask)
    np.testing.assert_array_equal(sparse, dense)


def test_duck_typed_mask_object(rng):
    """Any object with FlexAttention's attribute names is taken (here without full lists and
    with one int as BLOCK_SIZE)."""

    class Fake:
        BLOCK_SIZE = 16
        kv_num_blocks = np.array([[[1, 2]]], np.int32)
        kv_indices = np.array([[[[1, 0], [0, 1]]]], np.int32)

    q = rng.standard_normal((1, 32, 1, 16)).astype(np.float32)
    out = flashattn.flash_attn_func(q, q, q, block_mask=Fake())
    ro, _ = _ref_forward(q, q, q, False, (-1, -1), Fake)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)


def test_numpy_backward_through_the_c_abi_takes_the_mask(rng):
    """_capi.backward with the forward's mask: rows of query blocks that list nothing get
    zero dq; keys no block lists get zero dk, dv."""
    q = rng.standard_normal((1, 40, 1, 16)).astype(np.float32)
    num = np.array([[[0, 1, 1]]], np.int32)
    idx = np.array([[[[9, 9], [0, 9], [0, 9]]]], np.int32)  # key block 1 (keys 16..31) never listed
    mask = flashattn.BlockMask(num, idx, BLOCK_SIZE=(16, 16))
    out = np.empty_like(q)
    lse = np.empty((1, 1, 40), np.float32)
    _capi.forward(q, q, q, out, lse, block_mask=mask)
    dq, dk, dv = (np.full_like(q, np.nan) for _ in range(3))
    _capi.backward(q, q, q, out, np.ones_like(q), lse, dq, dk, dv, block_mask=mask)
    assert np.all(np.isinf(lse[0, 0, :16])) and np.all(out[0, :16] == 0)
    assert np.all(dq[0, :16] == 0) and np.all(np.isfinite(dq))
    assert np.all(dk[0, 16:32] == 0) and np.all(dv[0, 16:32] == 0)
    assert np.any(dk[0, :16] != 0)


def test_bad_masks_are_rejected(rng):
    q = rng.standard_normal((1, 32, 2, 16)).astype(np.float32)
    good = _random_mask(rng, 1, 2, 32, 32, (16, 16), 0.5)
    bad_index = flashattn.BlockMask(np.ones((1, 2, 2), np.int32), np.full((1, 2, 2, 1), 5, np.int32),
                                    BLOCK_SIZE=16)
    with pytest.raises(flashattn.InvalidArgumentError, match=r"kv_indices\[0\]\[0\]\[0\]\[0\] = 5"):
        flashattn.flash_attn_func(q, q, q, block_mask=bad_index)
    wrong_blocks = flashattn.BlockMask(good.kv_num_blocks, good.kv_indices, BLOCK_SIZE=8)
    with pytest.raises(flashattn.InvalidArgumentError, match="query blocks"):
        flashattn.flash_attn_func(q, q, q, block_mask=wrong_blocks)
    as_int64 = flashattn.BlockMask(good.kv_num_blocks.astype(np.int64), good.kv_indices, BLOCK_SIZE=16)
    with pytest.raises(flashattn.InvalidArgumentError, match="kv_num_blocks must be int32"):
        flashattn.flash_attn_func(q, q, q, block_mask=as_int64)
    with pytest.raises(TypeError, match="kv_num_blocks, kv_indices and BLOCK_SIZE"):
        flashattn.flash_attn_func(q, q, q, block_mask=object())


# ----------------------------------------------------------------------------
# torch, with masks from FlexAttention's create_block_mask


def _flex():
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    return torch, flex


def _torch_ref(q, k, v, visible):
    """float64 attention with autograd over a dense (sq, sk) visibility; rows that see
    nothing give 0."""
    import torch
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def _dense(torch, mask_mod, sq, sk):
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    return mask_mod(0, 0, i, j)


def _check_values_and_grads(torch, q, k, v, got_out, visible):
    leaves = tuple(t.detach().double().requires_grad_() for t in (q, k, v))
    ro = _torch_ref(*leaves, visible)
    torch.testing.assert_close(got_out.double(), ro.detach(), rtol=1e-4, atol=2e-5)
    dout = torch.randn(got_out.shape, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad(got_out, (q, k, v), dout)
    want = torch.autograd.grad(ro, leaves, dout.double())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", ["causal", "sliding_window"])
@pytest.mark.parametrize("block", [128, (32, 64)])
def test_torch_create_block_mask_causal_and_window(kind, block):
    torch, flex = _flex()
    sq = sk = 203
    window = 40

    def mask_mod(b, h, i, j):
        return (i >= j) & (i - j <= window) if kind == "sliding_window" else i >= j

    bm = flex.create_block_mask(mask_mod, None, None, sq, sk, device="cpu", BLOCK_SIZE=block)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, sq, 2, 32, generator=gen).requires_grad_() for _ in range(3))
    # the mask_mod expressed as the call's element mask
    window_size = (window, 0) if kind == "sliding_window" else (-1, -1)
    out = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size, block_mask=bm)
    _check_values_and_grads(torch, q, k, v, out, _dense(torch, mask_mod, sq, sk))
    dense = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size)
    assert torch.equal(out, dense)  # blocks left out hold no visible pair


def test_torch_document_mask_with_block_aligned_documents():
    """A document mask of one packed sequence (documents starting on block boundaries, the
    last one ending inside a block): the lists say which document blocks meet, causal=True
    does the rest (and the mask_mod check reads no document id past the sequence)."""
    torch, flex = _flex()
    docs = torch.tensor([0] * 64 + [1] * 96 + [2] * 32 + [3] * 43)
    n = len(docs)

    def mask_mod(b, h, i, j):
        return (docs[i] == docs[j]) & (i >= j)

    bm = flex.create_block_mask(mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=16)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, n, 2, 32, generator=gen).requires_grad_() for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, causal=True, block_mask=bm)
    _check_values_and_grads(torch, q, k, v, out, _dense(torch, mask_mod, n, n))


def _refused_pair(torch, call, mask_mod, what, causal):
    """Calls call(), which must raise ValueError naming a pair of `what` blocks; checks that
    mask_mod and the element mask (causal or none, no window) differ at that pair."""
    with pytest.raises(ValueError, match=rf"{what} blocks, first at batch 0, head 0") as info:
        call()
    i, j = (int(x) for x in re.search(r"query (\d+), key (\d+)", str(info.value)).groups())
    assert bool(mask_mod(0, 0, torch.tensor(i), torch.tensor(j))) != (not causal or i >= j), (i, j)


def test_torch_mask_mod_unlike_the_element_mask_is_refused():
    """A BlockMask whose mask_mod the call's element mask does not reproduce inside its
    listed blocks raises ValueError naming a pair where they differ, instead of giving
    another attention: documents off the block boundaries (partial blocks), a causal mask
    called without causal=True (partial blocks), and a block pattern whose full blocks
    reach above the diagonal of a causal call (full blocks)."""
    torch, flex = _flex()
    gen = torch.Generator().manual_seed(12)
    n = 96
    q, k, v = (torch.randn(1, n, 2, 32, generator=gen).requires_grad_() for _ in range(3))
    docs = torch.tensor([0] * 40 + [1] * 56)

    def documents(b, h, i, j):
        return (docs[i] == docs[j]) & (i >= j)

    bm = flex.create_block_mask(documents, None, None, n, n, device="cpu", BLOCK_SIZE=16)
    _refused_pair(torch, lambda: flashattn.flash_attn_func(q, k, v, causal=True, block_mask=bm),
                  documents, "partial", causal=True)

    def lower(b, h, i, j):
        return i >= j

    causal = flex.create_block_mask(lower, None, None, n, n, device="cpu", BLOCK_SIZE=32)
    _refused_pair(torch, lambda: flashattn.flash_attn_func(q, k, v, block_mask=causal),
                  lower, "partial", causal=False)
    out = flashattn.flash_attn_func(q, k, v, causal=True, block_mask=causal)  # as meant
    _check_values_and_grads(torch, q, k, v, out, _dense(torch, lower, n, n))

    def upper_blocks(b, h, i, j):
        return (i // 32) <= (j // 32)  # whole blocks on and above the diagonal

    upper = flex.create_block_mask(upper_blocks, None, None, n, n, device="cpu", BLOCK_SIZE=32)
    _refused_pair(torch, lambda: flashattn.flash_attn_func(q, k, v, causal=True, block_mask=upper),
                  upper_blocks, "full", causal=True)
    # without causal every pair of a listed (full) block is visible, as the mask_mod says
    out = flashattn.flash_attn_func(q, k, v, block_mask=upper)
    _check_values_and_grads(torch, q, k, v, out, _dense(torch, upper_blocks, n, n))


def test_torch_random_lists_per_head_and_compile():
    """Hand-built torch lists (per sequence and head) through autograd, and the custom ops
    under torch.compile(fullgraph=True) giving the eager values and gradients."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    m = _random_mask(rng, 2, 4, 37, 45, (8, 16), 0.5)
    bm = flashattn.BlockMask(*(torch.from_numpy(np.ascontiguousarray(t)) for t in
                               (m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices)),
                             BLOCK_SIZE=m.BLOCK_SIZE)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 37, 4, 32, generator=gen).requires_grad_()
    k = torch.randn(2, 45, 2, 32, generator=gen).requires_grad_()
    v = torch.randn(2, 45, 2, 32, generator=gen).requires_grad_()
    out = flashattn.flash_attn_func(q, k, v, block_mask=bm)
    visible = torch.stack([torch.stack([torch.from_numpy(_listed(m, b, h, 37, 45)) for h in range(4)])
                           for b in range(2)])
    leaves = tuple(t.detach().double().requires_grad_() for t in (q, k, v))
    ro = _torch_ref(leaves[0], leaves[1].repeat_interleave(2, dim=2), leaves[2].repeat_interleave(2, dim=2),
                    visible)
    torch.testing.assert_close(out.double(), ro.detach(), rtol=1e-4, atol=2e-5)

    def f(q, k, v):
        return flashattn.flash_attn_func(q, k, v, block_mask=bm).square().sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v), (q, k, v))
    want = torch.autograd.grad(ro.square().sum(), leaves)
    for name, e, c, w in zip(("dq", "dk", "dv"), eager, compiled, want):
        torch.testing.assert_close(c, e, msg=lambda msg: f"{name} compiled: {msg}")
        torch.testing.assert_close(e.double(), w, rtol=1e-3, atol=1e-4, msg=lambda msg: f"{name}: {msg}")


def test_torch_varlen_with_block_mask():
    """Blocks count within each sequence; lists of batch 1 apply to every sequence."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    lens = [19, 33]
    m = _random_mask(rng, 1, 2, 33, 33, (8, 8), 0.5)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(int(cu[-1]), 2, 16, generator=gen)
    out = flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 33, 33, causal=True, block_mask=m)
    for i, n in enumerate(lens):
        s = int(cu[i])
        x = q[None, s:s + n].double()
        visible = torch.stack([torch.from_numpy(_listed(m, 0, h, n, n, (33, 33)) & _element_mask(n, n, True, (-1, -1)))
                               for h in range(2)])[None]
        torch.testing.assert_close(out[s:s + n].double(), _torch_ref(x, x, x, visible)[0], rtol=1e-4, atol=2e-5)


def test_torch_opcheck_with_block_mask():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(10)
    q = torch.randn(1, 20, 2, 32, generator=gen)
    m = _random_mask(np.random.default_rng(11), 1, 2, 20, 20, (8, 8), 0.5)
    lists = tuple(torch.from_numpy(t) for t in (m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks,
                                                m.full_kv_indices))
    args = (q, q, q, 0.2, True, -1, -1, 0.0, False, None, None, 0.0, 0, 0, 8, 8) + lists
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (torch.randn(out.shape, generator=gen), q, q, q, out, lse) + args[3:])


def _cuda_torch():
    torch, flex = _flex()
    if not torch.cuda.is_available() or not flashattn._capi.backend_available("cuda"):
        pytest.skip("no CUDA device (or the library has no CUDA backend)")
    return torch, flex


def _bf16_error_bound(torch, q, k, v, visible, got, dout):
    """max |got - exact| per output and gradient against 2 x that of naive bf16 attention
    plus a small atol (tests/common/harness: the library's tolerance rule)."""
    exact_in = tuple(t.detach().double().requires_grad_() for t in (q, k, v))
    naive_in = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    exact = _torch_ref(*exact_in, visible)
    naive = _torch_ref(*naive_in, visible)
    want = (exact,) + torch.autograd.grad(exact, exact_in, dout.double())
    rough = (naive,) + torch.autograd.grad(naive, naive_in, dout)
    for name, g, w, r in zip(("out", "dq", "dk", "dv"), got, want, rough):
        err = (g.double() - w).abs().max().item()
        bound = 2 * (r.double() - w).abs().max().item() + 1e-3
        assert err <= bound, f"{name}: error {err} > {bound}"


@pytest.mark.parametrize("kind", ["causal", "sliding_window", "documents"])
@pytest.mark.parametrize("block", [128, (32, 64)])
def test_cuda_create_block_mask(kind, block, monkeypatch):
    """A BlockMask built on the GPU (create_block_mask(device="cuda")) on CUDA tensors:
    values and gradients within the bf16 tolerance of float64 autograd; the causal and
    sliding-window masks equal the dense call bitwise (forward, on the default path: the
    Hopper kernel's two-consumer 128-key instantiation on an H100, sm80's elsewhere; and
    on the sm80 kernels)."""
    torch, flex = _cuda_torch()
    n, window = 448, 100
    # documents starting on block boundaries (of 128 and of 32 x 64)
    docs = torch.tensor([0] * 128 + [1] * 128 + [2] * 128 + [3] * 64, device="cuda")

    def mask_mod(b, h, i, j):
        if kind == "documents":
            return (docs[i] == docs[j]) & (i >= j)
        return (i >= j) & (i - j <= window) if kind == "sliding_window" else i >= j

    bm = flex.create_block_mask(mask_mod, None, None, n, n, device="cuda", BLOCK_SIZE=block)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(2, n, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    window_size = (window, 0) if kind == "sliding_window" else (-1, -1)
    out = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size, block_mask=bm)
    dout = torch.randn(out.shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    got = (out,) + torch.autograd.grad(out, (q, k, v), dout)
    i = torch.arange(n, device="cuda")[:, None]
    j = torch.arange(n, device="cuda")[None, :]
    _bf16_error_bound(torch, q, k, v, mask_mod(0, 0, i, j), got, dout)
    if kind != "documents":
        dense = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size)
        assert torch.equal(out, dense)
        monkeypatch.setenv("FLASHATTN_DISABLE_SM90", "1")
        with torch.no_grad():
            sparse80 = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size, block_mask=bm)
            dense80 = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window_size)
        assert torch.equal(sparse80, dense80)


def test_cuda_graph_replays_a_host_block_mask():
    """A flashattn.BlockMask over host tensors in a CUDA graph: the warm-up call builds the
    device lists, the captured forward and backward replay them (docs/variants.md), giving
    the eager values."""
    torch, flex = _cuda_torch()
    n = 512
    bm = flex.create_block_mask(lambda b, h, i, j: (i >= j) & (i - j <= 200), None, None, n, n,
                                device="cuda", BLOCK_SIZE=128)
    host = flashattn.BlockMask(*(t.cpu() for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                                   bm.full_kv_indices)), BLOCK_SIZE=128)
    gen = torch.Generator(device="cuda").manual_seed(12)
    q, k, v, dout = (torch.randn(2, n, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))

    def step():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        out = flashattn.flash_attn_func(qq, kk, vv, causal=True, window_size=(200, 0), block_mask=host)
        return (out,) + torch.autograd.grad(out, (qq, kk, vv), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()  # the warm-up: builds and keeps the mask's device lists
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for t in captured:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("out", "dq", "dk", "dv"), captured, eager):
        if name == "dq":  # added with atomics: the order may differ
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(got, want), name


def test_cuda_graph_with_a_gpu_block_mask():
    """A BlockMask on the GPU (create_block_mask(device="cuda")) in a CUDA graph: its lists are
    copied to the host per call, which capture forbids, so a capture before any call with the
    mask raises (naming the warm-up); after one eager call the capture reuses that host copy
    and the replay gives the eager values."""
    torch, flex = _cuda_torch()
    n = 384
    bm = flex.create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device="cuda", BLOCK_SIZE=128)
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = (torch.randn(1, n, 2, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def call():
        return flashattn.flash_attn_func(q, k, v, causal=True, block_mask=bm)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with pytest.raises(RuntimeError, match="before capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            call()
    with torch.cuda.stream(side):
        eager = call()  # the warm-up: keeps the lists' host copy
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
