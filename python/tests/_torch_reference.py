"""Naive float64 attention in PyTorch (autograd gives reference gradients), for the tests."""

import torch


def visible_mask(sq, sk, causal=False, window=(-1, -1), device="cpu"):
    """(sq, sk) bool, True where query i sees key j (bottom-right aligned, -1 = unbounded)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= i + sk - sq - left
    if right >= 0:
        mask &= j <= i + sk - sq + right
    return mask


def ref_attention(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """Naive float64 attention in torch (autograd gives the reference gradients).
    q (b, sq, hq, d), k/v (b, sk, hkv, d); bottom-right aligned masks; rows that see
    no key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = visible_mask(sq, sk, causal, window, q.device)
    row_any = mask.any(-1, keepdim=True)
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~row_any, 0.0)
    p = torch.softmax(s, dim=-1) * row_any
    lse = torch.logsumexp(s, dim=-1).masked_fill(~row_any[:, 0], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def f64(*ts):
    """float64 leaf copies, for reference gradients computed in float64 throughout."""
    return tuple(t.detach().double().requires_grad_() for t in ts)
