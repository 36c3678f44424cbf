"""Naive float64 attention in NumPy, forward and backward, written for the tests.

Mask (flash-attn >= 2.1 semantics, bottom-right aligned): query row i of a
sequence with seqlen_q rows sees key j of seqlen_k keys when
    i + (seqlen_k - seqlen_q) - left <= j <= i + (seqlen_k - seqlen_q) + right,
a bound of -1 being absent; causal is right = 0. Rows that see no key give
output 0 and lse -inf (and no gradient).
"""

import numpy as np


def visible_mask(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    left, right = window
    if causal:
        right = 0
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    diag = i + seqlen_k - seqlen_q
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    return mask


def _expand_kv(x, heads_q):
    # (s, h_kv, d) -> (s, h_q, d): query head h uses kv head h // (h_q / h_kv)
    return np.repeat(x, heads_q // x.shape[1], axis=1)


def _fold_kv(dx, heads_kv):
    s, hq, d = dx.shape
    return dx.reshape(s, heads_kv, hq // heads_kv, d).sum(axis=2)


def _scores(q, k, scale, softcap):
    # q (sq, h, d), k (sk, h, d) -> raw (h, sq, sk) and capped scores
    raw = np.einsum("qhd,khd->hqk", q, k) * scale
    if softcap > 0:
        t = np.tanh(raw / softcap)
        return raw, softcap * t, t
    return raw, raw, None


def forward_one(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """One sequence: q (sq, hq, d), k/v (sk, hkv, d) -> out (sq, hq, d), lse (hq, sq)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    sq, hq, d = q.shape
    sk = k.shape[0]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    ke, ve = _expand_kv(k, hq), _expand_kv(v, hq)
    _, s, _ = _scores(q, ke, scale, softcap)
    mask = visible_mask(sq, sk, causal, window)[None]
    s = np.where(mask, s, -np.inf)
    any_row = mask.any(axis=-1)  # (1, sq)
    m = np.where(any_row, s.max(axis=-1, initial=-np.inf), 0.0)
    p = np.where(mask, np.exp(s - m[..., None]), 0.0)
    l = p.sum(axis=-1)
    safe_l = np.where(l > 0, l, 1.0)
    p = p / safe_l[..., None]
    out = np.einsum("hqk,khd->qhd", p, ve)
    lse = np.where(l > 0, m + np.log(safe_l), -np.inf)
    return out, np.broadcast_to(lse, (hq, sq)).copy()


def backward_one(q, k, v, dout, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """Analytic gradients (dq, dk, dv) of sum(out * dout) for one sequence."""
    q, k, v, dout = (np.asarray(t, dtype=np.float64) for t in (q, k, v, dout))
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    ke, ve = _expand_kv(k, hq), _expand_kv(v, hq)
    _, s, t = _scores(q, ke, scale, softcap)
    mask = visible_mask(sq, sk, causal, window)[None]
    s = np.where(mask, s, -np.inf)
    any_row = mask.any(axis=-1)
    m = np.where(any_row, s.max(axis=-1, initial=-np.inf), 0.0)
    p = np.where(mask, np.exp(s - m[..., None]), 0.0)
    l = p.sum(axis=-1)
    p = p / np.where(l > 0, l, 1.0)[..., None]
    dv = np.einsum("hqk,qhd->khd", p, dout)
    dp = np.einsum("qhd,khd->hqk", dout, ve)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if softcap > 0:
        ds = ds * (1.0 - t * t)
    dq = np.einsum("hqk,khd->qhd", ds, ke) * scale
    dk = np.einsum("hqk,qhd->khd", ds, q) * scale
    return dq, _fold_kv(dk, hkv), _fold_kv(dv, hkv)


def forward(q, k, v, **kw):
    """Batched: q (b, sq, hq, d) -> out (b, sq, hq, d), lse (b, hq, sq)."""
    outs, lses = zip(*(forward_one(q[i], k[i], v[i], **kw) for i in range(q.shape[0])))
    return np.stack(outs), np.stack(lses)


def backward(q, k, v, dout, **kw):
    grads = [backward_one(q[i], k[i], v[i], dout[i], **kw) for i in range(q.shape[0])]
    return tuple(np.stack(g) for g in zip(*grads))


def forward_varlen(q, k, v, cu_q, cu_k, **kw):
    """q (total_q, hq, d) -> out (total_q, hq, d), lse (hq, total_q)."""
    out = np.zeros(q.shape, dtype=np.float64)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if qe == qs:
            continue
        o, l = forward_one(q[qs:qe], k[ks:ke], v[ks:ke], **kw)
        out[qs:qe], lse[:, qs:qe] = o, l
    return out, lse


def backward_varlen(q, k, v, dout, cu_q, cu_k, **kw):
    dq = np.zeros(q.shape)
    dk = np.zeros(k.shape)
    dv = np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if qe == qs or ke == ks:
            continue
        g = backward_one(q[qs:qe], k[ks:ke], v[ks:ke], dout[qs:qe], **kw)
        dq[qs:qe], dk[ks:ke], dv[ks:ke] = g
    return dq, dk, dv


def cu_seqlens(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
