"""flash_attn_with_kvcache: the NumPy path (CPU backend) and torch (CPU, torch.compile;
CUDA: CUDA-graph capture and replay), against a float64 reference that gathers each
sequence's keys from the cache the way flash-attn defines it."""

import numpy as np
import pytest

import _reference as ref
import flashattn
from flashattn import _capi

ROTARY_BASE = 10000.0


def rotary_tables(seqlen_ro, rotary_dim, dtype=np.float32):
    i = np.arange(rotary_dim // 2)
    angle = np.arange(seqlen_ro)[:, None] * ROTARY_BASE ** (-2.0 * i / rotary_dim)[None, :]
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rotate(x, cos, sin, positions, interleaved):
    """x (s, h, d) rotated at positions (s,) in float64."""
    x = np.asarray(x, np.float64).copy()
    rd = 2 * cos.shape[1]
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    if interleaved:
        x0, x1 = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., : rd // 2].copy(), x[..., rd // 2: rd].copy()
        x[..., : rd // 2], x[..., rd // 2: rd] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


class Cache:
    """A random cache (contiguous, or paged with a shuffled block table) and new tokens."""

    def __init__(self, rng, lengths, seqlen_q, hq, hkv, d, new=0, page=0, rotary_dim=0,
                 interleaved=False):
        b = len(lengths)
        self.lengths, self.new, self.page = np.array(lengths, np.int32), new, page
        self.capacity = max(lengths) + new + 3
        self.q = rng.standard_normal((b, seqlen_q, hq, d)).astype(np.float32)
        if page:
            self.max_blocks = -(-self.capacity // page)
            pool = rng.permutation(b * self.max_blocks + 2).astype(np.int32)
            self.block_table = pool[: b * self.max_blocks].reshape(b, self.max_blocks).copy()
            shape = (len(pool), page, hkv, d)
        else:
            self.block_table = None
            shape = (b, self.capacity, hkv, d)
        self.k_cache = rng.standard_normal(shape).astype(np.float32)
        self.v_cache = rng.standard_normal(shape).astype(np.float32)
        self.k = rng.standard_normal((b, new, hkv, d)).astype(np.float32) if new else None
        self.v = rng.standard_normal((b, new, hkv, d)).astype(np.float32) if new else None
        self.rotary = rotary_tables(self.capacity + seqlen_q, rotary_dim) if rotary_dim else None
        self.interleaved = interleaved

    def rows(self, cache, b, n):
        """The first n keys of sequence b in `cache`, (n, hkv, d)."""
        if self.block_table is None:
            return cache[b, :n]
        j = np.arange(n)
        return cache[self.block_table[b, j // self.page], j % self.page]

    def expected(self, causal, window, softcap):
        """(out, lse, k_cache_after, v_cache_after) in float64 / the caches' values."""
        kc, vc = self.k_cache.copy(), self.v_cache.copy()
        outs, lses = [], []
        masked = causal or window != (-1, -1)
        for b, n in enumerate(self.lengths):
            q = self.q[b]
            k = self.rows(self.k_cache, b, n).astype(np.float64)
            v = self.rows(self.v_cache, b, n).astype(np.float64)
            if self.new:
                pos = n + np.arange(self.new)
                kn = self.k[b].astype(np.float64)
                if self.rotary is not None:
                    kn = rotate(kn, *self.rotary, pos, self.interleaved)
                    qpos = n + np.arange(q.shape[0]) if masked else np.full(q.shape[0], n)
                    q = rotate(q, *self.rotary, qpos, self.interleaved)
                k, v = np.concatenate([k, kn]), np.concatenate([v, self.v[b]])
                for i, p in enumerate(pos):
                    if self.block_table is None:
                        kc[b, p], vc[b, p] = kn[i], self.v[b, i]
                    else:
                        page = self.block_table[b, p // self.page]
                        kc[page, p % self.page], vc[page, p % self.page] = kn[i], self.v[b, i]
            o, l = ref.forward_one(q, k, v, causal=causal, window=window, softcap=softcap)
            outs.append(o)
            lses.append(l)
        return np.stack(outs), np.stack(lses), kc, vc

    def kwargs(self):
        kw = dict(k=self.k, v=self.v, cache_seqlens=self.lengths, block_table=self.block_table)
        if self.rotary is not None:
            kw.update(rotary_cos=self.rotary[0], rotary_sin=self.rotary[1],
                      rotary_interleaved=self.interleaved)
        return kw


CASES = [
    # lengths, seqlen_q, hq, hkv, d, new, page, rotary_dim, interleaved, causal, window, softcap
    ([1], 1, 4, 1, 64, 0, 0, 0, False, False, (-1, -1), 0.0),
    ([113, 0, 7], 1, 8, 2, 64, 1, 16, 0, False, False, (-1, -1), 0.0),
    ([15, 40], 5, 4, 4, 32, 5, 16, 0, False, True, (-1, -1), 0.0),      # appends cross a page
    ([300, 21], 2, 8, 1, 128, 2, 1, 0, False, True, (-1, -1), 10.0),    # page size 1, MQA
    ([64, 200], 16, 4, 2, 64, 16, 64, 32, False, True, (-1, -1), 0.0),  # rotary (GPT-NeoX)
    ([9, 50], 3, 2, 1, 64, 3, 0, 16, True, False, (8, 0), 0.0),         # rotary interleaved
    ([257], 1, 4, 2, 256, 1, 256, 64, True, False, (-1, -1), 0.0),      # rotary at one position
]


@pytest.mark.parametrize("lengths,sq,hq,hkv,d,new,page,rd,inter,causal,window,softcap", CASES)
def test_numpy_matches_reference(rng, lengths, sq, hq, hkv, d, new, page, rd, inter, causal,
                                 window, softcap):
    c = Cache(rng, lengths, sq, hq, hkv, d, new, page, rd, inter)
    eo, el, ek, ev = c.expected(causal, window, softcap)
    out, lse = flashattn.flash_attn_with_kvcache(
        c.q, c.k_cache, c.v_cache, causal=causal, window_size=window, softcap=softcap,
        return_softmax_lse=True, **c.kwargs())
    np.testing.assert_allclose(out, eo, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(lse, el, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c.k_cache, ek, rtol=1e-6, atol=1e-6)  # appended keys rotated
    np.testing.assert_array_equal(c.v_cache, ev)                      # values copied


def test_numpy_one_length_and_cache_rows(rng):
    c = Cache(rng, [30, 30], 1, 2, 1, 64, new=1)
    eo, _, ek, _ = c.expected(False, (-1, -1), 0.0)
    kw = c.kwargs()
    kw["cache_seqlens"] = 30  # one int for the batch
    out = flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, **kw)
    np.testing.assert_allclose(out, eo, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(c.k_cache, ek, rtol=1e-6, atol=1e-6)
    # cache_batch_idx: sequence b lives in cache row idx[b].
    c2 = Cache(rng, [12, 5], 1, 2, 1, 64)
    idx = np.array([1, 0], np.int32)
    out2 = flashattn.flash_attn_with_kvcache(c2.q, c2.k_cache, c2.v_cache,
                                             cache_seqlens=c2.lengths[::-1].copy(),
                                             cache_batch_idx=idx)
    for b in range(2):
        n = c2.lengths[::-1][b]
        o, _ = ref.forward_one(c2.q[b], c2.k_cache[idx[b], :n], c2.v_cache[idx[b], :n])
        np.testing.assert_allclose(out2[b], o, rtol=1e-4, atol=3e-5)


def test_bad_indices_are_clear_errors_and_leave_the_cache(rng):
    c = Cache(rng, [20, 5], 1, 2, 1, 64, new=1, page=16)
    before = c.k_cache.copy()
    c.block_table[1, 0] = c.k_cache.shape[0]
    with pytest.raises(flashattn.InvalidArgumentError, match="outside the pool"):
        flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, **c.kwargs())
    np.testing.assert_array_equal(c.k_cache, before)
    c = Cache(rng, [20, 5], 1, 2, 1, 64, new=1, page=16)
    c.lengths[0] = c.max_blocks * 16
    with pytest.raises(flashattn.InvalidArgumentError, match="capacity"):
        flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, **c.kwargs())
    c.lengths[0] = -1
    with pytest.raises(flashattn.InvalidArgumentError, match="negative"):
        flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, **c.kwargs())
    with pytest.raises(NotImplementedError):
        flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cache_leftpad=c.lengths)


def test_workspace_size_and_buffer(rng):
    c = Cache(rng, [40], 1, 4, 2, 64, new=1, page=16, rotary_dim=32)
    kw = c.kwargs()
    n = _capi.forward_kvcache_workspace_size(c.q, c.k_cache, c.v_cache, **kw)
    assert n > 0
    eo, _, _, _ = c.expected(False, (-1, -1), 0.0)
    out = np.empty_like(c.q)
    with pytest.raises(flashattn.InvalidArgumentError, match="workspace"):
        _capi.forward_kvcache(c.q, c.k_cache, c.v_cache, out, workspace=np.empty(n - 1, np.uint8),
                              **kw)
    _capi.forward_kvcache(c.q, c.k_cache, c.v_cache, out, workspace=np.empty(n, np.uint8), **kw)
    np.testing.assert_allclose(out, eo, rtol=1e-4, atol=3e-5)


# ---------------------------------------------------------------------------- torch

try:
    import torch
except ImportError:  # NumPy-only environments run the tests above
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")


def to_torch(x, device, dtype=None):
    if x is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    return t.to(dtype or torch.float32) if t.is_floating_point() else t


def torch_call(c, device, dtype, causal=False, window=(-1, -1), softcap=0.0, fn=None):
    kw = {k: to_torch(v, device, dtype) if isinstance(v, np.ndarray) else v
          for k, v in c.kwargs().items()}
    kc, vc = to_torch(c.k_cache, device, dtype), to_torch(c.v_cache, device, dtype)
    q = to_torch(c.q, device, dtype)
    fn = fn or flashattn.flash_attn_with_kvcache
    out, lse = fn(q, kc, vc, causal=causal, window_size=window, softcap=softcap,
                  return_softmax_lse=True, **kw)
    return out, lse, kc, vc


@needs_torch
@pytest.mark.parametrize("case", [1, 2, 4, 5])
def test_torch_cpu_matches_reference(rng, case):
    lengths, sq, hq, hkv, d, new, page, rd, inter, causal, window, softcap = CASES[case]
    c = Cache(rng, lengths, sq, hq, hkv, d, new, page, rd, inter)
    eo, el, ek, ev = c.expected(causal, window, softcap)
    out, lse, kc, vc = torch_call(c, "cpu", torch.float32, causal, window, softcap)
    np.testing.assert_allclose(out.numpy(), eo, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(lse.numpy(), el, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kc.numpy(), ek, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(vc.numpy(), ev)


@needs_torch
def test_torch_compile_fullgraph_matches_eager(rng):
    c = Cache(rng, [33, 70], 2, 4, 2, 64, new=2, page=16, rotary_dim=32)
    eo, _, ek, _ = c.expected(True, (-1, -1), 0.0)
    compiled = torch.compile(flashattn.flash_attn_with_kvcache, fullgraph=True)
    out, _, kc, _ = torch_call(c, "cpu", torch.float32, causal=True, fn=compiled)
    np.testing.assert_allclose(out.numpy(), eo, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(kc.numpy(), ek, rtol=1e-6, atol=1e-6)


@needs_torch
def test_torch_op_is_registered_with_its_mutations():
    schema = str(torch.ops.flashattn.fwd_kvcache.default._schema)
    assert "Tensor(a1!) k_cache" in schema and "Tensor(a2!) v_cache" in schema


def gpu_test(f):
    cuda = torch is not None and torch.cuda.is_available()
    f = pytest.mark.skipif(cuda and not flashattn.backend_available("cuda"),
                           reason="libflashattn built without CUDA")(f)
    f = pytest.mark.skipif(not cuda, reason="needs PyTorch with a CUDA device")(f)
    return pytest.mark.gpu(f)


def _rounded(c, dt):
    """c with its inputs (and rotary tables) rounded to dt, as the GPU sees them, so that
    c.expected() is the float64 reference of the call in dt."""
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        x = getattr(c, name)
        if x is not None:
            setattr(c, name, torch.from_numpy(x).to(dt).float().numpy())
    if c.rotary is not None:
        c.rotary = tuple(torch.from_numpy(t).to(dt).float().numpy() for t in c.rotary)
    return c


@gpu_test
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_matches_reference(rng, case, dtype):
    dt = getattr(torch, dtype)
    lengths, sq, hq, hkv, d, new, page, rd, inter, causal, window, softcap = CASES[case]
    # The reference sees the inputs as the GPU does: rounded to the dtype.
    c = _rounded(Cache(rng, lengths, sq, hq, hkv, d, new, page, rd, inter), dt)
    eo, el, ek, ev = c.expected(causal, window, softcap)
    out, lse, kc, vc = torch_call(c, "cuda", dt, causal, window, softcap)
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    np.testing.assert_allclose(out.float().cpu().numpy(), eo, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), el, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(kc.float().cpu().numpy(), ek, rtol=tol, atol=tol)
    np.testing.assert_array_equal(vc.float().cpu().numpy(), ev)


@gpu_test
def test_cuda_graph_capture_and_replay_with_new_lengths(rng):
    c = Cache(rng, [100, 7, 600], 1, 8, 2, 128, new=1, page=16)
    dev, dt = "cuda", torch.bfloat16
    q, kc, vc = (to_torch(x, dev, dt) for x in (c.q, c.k_cache, c.v_cache))
    k, v = to_torch(c.k, dev, dt), to_torch(c.v, dev, dt)
    lens = to_torch(c.lengths, dev)
    table = to_torch(c.block_table, dev)
    step = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens,
                                                     block_table=table, causal=True)
    step()  # eager warm-up: appends once, at the initial lengths
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        lens += 1
        graph.replay()
        torch.cuda.synchronize()
        c.k_cache, c.v_cache = kc.float().cpu().numpy(), vc.float().cpu().numpy()
        # Rows [0, lens) are as before the replay; it appended its token at lens.
        c.lengths = lens.cpu().numpy().astype(np.int32)
        c.k, c.v = k.float().cpu().numpy(), v.float().cpu().numpy()
        c.q = q.float().cpu().numpy()
        eo, _, _, _ = c.expected(True, (-1, -1), 0.0)
        np.testing.assert_allclose(out.float().cpu().numpy(), eo, rtol=2e-2, atol=2e-2)


@gpu_test
def test_cuda_index_check_waits_for_the_calls_stream(rng):
    # The host check must read cache_seqlens as the call's stream leaves them: here a side
    # (non-blocking) stream is held up, then writes valid lengths over invalid ones, then
    # makes the call. A check that read them elsewhere (the legacy stream) saw the old ones.
    c = Cache(rng, [30, 70], 1, 8, 2, 64, new=1)
    dev, dt = "cuda", torch.bfloat16
    q, kc, vc, k, v = (to_torch(x, dev, dt) for x in (c.q, c.k_cache, c.v_cache, c.k, c.v))
    good = to_torch(c.lengths, dev)
    lens = torch.full_like(good, 1 << 30)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        lens.copy_(good)
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
    torch.cuda.synchronize()
    c.q, c.k, c.v = (x.float().cpu().numpy() for x in (q, k, v))
    c.k_cache = torch.from_numpy(c.k_cache).to(dt).float().numpy()
    c.v_cache = torch.from_numpy(c.v_cache).to(dt).float().numpy()
    eo, _, _, _ = c.expected(True, (-1, -1), 0.0)
    np.testing.assert_allclose(out.float().cpu().numpy(), eo, rtol=2e-2, atol=2e-2)


def _expected_with_extras(c, causal, slopes, sinks):
    """out, lse of a Cache's call with ALiBi slopes (batch, hq) or (hq) and sinks (hq) in float64
    (test_variants' reference: the sink as one more softmax column; new tokens appended)."""
    from test_variants import ref_forward_one
    outs, lses = [], []
    hq, hkv = c.q.shape[2], c.k_cache.shape[2]
    for b, n in enumerate(c.lengths):
        k, v = c.rows(c.k_cache, b, n), c.rows(c.v_cache, b, n)
        if c.new:
            k, v = np.concatenate([k, c.k[b]]), np.concatenate([v, c.v[b]])
        o, l_ = ref_forward_one(c.q[b], np.repeat(k, hq // hkv, 1), np.repeat(v, hq // hkv, 1), causal,
                                None if slopes is None else (slopes[b] if slopes.ndim == 2 else slopes), sinks)
        outs.append(o)
        lses.append(l_)
    return np.stack(outs), np.stack(lses)


@pytest.mark.parametrize("causal,page,alibi,sinks", [(False, 0, True, True), (True, 16, True, False),
                                                     (False, 16, False, True)])
def test_numpy_alibi_and_sinks_match_reference(rng, causal, page, alibi, sinks):
    c = Cache(rng, [40, 0, 7], 3, 4, 2, 64, new=3, page=page)
    slopes = (0.1 * rng.standard_normal((3, 4))).astype(np.float32) if alibi else None
    sink = rng.standard_normal(4).astype(np.float32) if sinks else None
    eo, el = _expected_with_extras(c, causal, slopes, sink)
    out, lse = flashattn.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, causal=causal, alibi_slopes=slopes,
                                                 sinks=sink, return_softmax_lse=True, **c.kwargs())
    np.testing.assert_allclose(out, eo, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(lse, el, rtol=1e-5, atol=1e-5)


@needs_torch
def test_torch_cpu_alibi_and_sinks_eager_and_compiled(rng):
    c = Cache(rng, [33, 70], 2, 4, 2, 64, new=2, page=16)
    slopes = (0.1 * rng.standard_normal((2, 4))).astype(np.float32)
    sink = rng.standard_normal(4).astype(np.float32)
    eo, el = _expected_with_extras(c, True, slopes, sink)
    kw = dict(alibi_slopes=torch.from_numpy(slopes), sinks=torch.from_numpy(sink))
    for fn in (flashattn.flash_attn_with_kvcache, torch.compile(flashattn.flash_attn_with_kvcache, fullgraph=True)):
        # torch_call copies the caches into torch tensors: each call appends into fresh ones.
        out, lse, _, _ = torch_call(c, "cpu", torch.float32, causal=True, fn=lambda *a, **k: fn(*a, **k, **kw))
        np.testing.assert_allclose(out.numpy(), eo, rtol=1e-4, atol=3e-5)
        np.testing.assert_allclose(lse.numpy(), el, rtol=1e-5, atol=1e-5)


@gpu_test
@pytest.mark.parametrize("causal,page,slopes_shape,sinks,splits", [
    (False, 0, "batch", True, 0), (True, 16, "head", True, 0), (True, 64, "batch", False, 5),
    (False, 16, None, True, 1), (True, 0, "head", True, 7)])
def test_cuda_alibi_and_sinks_match_reference(rng, causal, page, slopes_shape, sinks, splits):
    """The decode kernel's ALiBi and sinks (one split: its epilogue; several: the combine)."""
    dt = torch.bfloat16
    c = Cache(rng, [700, 0, 1], 3, 8, 2, 128, new=3, page=page)
    # The reference sees the inputs as the GPU does: rounded to the dtype.
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        setattr(c, name, torch.from_numpy(getattr(c, name)).to(dt).float().numpy())
    shape = {"batch": (3, 8), "head": (8,), None: None}[slopes_shape]
    slopes = None if shape is None else (0.05 * rng.standard_normal(shape)).astype(np.float32)
    sink = rng.standard_normal(8).astype(np.float32) if sinks else None
    eo, el = _expected_with_extras(c, causal, slopes, sink)
    kw = dict(alibi_slopes=to_torch(slopes, "cuda"), sinks=to_torch(sink, "cuda"), num_splits=splits)
    out, lse, _, _ = torch_call(c, "cuda", dt, causal, fn=lambda *a, **k: flashattn.flash_attn_with_kvcache(
        *a, **k, **kw))
    np.testing.assert_allclose(out.float().cpu().numpy(), eo, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse.cpu().numpy(), el, rtol=1e-3, atol=1e-3)


# ------------------------------------------------- torch.compile on CUDA, opcheck of the op


COMPILE_CASES = [
    # lengths, seqlen_q, hq, hkv, d, new, page, rotary_dim, interleaved, causal
    ([100, 7, 600], 1, 8, 2, 128, 1, 0, 64, False, True),     # contiguous, one decode step
    ([64, 200], 4, 8, 2, 64, 4, 16, 32, True, True),          # paged, appends cross a page
    ([300, 21], 2, 8, 1, 128, 2, 1, 128, False, False),       # page size 1, full rotary, MQA
    ([500, 130], 80, 8, 2, 128, 80, 64, 128, False, True),    # 80-row chunk (sm_90: forward route)
]


@gpu_test
@pytest.mark.parametrize("lengths,sq,hq,hkv,d,new,page,rd,inter,causal", COMPILE_CASES)
def test_cuda_compile_fullgraph_matches_eager_and_reference(rng, lengths, sq, hq, hkv, d, new,
                                                            page, rd, inter, causal):
    """torch.compile(fullgraph=True) (inductor) of flash_attn_with_kvcache on CUDA tensors: the
    traced op appends the rotated new keys and the values into the caches (the graph's inputs) as
    the eager call does, and out / lse match the eager call and the float64 reference."""
    dt = torch.bfloat16
    c = _rounded(Cache(rng, lengths, sq, hq, hkv, d, new, page, rd, inter), dt)
    eo, el, ek, ev = c.expected(causal, (-1, -1), 0.0)
    torch._dynamo.reset()
    compiled = torch.compile(flashattn.flash_attn_with_kvcache, fullgraph=True)
    # torch_call copies the caches afresh: each call appends into its own.
    want = torch_call(c, "cuda", dt, causal)
    got = torch_call(c, "cuda", dt, causal, fn=compiled)
    torch.cuda.synchronize()
    for name, g, w in zip(("out", "lse", "k_cache", "v_cache"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        torch.testing.assert_close(g, w, msg=lambda m: f"{name}, compiled against eager: {m}")
    out, lse, kc, vc = (t.float().cpu().numpy() for t in got)
    np.testing.assert_allclose(out, eo, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse, el, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(kc, ek, rtol=2e-2, atol=2e-2)  # appended keys rotated
    np.testing.assert_array_equal(vc, ev)                      # values copied, nothing else moved


OPCHECK_CASES = {
    # Cache(lengths, seqlen_q, hq, hkv, d, new, page, rotary_dim, interleaved), causal, extras
    "paged_rotary_append": (([33, 70], 2, 4, 2, 64, 2, 16, 32, False), True, False),
    "contiguous_append_alibi_sinks": (([20, 9, 41], 3, 4, 1, 64, 3, 0, 0, False), False, True),
    "no_new_tokens": (([50, 1], 1, 8, 2, 128, 0, 64, 0, False), True, False),
}


def _opcheck_fwd_kvcache(rng, device, dtype, case):
    cache_args, causal, extras = OPCHECK_CASES[case]
    c = Cache(rng, *cache_args)
    t = lambda x: to_torch(x, device, dtype)  # noqa: E731
    hq, d = c.q.shape[2], c.q.shape[3]
    cos, sin = (None, None) if c.rotary is None else (t(c.rotary[0]), t(c.rotary[1]))
    slopes = sinks = None
    if extras:
        slopes = torch.rand(len(c.lengths), hq, device=device) * 0.2
        sinks = torch.randn(hq, device=device)
    args = (t(c.q), t(c.k_cache), t(c.v_cache), t(c.k), t(c.v), cos, sin, t(c.lengths), 0, None,
            t(c.block_table), d ** -0.5, causal, -1, -1, 0.0, c.interleaved, 0, slopes, sinks)
    # All of opcheck's default tests (test_schema, test_autograd_registration, test_faketensor,
    # test_aot_dispatch_dynamic) pass on the CPU backend: none is left out. They can fail here:
    # test_schema runs the op and fails if it writes k_cache / v_cache without declaring them in
    # mutates_args (or writes anything else), test_faketensor if the fake's out / lse shapes or
    # dtypes differ from the real call's, test_aot_dispatch_dynamic if the functionalized op
    # (torch.compile's view of a mutating op) gives other outputs or cache contents than eager.
    # The appends write the same rows on every run (cache_seqlens stay), so reruns agree.
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, args)


@needs_torch
@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_torch_opcheck_fwd_kvcache_cpu(rng, case):
    _opcheck_fwd_kvcache(rng, "cpu", torch.float32, case)


@gpu_test
@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_cuda_opcheck_fwd_kvcache(rng, case):
    _opcheck_fwd_kvcache(rng, "cuda", torch.bfloat16, case)
