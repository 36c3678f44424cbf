"""flash-attn 2.x compatible functions.

Same arguments, defaults, layouts and return values as flash-attn's
flash_attn_interface (flash_attn_func, flash_attn_varlen_func and the packed
variants). PyTorch tensors go through flashattn._torch_ops (CPU and CUDA): an
autograd function in eager mode, the custom ops under torch.compile; NumPy
arrays (float32/float16) get the forward pass only, through the C ABI directly.

ALiBi: alibi_slopes as in flash-attn 2.x (float32, (nheads,) or (batch, nheads);
scores -= slope * |i + seqlen_k - seqlen_q - j|). Attention sinks (gpt-oss): the
keyword sinks= (one logit per query head, joining each row's softmax
denominator, no value); with torch, a tensor autograd differentiates.

Dropout (dropout_p > 0, torch tensors, CPU backend for now): the Philox seed
and offset are drawn from torch's default CPU generator, so torch.manual_seed
makes a step reproducible; the backward reuses them. With return_attn_probs=True
S_dmask is the dropout factor tensor (batch, nheads, seqlen_q, seqlen_k),
float32: 1 / (1 - dropout_p) where kept, 0 where dropped (flash-attn encodes
the same pattern in the sign of its S_dmask); None without dropout.

Not implemented (NotImplementedError, never ignored): block_table; dropout on
NumPy arrays (call flashattn._capi.forward with dropout_seed/dropout_offset).
"""

import math

from . import _capi

try:
    import torch
except ImportError:  # NumPy-only use
    torch = None

if torch is not None:
    from . import _torch_ops

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _check_unsupported(q, dropout_p, block_table=None):
    if dropout_p != 0.0 and not _is_torch(q):
        raise NotImplementedError(
            "dropout through flash_attn_func needs torch tensors (the seed comes from the torch "
            f"generator), got dropout_p={dropout_p}; call flashattn._capi.forward with "
            "dropout_seed and dropout_offset for NumPy arrays")
    if block_table is not None:
        raise NotImplementedError(
            "flashattn does not implement paged KV caches: block_table must be None")


def _window(window_size):
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    return int(left), int(right)


def _scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    return float(softmax_scale)


def _pad_torch(x, multiple=8):
    d = x.shape[-1]
    if d % multiple == 0:
        return x
    return torch.nn.functional.pad(x, [0, multiple - d % multiple])


def _pad_numpy(x, multiple=8):
    import numpy as np
    d = x.shape[-1]
    if d % multiple == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 1) + [(0, multiple - d % multiple)]
    return np.pad(x, pad)


def _dropout(dropout_p):
    """(p, seed, offset): Philox seed and offset from torch's default CPU generator."""
    if not dropout_p:
        return (0.0, 0, 0)
    seed, offset = torch.randint(0, 2 ** 62, (2,), dtype=torch.int64).tolist()
    return (float(dropout_p), seed, offset)


def _dropout_factors(q, dropout, batch, heads, seqlen_q, seqlen_k):
    """S_dmask: the dropout factors (batch, heads, seqlen_q, seqlen_k), or None without dropout."""
    if not dropout[0]:
        return None
    mask = torch.empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.float32)
    _capi.dropout_mask(mask, *dropout)
    return mask.to(q.device)


def _result(out, lse, return_attn_probs, s_dmask=None):
    return (out, lse, s_dmask) if return_attn_probs else out


def _sinks_f32(sinks):
    """torch sinks as float32 (the cast stays on the autograd graph); others as given."""
    if _is_torch(sinks) and sinks.dtype != torch.float32:
        return sinks.float()
    return sinks


def _numpy_forward(q, k, v, lse_shape, softmax_scale, causal, window, softcap, alibi_slopes,
                   sinks, **varlen):
    import numpy as np
    q, k, v = (np.asarray(t) for t in (q, k, v))
    head_dim = q.shape[-1]
    qp, kp, vp = _pad_numpy(q), _pad_numpy(k), _pad_numpy(v)
    out = np.empty(qp.shape, dtype=qp.dtype)
    lse = np.empty(lse_shape, dtype=np.float32)
    _capi.forward(qp, kp, vp, out, lse, softmax_scale=softmax_scale, causal=causal,
                  window_size=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                  **varlen)
    return out[..., :head_dim], lse


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, sinks=None):
    """Exact attention (flash-attn 2.x signature, plus the keyword sinks).

    q: (batch_size, seqlen_q, nheads, headdim); k, v: (batch_size, seqlen_k, nheads_k, headdim),
    nheads a multiple of nheads_k (MQA/GQA). causal masks are aligned to the bottom right
    corner of the attention matrix; window_size (left, right) keeps keys j with
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1 = unbounded).
    softcap > 0 applies softcap * tanh(scores / softcap) before the softmax.
    alibi_slopes (nheads,) or (batch_size, nheads) float32 adds -slope * |i + seqlen_k -
    seqlen_q - j| to the scores (after softcap). sinks (nheads,) float32: a logit per head in
    every row's softmax denominator (no value); softmax_lse includes it; differentiable.

    Returns out (batch_size, seqlen_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse (batch_size, nheads, seqlen_q) float32, S_dmask=None).
    """
    _check_unsupported(q, dropout_p)
    window = _window(window_size)
    scale = _scale(softmax_scale, q.shape[-1])
    if _is_torch(q):
        head_dim = q.shape[-1]
        dropout = _dropout(dropout_p)
        out, lse = _torch_ops.attention(_pad_torch(q), _pad_torch(k), _pad_torch(v), scale,
                                  bool(causal), window[0], window[1], float(softcap),
                                  bool(deterministic), alibi_slopes, _sinks_f32(sinks), dropout)
        if out.shape[-1] != head_dim:
            out = out[..., :head_dim]
        s_dmask = _dropout_factors(q, dropout, q.shape[0], q.shape[2], q.shape[1], k.shape[1]) \
            if return_attn_probs else None
        return _result(out, lse, return_attn_probs, s_dmask)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    out, lse = _numpy_forward(q, k, v, lse_shape, scale, causal, window, softcap, alibi_slopes,
                              sinks)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           sinks=None):
    """Exact attention over variable-length sequences (flash-attn 2.x signature, plus sinks).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_q/k int32
    (batch_size + 1,) cumulative sequence lengths, on q's device; max_seqlen_q/k bound every
    sequence. Masks, alibi_slopes and sinks as in flash_attn_func, per sequence.

    Returns out (total_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse (nheads, total_q) float32, S_dmask=None).
    """
    _check_unsupported(q, dropout_p, block_table)
    window = _window(window_size)
    scale = _scale(softmax_scale, q.shape[-1])
    if _is_torch(q):
        head_dim = q.shape[-1]
        dropout = _dropout(dropout_p)
        out, lse = _torch_ops.varlen_attention(_pad_torch(q), _pad_torch(k), _pad_torch(v),
                                         cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                         int(max_seqlen_k), scale, bool(causal), window[0],
                                         window[1], float(softcap), bool(deterministic),
                                         alibi_slopes, _sinks_f32(sinks), dropout)
        if out.shape[-1] != head_dim:
            out = out[..., :head_dim]
        s_dmask = _dropout_factors(q, dropout, len(cu_seqlens_q) - 1, q.shape[1], int(max_seqlen_q),
                                   int(max_seqlen_k)) if return_attn_probs else None
        return _result(out, lse, return_attn_probs, s_dmask)
    lse_shape = (q.shape[1], q.shape[0])
    out, lse = _numpy_forward(q, k, v, lse_shape, scale, causal, window, softcap, alibi_slopes,
                              sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, sinks=None):
    """qkv: (batch_size, seqlen, 3, nheads, headdim). See flash_attn_func."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs, sinks=sinks)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, sinks=None):
    """q: (batch_size, seqlen_q, nheads, headdim); kv: (batch_size, seqlen_k, 2, nheads_k,
    headdim). See flash_attn_func."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                           sinks=sinks)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sinks=None):
    """qkv: (total, 3, nheads, headdim). See flash_attn_varlen_func."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, sinks=None):
    """q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim).
    See flash_attn_varlen_func."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks)
