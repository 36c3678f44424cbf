"""Prepared calls (flashattn._capi._prepare): a call that reuses the structs of an earlier
call with the same argument signature must compute exactly what a freshly built call does,
with its own tensors, and must still be checked by the library. CPU tensors; skipped
without PyTorch."""

import threading

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from _torch_reference import f64, ref_attention  # noqa: E402
from flashattn import _capi  # noqa: E402


def fresh(fn):
    """fn() with no prepared call to reuse."""
    _capi._prepared_calls.__dict__.pop("calls", None)
    return fn()


def qkv(seed, b=2, s=37, h=4, d=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g, dtype=dtype) for _ in range(3)]


def test_forward_reuse_uses_each_calls_tensors():
    sets = [qkv(1), qkv(2), qkv(3, s=21), qkv(4)]
    expected = [fresh(lambda t=t: flashattn.flash_attn_func(*t, causal=True)) for t in sets]
    fresh(lambda: None)
    for _ in range(3):  # every call after the first of a shape reuses its structs
        for t, e in zip(sets, expected):
            got = flashattn.flash_attn_func(*t, causal=True)
            assert torch.equal(got, e)
    assert len(_capi._prepared_calls.calls) == 2  # two shapes, one key each
    q, k, v = sets[0]
    ro, _ = ref_attention(*f64(q, k, v), causal=True)
    torch.testing.assert_close(flashattn.flash_attn_func(q, k, v, causal=True).double(), ro,
                               rtol=1e-5, atol=1e-5)


def test_strides_and_options_are_part_of_the_key():
    q, k, v = qkv(5)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    plain = fresh(lambda: flashattn.flash_attn_func(q, k, v))
    causal = fresh(lambda: flashattn.flash_attn_func(q, k, v, causal=True))
    fresh(lambda: None)
    assert torch.equal(flashattn.flash_attn_func(q, k, v), plain)
    assert torch.equal(flashattn.flash_attn_func(q, k, v, causal=True), causal)
    assert torch.equal(flashattn.flash_attn_func(qt, k, v), plain)
    assert torch.equal(flashattn.flash_attn_func(q, k, v, window_size=(3, 0)),
                       fresh(lambda: flashattn.flash_attn_func(q, k, v, window_size=(3, 0))))


def test_backward_reuse_matches_fresh_gradients():
    def grads(t, dout):
        leaves = [x.clone().requires_grad_() for x in t]
        out = flashattn.flash_attn_func(*leaves, causal=True)
        return torch.autograd.grad(out, leaves, dout)

    sets = [qkv(6), qkv(7)]
    douts = [torch.randn_like(t[0]) for t in sets]
    expected = [fresh(lambda t=t, d=d: grads(t, d)) for t, d in zip(sets, douts)]
    fresh(lambda: None)
    for _ in range(2):
        for t, d, e in zip(sets, douts, expected):
            for g, r in zip(grads(t, d), e):
                assert torch.equal(g, r)


def test_dropout_seed_changes_between_reused_calls():
    q, k, v = qkv(8)
    p = 0.3
    _capi._prepared_calls.__dict__.pop("calls", None)
    outs = []
    for seed in (11, 12, 11):
        torch.manual_seed(seed)
        outs.append(flashattn.flash_attn_func(q, k, v, dropout_p=p))
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])
    torch.manual_seed(12)
    assert torch.equal(fresh(lambda: flashattn.flash_attn_func(q, k, v, dropout_p=p)), outs[1])


def test_kvcache_reuse_with_other_caches_and_lengths():
    g = torch.Generator().manual_seed(9)

    def case(n0):
        q = torch.randn(2, 1, 8, 64, generator=g)
        kc, vc = (torch.randn(2, 40, 2, 64, generator=g) for _ in range(2))
        kn, vn = (torch.randn(2, 1, 2, 64, generator=g) for _ in range(2))
        lens = torch.tensor([n0, 39 - n0], dtype=torch.int32)
        return q, kc, vc, kn, vn, lens

    def call(c):
        q, kc, vc, kn, vn, lens = c
        kc, vc = kc.clone(), vc.clone()
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
        return out, kc, vc

    cases = [case(5), case(30), case(17)]
    expected = [fresh(lambda c=c: call(c)) for c in cases]
    fresh(lambda: None)
    for _ in range(2):
        for c, e in zip(cases, expected):
            for got, want in zip(call(c), e):
                assert torch.equal(got, want)


def test_reused_call_is_still_validated():
    q, k, v = qkv(10)
    out = torch.empty_like(q)
    _capi.forward(q, k, v, out)
    with pytest.raises(_capi.InvalidArgumentError):
        _capi.forward(q, k, v, q)  # out aliasing q: the same key, refused by the library


def test_threads_keep_their_own_prepared_calls():
    sets = [qkv(20 + i) for i in range(4)]
    expected = [fresh(lambda t=t: flashattn.flash_attn_func(*t, causal=True)) for t in sets]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                if not torch.equal(flashattn.flash_attn_func(*sets[i], causal=True), expected[i]):
                    errors.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_kvcache_int_lengths_reuse_one_key_and_are_checked():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 1, 4, 64, generator=g)
    kc, vc = (torch.randn(1, 50, 2, 64, generator=g) for _ in range(2))
    expected = {n: fresh(lambda n=n: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n)) for n in (3, 17, 50)}
    fresh(lambda: None)
    for n in (3, 17, 50, 17):  # a decode loop with an int length: one key, the length set per call
        assert torch.equal(flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n), expected[n])
    assert len(_capi._prepared_calls.calls) == 1
    with pytest.raises(_capi.InvalidArgumentError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=2 ** 32 + 3)  # not truncated to 3
