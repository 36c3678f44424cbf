"""PyTorch custom ops (namespace "flashattn") over the C ABI.

Each op allocates its outputs with torch and calls the library through
flashattn._capi, on torch.cuda.current_stream() for CUDA tensors. The forward
ops have fake (meta) implementations for torch.compile and an autograd formula
that calls the backward ops, so gradients flow through loss.backward() and
torch.compile(fullgraph=True) traces them without graph breaks.

Ops:
  flashattn::fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                 deterministic) -> (out, lse)
  flashattn::bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
                 softcap, deterministic) -> (dq, dk, dv)
  flashattn::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, causal, window_left, window_right, softcap,
                        deterministic) -> (out, lse)
  flashattn::varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, causal, window_left, window_right,
                        softcap, deterministic) -> (dq, dk, dv)

lse is float32, (batch, heads_q, seqlen_q) or (heads_q, total_q) for varlen. It
is returned for inspection (and saved for the backward pass) but is not
differentiable: no gradient flows back through it.
"""

import contextlib
from typing import Tuple

import torch
from torch import Tensor

from . import _capi

__all__ = ["fwd", "bwd", "varlen_fwd", "varlen_bwd"]


def _prep(x: Tensor) -> Tensor:
    """A view the library accepts: last dimension contiguous, positive strides."""
    if x.dim() == 0:
        return x
    ok = x.stride(-1) == 1 or x.shape[-1] <= 1
    if ok:
        for size, stride in zip(x.shape, x.stride()):
            if size > 1 and stride < 1:
                ok = False
                break
    return x if ok else x.contiguous()


def _device_guard(x: Tensor):
    if x.is_cuda and x.device.index is not None and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def _opts(softmax_scale, causal, window_left, window_right, softcap, deterministic):
    return dict(softmax_scale=softmax_scale, causal=causal,
                window_size=(window_left, window_right), softcap=softcap,
                deterministic=deterministic)


def _empty_like_shape(x: Tensor, dtype=None) -> Tensor:
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


# ----------------------------------------------------------------------------
# Fixed-length batches


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    q, k, v = _prep(q), _prep(k), _prep(v)
    out = _empty_like_shape(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    with _device_guard(q):
        _capi.forward(q, k, v, out, lse,
                      **_opts(softmax_scale, causal, window_left, window_right, softcap,
                              deterministic))
    return out, lse


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dout, q, k, v, out, lse = (_prep(t) for t in (dout, q, k, v, out, lse))
    dq, dk, dv = _empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v)
    opts = _opts(softmax_scale, causal, window_left, window_right, softcap, deterministic)
    with _device_guard(q):
        nbytes = _capi.backward_workspace_size(q, k, v, **opts)
        ws = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, workspace=ws, **opts)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
      deterministic):
    return _empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.params = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ----------------------------------------------------------------------------
# Variable-length batches


@torch.library.custom_op("flashattn::varlen_fwd", mutates_args=())
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               deterministic: bool) -> Tuple[Tensor, Tensor]:
    q, k, v = _prep(q), _prep(k), _prep(v)
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    out = _empty_like_shape(q)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    with _device_guard(q):
        _capi.forward(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                      **_opts(softmax_scale, causal, window_left, window_right, softcap,
                              deterministic))
    return out, lse


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, deterministic):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashattn::varlen_bwd", mutates_args=())
def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dout, q, k, v, out, lse = (_prep(t) for t in (dout, q, k, v, out, lse))
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    dq, dk, dv = _empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v)
    opts = _opts(softmax_scale, causal, window_left, window_right, softcap, deterministic)
    vl = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
              max_seqlen_k=max_seqlen_k)
    with _device_guard(q):
        nbytes = _capi.backward_workspace_size(q, k, v, **vl, **opts)
        ws = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, workspace=ws, **vl, **opts)
    return dq, dk, dv


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, window_left, window_right, softcap, deterministic):
    return _empty_like_shape(q), _empty_like_shape(k), _empty_like_shape(v)


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     window_left, window_right, softcap, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.params = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                  softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.params)
    return (dq, dk, dv) + (None,) * 10


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)
