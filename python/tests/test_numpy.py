"""The ctypes binding (flashattn._capi) and the NumPy path, CPU backend, against the
float64 reference in _reference.py. Needs only NumPy."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import _reference as ref
import flashattn
from flashattn import _capi


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def make_qkv(rng, b, sq, sk, hq, hkv, d, dtype=np.float32):
    return (randn(rng, b, sq, hq, d, dtype=dtype), randn(rng, b, sk, hkv, d, dtype=dtype),
            randn(rng, b, sk, hkv, d, dtype=dtype))


CASES = [
    # b, sq, sk, hq, hkv, d, causal, window, softcap
    (2, 33, 33, 4, 4, 64, False, (-1, -1), 0.0),
    (2, 33, 47, 4, 2, 64, True, (-1, -1), 0.0),     # causal, bottom-right, GQA
    (1, 50, 20, 6, 1, 32, True, (-1, -1), 0.0),     # sq > sk: rows with no key, MQA
    (2, 40, 40, 2, 2, 128, False, (8, 3), 0.0),     # sliding window
    (1, 29, 61, 4, 2, 16, False, (5, -1), 0.0),     # left window only
    (2, 37, 37, 2, 1, 64, True, (-1, -1), 30.0),    # softcap
    (1, 24, 40, 2, 2, 256, False, (10, 10), 5.0),   # largest head dim, window + softcap
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window,softcap", CASES)
def test_forward_matches_reference(rng, b, sq, sk, hq, hkv, d, causal, window, softcap):
    q, k, v = make_qkv(rng, b, sq, sk, hq, hkv, d)
    out = np.empty_like(q)
    lse = np.empty((b, hq, sq), np.float32)
    _capi.forward(q, k, v, out, lse, causal=causal, window_size=window, softcap=softcap)
    ro, rl = ref.forward(q, k, v, causal=causal, window=window, softcap=softcap)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)  # -inf rows compare equal


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window,softcap", CASES)
def test_backward_matches_reference(rng, b, sq, sk, hq, hkv, d, causal, window, softcap):
    q, k, v = make_qkv(rng, b, sq, sk, hq, hkv, d)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out = np.empty_like(q)
    lse = np.empty((b, hq, sq), np.float32)
    _capi.forward(q, k, v, out, lse, **kw)
    dout = randn(rng, *q.shape)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    nbytes = _capi.backward_workspace_size(q, k, v, **kw)
    ws = np.empty(nbytes, np.uint8)
    _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, workspace=ws, **kw)
    rq, rk, rv = ref.backward(q, k, v, dout, causal=causal, window=window, softcap=softcap)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_reference_backward_agrees_with_finite_differences(rng):
    # The analytic reference gradients, checked once numerically (softcap, GQA, window).
    q = rng.standard_normal((5, 4, 8))
    k = rng.standard_normal((7, 2, 8))
    v = rng.standard_normal((7, 2, 8))
    dout = rng.standard_normal((5, 4, 8))
    kw = dict(scale=0.4, causal=True, window=(3, -1), softcap=2.0)
    grads = ref.backward_one(q, k, v, dout, **kw)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        for idx in [(0, 0, 0), (2, 1, 3), (x.shape[0] - 1, x.shape[1] - 1, 7)]:
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            args_p = [xp if t is x else t for t in (q, k, v)]
            args_m = [xm if t is x else t for t in (q, k, v)]
            fp = (ref.forward_one(*args_p, **kw)[0] * dout).sum()
            fm = (ref.forward_one(*args_m, **kw)[0] * dout).sum()
            assert abs((fp - fm) / (2 * eps) - g[idx]) < 1e-6


def test_float16_forward(rng):
    q, k, v = make_qkv(rng, 2, 40, 52, 4, 2, 64, dtype=np.float16)
    out = np.empty_like(q)
    _capi.forward(q, k, v, out, None, causal=True)
    ro, _ = ref.forward(q, k, v, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), ro, rtol=1e-2, atol=2e-3)


def test_strided_inputs_and_outputs(rng):
    # q, k, v as views of one packed (b, s, 3, h, d) array; out a view of a wider buffer.
    qkv = randn(rng, 2, 30, 3, 4, 32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    wide = np.zeros((2, 30, 4, 48), np.float32)
    out = wide[..., 8:40]
    lse = np.empty((2, 4, 30), np.float32)
    _capi.forward(q, k, v, out, lse, causal=True)
    ro, rl = ref.forward(q, k, v, causal=True)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    assert not wide[..., :8].any() and not wide[..., 40:].any()


def test_softmax_scale(rng):
    q, k, v = make_qkv(rng, 1, 16, 16, 2, 2, 32)
    out = np.empty_like(q)
    _capi.forward(q, k, v, out, softmax_scale=0.3)
    ro, _ = ref.forward(q, k, v, scale=0.3)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)


def test_varlen_forward_backward(rng):
    lens_q = [7, 0, 19, 33]
    lens_k = [12, 5, 19, 20]
    cu_q, cu_k = ref.cu_seqlens(lens_q), ref.cu_seqlens(lens_k)
    hq, hkv, d = 4, 2, 64
    q = randn(rng, cu_q[-1], hq, d)
    k = randn(rng, cu_k[-1], hkv, d)
    v = randn(rng, cu_k[-1], hkv, d)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
              max_seqlen_k=max(lens_k), causal=True, window_size=(16, -1))
    out = np.empty_like(q)
    lse = np.empty((hq, q.shape[0]), np.float32)
    _capi.forward(q, k, v, out, lse, **kw)
    ro, rl = ref.forward_varlen(q, k, v, cu_q, cu_k, causal=True, window=(16, -1))
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)
    dout = randn(rng, *q.shape)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, **kw)  # library-allocated workspace
    grads = ref.backward_varlen(q, k, v, dout, cu_q, cu_k, causal=True, window=(16, -1))
    for got, want in zip((dq, dk, dv), grads):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_flash_attn_func_numpy(rng):
    q, k, v = make_qkv(rng, 2, 21, 34, 4, 2, 40)  # head_dim 40
    out, lse, s = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(9, 2),
                                            softcap=10.0, return_attn_probs=True)
    ro, rl = ref.forward(q, k, v, causal=True, window=(9, 2), softcap=10.0)
    np.testing.assert_allclose(out, ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)
    assert s is None


def test_flash_attn_func_numpy_pads_odd_head_dim(rng):
    q, k, v = make_qkv(rng, 1, 17, 17, 2, 2, 20)  # 20 is not a multiple of 8
    out = flashattn.flash_attn_func(q, k, v)
    assert out.shape == q.shape
    np.testing.assert_allclose(out, ref.forward(q, k, v)[0], rtol=1e-4, atol=2e-5)


def test_flash_attn_varlen_func_numpy(rng):
    lens = [5, 11, 3]
    cu = ref.cu_seqlens(lens)
    q = randn(rng, cu[-1], 2, 32)
    k = randn(rng, cu[-1], 2, 32)
    v = randn(rng, cu[-1], 2, 32)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    np.testing.assert_allclose(out, ref.forward_varlen(q, k, v, cu, cu, causal=True)[0],
                               rtol=1e-4, atol=2e-5)


def test_workspace_queries(rng):
    q, k, v = make_qkv(rng, 2, 64, 64, 4, 4, 64)
    fw = _capi.forward_workspace_size(q, k, v)
    bw = _capi.backward_workspace_size(q, k, v, causal=True)
    assert isinstance(fw, int) and isinstance(bw, int) and fw >= 0 and bw >= 0
    # never O(seqlen^2): a 4x longer sequence does not need 16x the forward workspace
    q4, k4, v4 = make_qkv(rng, 2, 256, 256, 4, 4, 64)
    assert _capi.forward_workspace_size(q4, k4, v4) < 16 * max(fw, 1)


def test_too_small_workspace_is_an_error(rng):
    q, k, v = make_qkv(rng, 1, 32, 32, 2, 2, 64)
    out, lse = np.empty_like(q), np.empty((1, 2, 32), np.float32)
    _capi.forward(q, k, v, out, lse)
    need = _capi.backward_workspace_size(q, k, v)
    if need == 0:
        pytest.skip("the CPU backward needs no workspace for this shape")
    ws = np.empty(need - 1, np.uint8)
    g = [np.empty_like(t) for t in (q, k, v)]
    with pytest.raises(ValueError, match="workspace has"):
        _capi.backward(q, k, v, out, out, lse, *g, workspace=ws)


def test_info():
    assert flashattn.library_version() == "0.1.0"
    # The commit is a git hash (maybe "+dirty") or "unknown" for a build outside git.
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?|unknown", flashattn.library_commit())
    assert flashattn.backend_available("cpu")
    assert flashattn.backend_unavailable_reason("cpu") == ""
    assert os.path.exists(flashattn.library_path())
    if not flashattn.backend_available("cuda"):
        assert flashattn.backend_unavailable_reason("cuda")


# ----------------------------------------------------------------------------
# Errors


def _fwd(q, k, v, **kw):
    out = np.empty_like(q)
    _capi.forward(q, k, v, out, **kw)


def test_error_mismatched_head_dim(rng):
    q, k, v = make_qkv(rng, 1, 8, 8, 2, 2, 32)
    k2 = randn(rng, 1, 8, 2, 64)
    with pytest.raises(ValueError, match="head_dim of k") as e:
        _fwd(q, k2, k2)
    assert isinstance(e.value, flashattn.InvalidArgumentError)
    assert e.value.status == 1


def test_error_heads_not_multiple(rng):
    q = randn(rng, 1, 8, 3, 32)
    k = randn(rng, 1, 8, 2, 32)
    with pytest.raises(ValueError, match=r"heads_q \(3\) must be a multiple of heads_kv \(2\)"):
        _fwd(q, k, k)


def test_error_unsupported_head_dim(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 264)
    with pytest.raises(NotImplementedError, match="head_dim 264 is not supported"):
        _fwd(q, k, v)


def test_error_unsupported_dtype(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32, dtype=np.float64)
    with pytest.raises(NotImplementedError, match="float32, float16 and bfloat16"):
        _fwd(q, k, v)


def test_error_mixed_dtypes(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32)
    with pytest.raises(ValueError, match="mixed dtypes"):
        _fwd(q, k.astype(np.float16), v)


def test_error_bad_window_and_scale(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32)
    with pytest.raises(ValueError, match="window sizes must be >= -1"):
        _fwd(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="softmax_scale must be > 0"):
        _fwd(q, k, v, softmax_scale=0.0)
    with pytest.raises(ValueError, match="softcap must be finite"):
        _fwd(q, k, v, softcap=-1.0)


def test_error_lse_shape(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 2, 2, 32)
    with pytest.raises(ValueError, match=r"lse shape \(1, 4, 2\) must be"):
        _capi.forward(q, k, v, np.empty_like(q), np.empty((1, 4, 2), np.float32))


def test_error_readonly_output(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32)
    out = np.empty_like(q)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        _capi.forward(q, k, v, out)


def test_error_non_contiguous_last_dim(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 64)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        _fwd(q[..., ::2], k[..., ::2], v[..., ::2])


def test_error_varlen_cu_seqlens(rng):
    q = randn(rng, 10, 2, 32)
    cu = np.array([0, 4, 9], np.int32)  # ends at 9, q has 10 rows
    with pytest.raises(ValueError, match="does not match total tokens 10"):
        _capi.forward(q, q, q, np.empty_like(q), cu_seqlens_q=cu, cu_seqlens_k=cu,
                      max_seqlen_q=5, max_seqlen_k=5)
    with pytest.raises(ValueError, match="must be int32"):
        _capi.forward(q, q, q, np.empty_like(q), cu_seqlens_q=cu.astype(np.int64),
                      cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    cu = np.array([0, 4, 10], np.int32)
    with pytest.raises(ValueError, match="has length 6 > max_seqlen 5"):
        _capi.forward(q, q, q, np.empty_like(q), cu_seqlens_q=cu, cu_seqlens_k=cu,
                      max_seqlen_q=5, max_seqlen_k=6)


def test_error_cuda_backend_on_host_arrays(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32)
    with pytest.raises(flashattn.FlashAttnError) as e:
        _fwd(q, k, v, backend="cuda")
    if flashattn.backend_available("cuda"):
        assert isinstance(e.value, ValueError) and "needs device tensors" in str(e.value)
    else:
        assert isinstance(e.value, flashattn.BackendUnavailableError)
        assert isinstance(e.value, RuntimeError)
        assert "CUDA backend unavailable" in str(e.value)


def test_error_not_a_tensor():
    with pytest.raises(TypeError, match="q must be a torch.Tensor, a NumPy array"):
        _capi.forward([[1.0]], None, None, None)


def test_unsupported_flash_attn_arguments(rng):
    q, k, v = make_qkv(rng, 1, 8, 8, 2, 2, 32)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
    cu = np.array([0, 8], np.int32)
    with pytest.raises(NotImplementedError, match="block_table"):
        flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8,
                                         block_table=np.zeros((1, 1), np.int32))


def test_bad_library_path_is_reported():
    code = "import flashattn; flashattn.library_version()"
    env = dict(os.environ, FLASHATTN_LIBRARY="/nonexistent/libflashattn.so")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "cannot load libflashattn" in r.stderr and "/nonexistent/libflashattn.so" in r.stderr


def test_capi_does_not_import_torch():
    code = ("import sys, importlib.util, os\n"
            "spec = importlib.util.spec_from_file_location('capi', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "m.version()\n"
            "assert 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code, _capi.__file__],
                       env=dict(os.environ, FLASHATTN_LIBRARY=flashattn.library_path()),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_num_threads_does_not_change_results(rng):
    q, k, v = make_qkv(rng, 2, 65, 65, 4, 2, 64)
    outs = []
    for n in (1, 0):
        out = np.empty_like(q)
        _capi.forward(q, k, v, out, causal=True, num_threads=n)
        outs.append(out)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        _capi.forward(q, k, v, np.empty_like(q), num_threads=-1)


# ----------------------------------------------------------------------------
# Hardening (issue 27)


def test_python_ints_beyond_int32_are_rejected_not_truncated(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 1, 1, 32)
    for window in [(2 ** 32, -1), (-1, 2 ** 32 + 7), (-(2 ** 31) - 1, 0)]:
        with pytest.raises(ValueError, match="does not fit in int32"):
            _fwd(q, k, v, window_size=window)
    with pytest.raises(ValueError, match="num_threads = 4294967297 does not fit in int32"):
        _fwd(q, k, v, num_threads=2 ** 32 + 1)
    qv = randn(rng, 7, 1, 32)
    cu = np.array([0, 7], np.int32)
    with pytest.raises(ValueError, match="max_seqlen_q = 4294967303 does not fit"):
        _capi.forward(qv, qv, qv, np.empty_like(qv), cu_seqlens_q=cu, cu_seqlens_k=cu,
                      max_seqlen_q=2 ** 32 + 7, max_seqlen_k=7)
    with pytest.raises(ValueError, match="must be an integer"):
        _fwd(q, k, v, window_size=(2.5, -1))
    with pytest.raises(ValueError, match="does not fit in int32"):
        flashattn.flash_attn_func(q, k, v, window_size=(2 ** 32, 0))


def test_huge_windows_mean_unbounded(rng):
    q, k, v = make_qkv(rng, 1, 9, 13, 2, 2, 32)
    plain, huge = np.empty_like(q), np.empty_like(q)
    _capi.forward(q, k, v, plain)
    _capi.forward(q, k, v, huge, window_size=(2 ** 31 - 1, 2 ** 31 - 1))
    np.testing.assert_array_equal(plain, huge)


@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_empty_arrays_forward_and_backward(rng, b, sq, sk):
    q, k, v = make_qkv(rng, b, sq, sk, 2, 2, 32)
    out, lse = np.full_like(q, np.nan), np.full((b, 2, sq), np.nan, np.float32)
    _capi.forward(q, k, v, out, lse)
    dout = randn(rng, *q.shape)
    dq, dk, dv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)
    _capi.backward(q, k, v, out, dout, lse, dq, dk, dv)
    assert not np.isnan(out).any() and not np.isnan(dk).any() and not np.isnan(dv).any()
    assert (out == 0).all() and np.isneginf(lse).all()


def test_overlapping_outputs_are_rejected(rng):
    q, k, v = make_qkv(rng, 1, 6, 6, 2, 2, 32)
    with pytest.raises(ValueError, match="out overlaps q"):
        _capi.forward(q, k, v, q)
    out, lse = np.empty_like(q), np.empty((1, 2, 6), np.float32)
    _capi.forward(q, k, v, out, lse)
    dq, dk = np.empty_like(q), np.empty_like(k)
    with pytest.raises(ValueError, match="dk overlaps dv"):
        _capi.backward(q, k, v, out, randn(rng, *q.shape), lse, dq, dk, dk)


def test_nan_at_masked_keys_never_leaks(rng):
    # Causal, more keys than queries: key j is masked for rows i < j - (sk - sq).
    q, k, v = make_qkv(rng, 1, 70, 100, 1, 1, 32)
    clean = np.empty_like(q)
    _capi.forward(q, k, v, clean, causal=True)
    k[0, 99, 0, 3] = np.nan
    v[0, 99, 0, 5] = np.inf  # seen only by the last row
    out = np.empty_like(q)
    _capi.forward(q, k, v, out, causal=True)
    np.testing.assert_allclose(out[0, :69], clean[0, :69], rtol=1e-5, atol=1e-6)
    assert np.isnan(out[0, 69]).all()
