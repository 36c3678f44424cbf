"""flash-attn 2.x compatible functions.

Same arguments, defaults, layouts and return values as flash-attn's
flash_attn_interface (flash_attn_func, flash_attn_varlen_func and the packed
variants). PyTorch tensors go through flashattn._torch_ops (CPU and CUDA): an
autograd function in eager mode, the custom ops under torch.compile; NumPy
arrays (float32/float16) get the forward pass only, through the C ABI directly.

flash_attn_with_kvcache (inference against a KV cache, contiguous or paged
through block_table) works on torch tensors (CPU and CUDA, torch.compile, CUDA
graphs) and NumPy arrays (CPU).

ALiBi: alibi_slopes as in flash-attn 2.x (float32, (nheads,) or (batch, nheads);
scores -= slope * |i + seqlen_k - seqlen_q - j|). Attention sinks (gpt-oss): the
keyword sinks= (one logit per query head, joining each row's softmax
denominator, no value); with torch, a tensor autograd differentiates.

Dropout (dropout_p > 0, torch tensors, CPU and CUDA): the Philox seed
and offset are drawn from torch's default CPU generator, so torch.manual_seed
makes a step reproducible; the backward reuses them. Under torch.compile the draw
is part of the graph (a new mask per call); under CUDA-graph capture a call with
dropout raises RuntimeError (the seed would be fixed at capture: every replay
would drop the same entries). The mask draws 8-bit
random values, as flash-attn's kernels do: dropout_p is rounded to a multiple of
1/256 (at most 255/256), p8 = min(floor(dropout_p * 256 + 1/2), 255) / 256, and kept
probabilities are scaled by 1 / (1 - p8), so the expectation is exact; a
dropout_p below 1/512 rounds to 0, no dropout. With return_attn_probs=True
S_dmask is the dropout factor tensor (batch, nheads, seqlen_q, seqlen_k),
float32: 1 / (1 - p8) where kept, 0 where dropped (flash-attn encodes
the same pattern in the sign of its S_dmask); None without dropout.

Block-sparse attention (keyword block_mask=, on the CPU and on CUDA, with dropout too):
a FlexAttention BlockMask (torch.nn.attention.flex_attention.create_block_mask) or a
flashattn.BlockMask (the same attributes over int32 NumPy arrays or tensors). Each
query block visits only its listed key blocks; the element mask of the call (causal,
window_size, sequence lengths) applies inside them, and no mask_mod is evaluated:
pass its equivalent as causal / window_size / cu_seqlens. flash_attn_func checks a
FlexAttention BlockMask's mask_mod against that element mask inside the blocks it lists
(once per mask and call shape) and raises ValueError where they differ; varlen calls,
calls under torch.compile and calls captured into a CUDA graph take the lists as they
are (the warm-up call before a capture checks them). Lists on a GPU are copied to
the host per call; under CUDA-graph capture a mask is taken when a call before the
capture (the warm-up) had the same lists, unmodified (docs/variants.md).

Not implemented (NotImplementedError, never ignored): block_table in the non-cache
functions; cache_leftpad in flash_attn_with_kvcache; dropout on
NumPy arrays (call flashattn._capi.forward with dropout_seed/dropout_offset).
"""

import math
import numbers

from . import _capi

try:
    import torch
except ImportError:  # NumPy-only use
    torch = None

if torch is not None:
    from . import _flex, _torch_ops

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
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
    return _capi._int32(left, "window_size[0]"), _capi._int32(right, "window_size[1]")


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


def _capturing(q) -> bool:
    """Whether q's CUDA stream is being captured into a CUDA graph (eager calls only)."""
    return q.is_cuda and not _torch_ops._compiling() and torch.cuda.is_current_stream_capturing()


def _dropout(q, dropout_p):
    """(p, seed, offset): Philox seed and offset from torch's default CPU generator."""
    if not dropout_p:
        return (0.0, 0, 0)
    if _capturing(q):
        # The seed is a value of the captured call: every replay would draw the same mask.
        raise RuntimeError(
            f"flashattn: dropout_p={dropout_p} under CUDA-graph capture: the Philox seed is drawn "
            "on the host when the call is made, so every replay of the graph would drop the same "
            "entries; run dropout steps eagerly or under torch.compile without CUDA graphs")
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
                   sinks, block_mask=None, **varlen):
    import numpy as np
    q, k, v = (np.asarray(t) for t in (q, k, v))
    head_dim = q.shape[-1]
    qp, kp, vp = _pad_numpy(q), _pad_numpy(k), _pad_numpy(v)
    out = np.empty(qp.shape, dtype=qp.dtype)
    lse = np.empty(lse_shape, dtype=np.float32)
    _capi.forward(qp, kp, vp, out, lse, softmax_scale=softmax_scale, causal=causal,
                  window_size=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                  block_mask=block_mask, **varlen)
    return out[..., :head_dim], lse


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, sinks=None, block_mask=None):
    """Exact attention (flash-attn 2.x signature, plus the keywords sinks and block_mask).

    q: (batch_size, seqlen_q, nheads, headdim); k, v: (batch_size, seqlen_k, nheads_k, headdim),
    nheads a multiple of nheads_k (MQA/GQA). causal masks are aligned to the bottom right
    corner of the attention matrix; window_size (left, right) keeps keys j with
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1 = unbounded).
    softcap > 0 applies softcap * tanh(scores / softcap) before the softmax.
    alibi_slopes (nheads,) or (batch_size, nheads) float32 adds -slope * |i + seqlen_k -
    seqlen_q - j| to the scores (after softcap). sinks (nheads,) float32: a logit per head in
    every row's softmax denominator (no value); softmax_lse includes it; differentiable.
    block_mask: a FlexAttention BlockMask or flashattn.BlockMask (module docstring).

    Returns out (batch_size, seqlen_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse (batch_size, nheads, seqlen_q) float32, S_dmask=None).
    """
    _check_unsupported(q, dropout_p)
    window = _window(window_size)
    scale = _scale(softmax_scale, q.shape[-1])
    if _is_torch(q):
        head_dim = q.shape[-1]
        dropout = _dropout(q, dropout_p)
        parts = _capi.block_mask_parts(block_mask)
        if parts is not None and not _torch_ops._compiling() and not _capturing(q):
            _flex.check_block_mask(block_mask, parts, q.shape[1], k.shape[1], bool(causal), window)
        out, lse = _torch_ops.attention(_pad_torch(q), _pad_torch(k), _pad_torch(v), scale,
                                  bool(causal), window[0], window[1], float(softcap),
                                  bool(deterministic), alibi_slopes, _sinks_f32(sinks), dropout,
                                  parts)
        if out.shape[-1] != head_dim:
            out = out[..., :head_dim]
        s_dmask = _dropout_factors(q, dropout, q.shape[0], q.shape[2], q.shape[1], k.shape[1]) \
            if return_attn_probs else None
        return _result(out, lse, return_attn_probs, s_dmask)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    out, lse = _numpy_forward(q, k, v, lse_shape, scale, causal, window, softcap, alibi_slopes,
                              sinks, block_mask)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           sinks=None, block_mask=None):
    """Exact attention over variable-length sequences (flash-attn 2.x signature, plus sinks).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_q/k int32
    (batch_size + 1,) cumulative sequence lengths, on q's device; max_seqlen_q/k bound every
    sequence. Masks, alibi_slopes and sinks as in flash_attn_func, per sequence; block_mask
    too (query and key blocks counted within each sequence, lists of batch 1 or batch_size).

    Returns out (total_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse (nheads, total_q) float32, S_dmask=None).
    """
    _check_unsupported(q, dropout_p, block_table)
    window = _window(window_size)
    scale = _scale(softmax_scale, q.shape[-1])
    if _is_torch(q):
        head_dim = q.shape[-1]
        dropout = _dropout(q, dropout_p)
        out, lse = _torch_ops.varlen_attention(_pad_torch(q), _pad_torch(k), _pad_torch(v),
                                         cu_seqlens_q, cu_seqlens_k,
                                         _capi._int32(max_seqlen_q, "max_seqlen_q"),
                                         _capi._int32(max_seqlen_k, "max_seqlen_k"), scale, bool(causal), window[0],
                                         window[1], float(softcap), bool(deterministic),
                                         alibi_slopes, _sinks_f32(sinks), dropout,
                                         _capi.block_mask_parts(block_mask))
        if out.shape[-1] != head_dim:
            out = out[..., :head_dim]
        s_dmask = _dropout_factors(q, dropout, len(cu_seqlens_q) - 1, q.shape[1], int(max_seqlen_q),
                                   int(max_seqlen_k)) if return_attn_probs else None
        return _result(out, lse, return_attn_probs, s_dmask)
    lse_shape = (q.shape[1], q.shape[0])
    out, lse = _numpy_forward(q, k, v, lse_shape, scale, causal, window, softcap, alibi_slopes,
                              sinks, block_mask, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, sinks=None,
                              block_mask=None):
    """qkv: (batch_size, seqlen, 3, nheads, headdim). See flash_attn_func."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs, sinks=sinks, block_mask=block_mask)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, sinks=None,
                              block_mask=None):
    """q: (batch_size, seqlen_q, nheads, headdim); kv: (batch_size, seqlen_k, 2, nheads_k,
    headdim). See flash_attn_func."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                           sinks=sinks, block_mask=block_mask)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sinks=None,
                              block_mask=None):
    """qkv: (total, 3, nheads, headdim). See flash_attn_varlen_func."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks, block_mask=block_mask)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, sinks=None,
                              block_mask=None):
    """q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim).
    See flash_attn_varlen_func."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks, block_mask=block_mask)


def _cache_capacity(k_cache, block_table):
    if block_table is None:
        return int(k_cache.shape[1])
    return int(block_table.shape[1]) * int(k_cache.shape[1])


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            sinks=None):
    """Attention against a KV cache, appending k/v into it in place (flash-attn 2.x signature).

    q: (batch, seqlen_q, nheads, headdim). k_cache/v_cache: (batch_cache, seqlen_cache,
    nheads_k, headdim), or with block_table (batch, max_blocks) int32 a paged cache
    (num_blocks, page_block_size, nheads_k, headdim). k/v: (batch, seqlen_new, nheads_k,
    headdim) new tokens written at positions cache_seqlens .. cache_seqlens + seqlen_new - 1.
    cache_seqlens: int or int32 (batch,) tokens already in the cache (None: the whole cache).
    rotary_cos/rotary_sin: (seqlen_ro, rotary_dim / 2), applied to q and the new k at their
    positions (q at cache_seqlens only when neither causal nor windowed); rotary_interleaved
    pairs dims (0, 1), (2, 3)... instead of (i, i + rotary_dim / 2). cache_batch_idx: int32
    (batch,) cache rows of a contiguous cache. causal is bottom-right aligned. num_splits:
    split-KV pieces on CUDA (0 = heuristic). alibi_slopes: float32 (nheads,) or (batch,
    nheads); sinks (keyword only, not in flash-attn's signature): float32 (nheads,), one
    attention-sink logit per head as in flash_attn_func. The CPU and CUDA backends run both.

    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse (batch, nheads,
    seqlen_q) float32) with return_softmax_lse.
    """
    if cache_leftpad is not None:
        raise NotImplementedError("flashattn does not implement cache_leftpad: it must be None")
    window = _window(window_size)
    scale = _scale(softmax_scale, q.shape[-1])
    if cache_seqlens is None:
        cache_seqlens = _cache_capacity(k_cache, block_table)
    one_length = isinstance(cache_seqlens, numbers.Integral)
    if _is_torch(q):
        out, lse = _torch_ops.attention_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
            None if one_length else cache_seqlens, int(cache_seqlens) if one_length else 0,
            cache_batch_idx, block_table, scale, bool(causal), window[0], window[1],
            float(softcap), bool(rotary_interleaved), int(num_splits), alibi_slopes, sinks)
        return (out, lse) if return_softmax_lse else out
    import numpy as np
    q = np.asarray(q)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    _capi.forward_kvcache(q, k_cache, v_cache, out, lse, k=k, v=v, cache_seqlens=cache_seqlens,
                          block_table=block_table, cache_batch_idx=cache_batch_idx,
                          rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                          rotary_interleaved=rotary_interleaved, num_splits=num_splits,
                          softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                          alibi_slopes=alibi_slopes, sinks=sinks)
    return (out, lse) if return_softmax_lse else out
