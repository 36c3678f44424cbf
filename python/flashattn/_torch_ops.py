"""PyTorch custom ops (namespace "flashattn") over the C ABI.

Each op allocates its outputs with torch and calls the library through
flashattn._capi, on torch.cuda.current_stream() for CUDA tensors. The forward
ops have fake (meta) implementations for torch.compile and an autograd formula
that calls the backward ops, so gradients flow through loss.backward() and
torch.compile(fullgraph=True) traces them without graph breaks.

Ops (alibi_slopes, sinks: optional float32 tensors; dropout_p, dropout_seed,
dropout_offset: see flashattn._capi.forward; block_q, block_k, kv_num_blocks, kv_indices,
full_kv_num_blocks, full_kv_indices: a block mask, off while block_q is 0 (int32 host
tensors, see flashattn.BlockMask); EXTRAS below stands for alibi_slopes=None, sinks=None,
dropout_p=0.0, dropout_seed=0, dropout_offset=0, block_q=0, block_k=0, kv_num_blocks=None,
kv_indices=None, full_kv_num_blocks=None, full_kv_indices=None):
  flashattn::fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                 deterministic, EXTRAS) -> (out, lse)
  flashattn::bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
                 softcap, deterministic, EXTRAS) -> (dq, dk, dv, dsinks)
  flashattn::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, causal, window_left, window_right, softcap,
                        deterministic, EXTRAS) -> (out, lse)
  flashattn::varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, causal, window_left, window_right,
                        softcap, deterministic, EXTRAS) -> (dq, dk, dv, dsinks)
  flashattn::fwd_kvcache(q, k_cache!, v_cache!, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_seqlen, cache_batch_idx, block_table, softmax_scale, causal,
                         window_left, window_right, softcap, rotary_interleaved,
                         num_splits, alibi_slopes=None, sinks=None) -> (out, lse)
                         (appends k/v into the caches in place)
dsinks is float32 (heads_q,), or an empty tensor when sinks is None (an op output cannot
be None). The sinks are differentiable through the forward ops' autograd formula.

attention() and varlen_attention() are what flash_attn_func and flash_attn_varlen_func
call: the custom ops while torch.compile traces, an autograd.Function over the same
library calls in eager mode (cheaper per call than a custom op's dispatch).

lse is float32, (batch, heads_q, seqlen_q) or (heads_q, total_q) for varlen. It
is returned for inspection (and saved for the backward pass) but is not
differentiable: no gradient flows back through it.
"""

import contextlib
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _capi

__all__ = ["fwd", "bwd", "varlen_fwd", "varlen_bwd", "attention", "varlen_attention",
           "fwd_kvcache", "attention_kvcache"]


def _prep(x: Tensor) -> Tensor:
    """A view the library accepts: last dimension contiguous, no zero strides (expanded dims)."""
    if x.dim() == 0:
        return x
    strides = x.stride()
    if (strides[-1] == 1 or x.shape[-1] <= 1) and (
            0 not in strides or all(n <= 1 for n, st in zip(x.shape, strides) if st == 0)):
        return x
    return x.contiguous()


def _device_guard(x: Tensor):
    if x.is_cuda and x.get_device() != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def _opts(softmax_scale, causal, window_left, window_right, softcap, deterministic):
    return dict(softmax_scale=softmax_scale, causal=causal,
                window_size=(window_left, window_right), softcap=softcap,
                deterministic=deterministic)


def _empty_like_shape(x: Tensor, dtype=None) -> Tensor:
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


# ----------------------------------------------------------------------------
# The library calls, shared by the custom ops (torch.compile, torch.ops.flashattn.*) and the
# eager autograd function. `varlen`: None, or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
# max_seqlen_k).


def _varlen_kwargs(varlen):
    if varlen is None:
        return {}
    cu_q, cu_k, max_q, max_k = varlen
    return dict(cu_seqlens_q=cu_q.contiguous(), cu_seqlens_k=cu_k.contiguous(),
                max_seqlen_q=max_q, max_seqlen_k=max_k)


def _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
             varlen=None, alibi_slopes=None, sinks=None, dropout=None, block_mask=None):
    q, k, v = _prep(q), _prep(k), _prep(v)
    out = _empty_like_shape(q)
    if varlen is None:  # lse (batch, heads_q, seqlen_q)
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    else:  # (heads_q, total_q)
        lse_shape = (q.shape[1], q.shape[0])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    with _device_guard(q):
        _capi.forward(q, k, v, out, lse, **_varlen_kwargs(varlen),
                      alibi_slopes=_extra(alibi_slopes), sinks=_extra(sinks), **_dropout_kwargs(dropout),
                      block_mask=_block_lists(block_mask), **_opts(softmax_scale, causal, window_left, window_right, softcap,
                              deterministic))
    return out, lse


def _dropout_kwargs(dropout):
    """dropout: None or (p, seed, offset) -> the library's keyword arguments."""
    if dropout is None:
        return {}
    p, seed, offset = dropout
    return dict(dropout_p=float(p), dropout_seed=int(seed), dropout_offset=int(offset))


# Host copies of block-mask lists that live on a GPU, by id of the tensor: (a weak reference
# to it, its version counter, the copy). An entry goes with its tensor.
_HOST_LISTS = {}


def _host_lists(t):
    """t (int32 lists) as a contiguous host tensor. A GPU tensor is copied to the host, which
    synchronizes the stream; under CUDA-graph capture, where that copy is not allowed, the
    copy made by a call before the capture (the warm-up) is reused if t is the same tensor,
    unmodified since (its version counter)."""
    t = torch.as_tensor(t)
    if not t.is_cuda:
        return t.contiguous()
    key = id(t)
    entry = _HOST_LISTS.get(key)
    kept = entry is not None and entry[0]() is t and entry[1] == t._version
    if torch.cuda.is_current_stream_capturing():
        if not kept:
            raise RuntimeError(
                "flashattn: a block mask with lists on the GPU is copied to the host on every call, "
                "which CUDA-graph capture does not allow; call once with this mask before capturing "
                "(the warm-up keeps its host copy), or pass lists in host memory (docs/variants.md)")
        return entry[2]
    host = t.cpu().contiguous()
    _HOST_LISTS[key] = (weakref.ref(t, lambda _, key=key: _HOST_LISTS.pop(key, None)), t._version, host)
    return host


def _block_lists(parts):
    """A block mask's parts (block_q, block_k, 4 int32 lists or None) with the lists as
    contiguous host tensors (NumPy arrays are taken without a copy; lists on a GPU, as
    create_block_mask(device="cuda") makes them, are copied to the host: the library
    reads them there and copies what its kernels need to the device, docs/variants.md)."""
    if parts is None:
        return None
    return parts[:2] + tuple(None if t is None else _host_lists(t) for t in parts[2:])


def _block_args(parts):
    """The block-mask arguments of the ops (block_q, block_k, 4 tensors) from parts or None."""
    return (0, 0, None, None, None, None) if parts is None else _block_lists(parts)


def _block_parts(block_q, block_k, *lists):
    """The ops' block-mask arguments back to parts (None while block_q is 0)."""
    return None if block_q == 0 else (block_q, block_k) + tuple(lists)


def _extra(x):
    """An extra (alibi_slopes, sinks) as the library takes it: None, or a contiguous tensor."""
    return None if x is None else x.detach().contiguous()


def _dsinks_like(q, sinks):
    """The sinks' gradient buffer: float32 (heads_q,), empty when there are no sinks."""
    n = 0 if sinks is None else sinks.shape[0]
    return torch.empty((n,), dtype=torch.float32, device=q.device)


def _backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
              deterministic, varlen=None, alibi_slopes=None, sinks=None, dropout=None, block_mask=None):
    """(dq, dk, dv, dsinks); dsinks is empty when sinks is None."""
    dout, q, k, v, out, lse = (_prep(t) for t in (dout, q, k, v, out, lse))
    dq, dk, dv = _empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v)
    dsinks = _dsinks_like(q, sinks)
    device = q.device

    def workspace(nbytes):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    with _device_guard(q):
        _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, workspace=workspace,
                       **_varlen_kwargs(varlen), alibi_slopes=_extra(alibi_slopes),
                       sinks=_extra(sinks), dsinks=dsinks if sinks is not None else None,
                       **_dropout_kwargs(dropout), block_mask=_block_lists(block_mask),
                       **_opts(softmax_scale, causal, window_left, window_right, softcap,
                               deterministic))
    return dq, dk, dv, dsinks


# ----------------------------------------------------------------------------
# Fixed-length batches


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, deterministic: bool,
        alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
        dropout_p: float = 0.0, dropout_seed: int = 0, dropout_offset: int = 0,
        block_q: int = 0, block_k: int = 0, kv_num_blocks: Optional[Tensor] = None,
        kv_indices: Optional[Tensor] = None, full_kv_num_blocks: Optional[Tensor] = None,
        full_kv_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                    deterministic, None, alibi_slopes, sinks,
                    (dropout_p, dropout_seed, dropout_offset), _block_parts(block_q, block_k, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices))


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
      alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
      block_q=0, block_k=0, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
      full_kv_indices=None):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        deterministic: bool, alibi_slopes: Optional[Tensor] = None,
        sinks: Optional[Tensor] = None, dropout_p: float = 0.0, dropout_seed: int = 0,
        dropout_offset: int = 0,
        block_q: int = 0, block_k: int = 0, kv_num_blocks: Optional[Tensor] = None,
        kv_indices: Optional[Tensor] = None, full_kv_num_blocks: Optional[Tensor] = None,
        full_kv_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
                     softcap, deterministic, None, alibi_slopes, sinks,
                     (dropout_p, dropout_seed, dropout_offset), _block_parts(block_q, block_k, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices))


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
      deterministic, alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=0,
      dropout_offset=0, block_q=0, block_k=0, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
      full_kv_indices=None):
    return (_empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v),
            _dsinks_like(q, sinks))


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
     alibi_slopes, sinks, dropout_p, dropout_seed, dropout_offset) = inputs[:14]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks, *inputs[16:])
    ctx.params = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    ctx.dropout = (dropout_p, dropout_seed, dropout_offset)
    ctx.block_sizes = inputs[14:16]
    ctx.mark_non_differentiable(lse)


def _sinks_grad(sinks, dsinks):
    return None if sinks is None else dsinks.to(sinks.dtype)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors[:7]
    dq, dk, dv, dsinks = bwd(dout, q, k, v, out, lse, *ctx.params, alibi_slopes, sinks,
                             *ctx.dropout, *ctx.block_sizes, *ctx.saved_tensors[7:])
    return (dq, dk, dv) + (None,) * 7 + (_sinks_grad(sinks, dsinks),) + (None,) * 9


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ----------------------------------------------------------------------------
# Variable-length batches


@torch.library.custom_op("flashattn::varlen_fwd", mutates_args=())
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               deterministic: bool, alibi_slopes: Optional[Tensor] = None,
               sinks: Optional[Tensor] = None, dropout_p: float = 0.0, dropout_seed: int = 0,
               dropout_offset: int = 0,
               block_q: int = 0, block_k: int = 0, kv_num_blocks: Optional[Tensor] = None,
               kv_indices: Optional[Tensor] = None, full_kv_num_blocks: Optional[Tensor] = None,
               full_kv_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                    deterministic, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                    alibi_slopes, sinks, (dropout_p, dropout_seed, dropout_offset),
                    _block_parts(block_q, block_k, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices))


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, deterministic, alibi_slopes=None, sinks=None,
      dropout_p=0.0, dropout_seed=0, dropout_offset=0, block_q=0, block_k=0, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
      full_kv_indices=None):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashattn::varlen_bwd", mutates_args=())
def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, deterministic: bool, alibi_slopes: Optional[Tensor] = None,
               sinks: Optional[Tensor] = None, dropout_p: float = 0.0, dropout_seed: int = 0,
               dropout_offset: int = 0,
               block_q: int = 0, block_k: int = 0, kv_num_blocks: Optional[Tensor] = None,
               kv_indices: Optional[Tensor] = None, full_kv_num_blocks: Optional[Tensor] = None,
               full_kv_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
                     softcap, deterministic, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                     alibi_slopes, sinks, (dropout_p, dropout_seed, dropout_offset),
                     _block_parts(block_q, block_k, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices))


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, window_left, window_right, softcap, deterministic,
      alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
      block_q=0, block_k=0, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
      full_kv_indices=None):
    return (_empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v),
            _dsinks_like(q, sinks))


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     window_left, window_right, softcap, deterministic, alibi_slopes, sinks, dropout_p,
     dropout_seed, dropout_offset) = inputs[:18]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks,
                          *inputs[20:])
    ctx.block_sizes = inputs[18:20]
    ctx.params = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                  softcap, deterministic)
    ctx.dropout = (dropout_p, dropout_seed, dropout_offset)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks = ctx.saved_tensors[:9]
    dq, dk, dv, dsinks = varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                    *ctx.params, alibi_slopes, sinks, *ctx.dropout,
                                    *ctx.block_sizes, *ctx.saved_tensors[9:])
    return (dq, dk, dv) + (None,) * 11 + (_sinks_grad(sinks, dsinks),) + (None,) * 9


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


# ----------------------------------------------------------------------------
# Eager entry points


class _Attention(torch.autograd.Function):
    """Eager autograd over the same library calls as the custom ops.

    NOTES: a custom op costs its dispatch and checks on every call (measured on the H100
    host: ~100 us per forward and ~250 us per backward op call for a tiny problem, against
    ~15 / ~30 us in the library itself), which made small attention calls host-bound.
    Eager calls come here; torch.compile traces the custom ops (attention() below)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, alibi_slopes, params, varlen, dropout, block_mask):
        out, lse = _forward(q, k, v, *params, varlen, alibi_slopes, sinks, dropout, block_mask)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks,
                              *(varlen[:2] if varlen is not None else ()))
        ctx.params = params
        ctx.dropout = dropout
        ctx.block_mask = block_mask
        ctx.varlen_sizes = varlen[2:] if varlen is not None else None
        ctx.mark_non_differentiable(lse)
        # lse has no gradient: without this autograd fills a zero dlse on every backward
        # (a kernel and, measured, ~160 us of host time through aten::zeros).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:
            return (None,) * 9
        saved = ctx.saved_tensors
        q, k, v, out, lse, alibi_slopes, sinks = saved[:7]
        varlen = None if ctx.varlen_sizes is None else (saved[7], saved[8], *ctx.varlen_sizes)
        dq, dk, dv, dsinks = _backward(dout, q, k, v, out, lse, *ctx.params, varlen,
                                       alibi_slopes, sinks, ctx.dropout, ctx.block_mask)
        return dq, dk, dv, _sinks_grad(sinks, dsinks), None, None, None, None, None


def _compiling() -> bool:
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling and is_compiling())


def attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              alibi_slopes=None, sinks=None, dropout=(0.0, 0, 0), block_mask=None):
    """(out, lse): the custom op under torch.compile, the eager autograd function otherwise.
    dropout: (p, seed, offset); block_mask: None or _capi.block_mask_parts() of one."""
    params = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    if _compiling():
        return fwd(q, k, v, *params, alibi_slopes, sinks, *dropout, *_block_args(block_mask))
    return _Attention.apply(q, k, v, sinks, alibi_slopes, params, None, dropout, block_mask)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left, window_right, softcap, deterministic,
                     alibi_slopes=None, sinks=None, dropout=(0.0, 0, 0), block_mask=None):
    """Variable-length attention(): (out, lse (heads_q, total_q))."""
    params = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    if _compiling():
        return varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          *params, alibi_slopes, sinks, *dropout, *_block_args(block_mask))
    return _Attention.apply(q, k, v, sinks, alibi_slopes, params,
                            (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout,
                            block_mask)


# ----------------------------------------------------------------------------
# Attention against a KV cache (inference; no autograd)


def _forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_seqlen, cache_batch_idx, block_table, softmax_scale, causal,
                     window_left, window_right, softcap, rotary_interleaved, num_splits,
                     alibi_slopes=None, sinks=None):
    # The caches are written in place: they are passed as they are, never copied.
    q = _prep(q)
    out = _empty_like_shape(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    device = q.device

    def workspace(nbytes):
        # torch's caching allocator: no cudaMalloc on the hot path, capturable in CUDA graphs.
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    indices = {name: (x.contiguous() if x is not None else None)
               for name, x in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                               ("block_table", block_table))}
    with _device_guard(q):
        _capi.forward_kvcache(
            q, k_cache, v_cache, out, lse, workspace=workspace,
            k=_prep(k) if k is not None else None, v=_prep(v) if v is not None else None,
            rotary_cos=_prep(rotary_cos) if rotary_cos is not None else None,
            rotary_sin=_prep(rotary_sin) if rotary_sin is not None else None,
            cache_seqlens=indices["cache_seqlens"] if cache_seqlens is not None else int(cache_seqlen),
            cache_batch_idx=indices["cache_batch_idx"], block_table=indices["block_table"],
            rotary_interleaved=rotary_interleaved, num_splits=num_splits,
            softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
            softcap=softcap,
            alibi_slopes=alibi_slopes.contiguous() if alibi_slopes is not None else None,
            sinks=sinks.contiguous() if sinks is not None else None)
    return out, lse


@torch.library.custom_op("flashattn::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                cache_seqlens: Optional[Tensor], cache_seqlen: int,
                cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor],
                softmax_scale: float, causal: bool, window_left: int, window_right: int,
                softcap: float, rotary_interleaved: bool, num_splits: int,
                alibi_slopes: Optional[Tensor] = None,
                sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                            cache_seqlen, cache_batch_idx, block_table, softmax_scale, causal,
                            window_left, window_right, softcap, rotary_interleaved, num_splits,
                            alibi_slopes, sinks)


@fwd_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
      cache_batch_idx, block_table, softmax_scale, causal, window_left, window_right, softcap,
      rotary_interleaved, num_splits, alibi_slopes=None, sinks=None):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


def attention_kvcache(*args):
    """(out, lse) of fwd_kvcache's arguments: the custom op under torch.compile, the library
    call directly otherwise (a custom op's dispatch costs more host time than a decode step)."""
    if _compiling():
        return fwd_kvcache(*args)
    return _forward_kvcache(*args)
