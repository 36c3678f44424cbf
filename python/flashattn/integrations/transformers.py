"""flashattn as an attention implementation of Hugging Face transformers.

Importing this module registers the implementation ``"FlashAttn"`` with
transformers' ``AttentionInterface`` (the attention function) and
``AttentionMaskInterface`` (the mask it receives: the 2-D padding mask, or None
when nothing is padded):

    import flashattn.integrations.transformers  # noqa: F401  (registers "FlashAttn")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="FlashAttn")

The name is capitalised on purpose: transformers takes any implementation whose
name contains the lowercase "flash" for a flash-attn kernel to import (from the
flash_attn package or the kernels hub), and "flashattn" fails at model creation.

What the attention function does with the batch:

- no padding: one ``flash_attn_func`` call on the (batch, seqlen, heads, head_dim) views;
- padding (a 2-D ``attention_mask``): the padded tokens are dropped and the rest goes
  through ``flash_attn_varlen_func``; outputs at padded query positions are zero;
- packed sequences (batch 1, ``position_ids`` restarting at 0, or transformers'
  ``cu_seq_lens_q/k`` keyword arguments): ``flash_attn_varlen_func`` per sequence.

Causal masks are aligned to the bottom right, so generation with a KV cache
(queries = the new tokens, keys = the cache) needs no offset: each new token sees
every cached key and itself. Sliding windows (``sliding_window``) and logit soft
capping (``softcap``) map to the library's ``window_size`` and ``softcap``.

On CUDA the model runs in float16 or bfloat16 (the GPU kernels' types; float32
raises UnsupportedError); on CPU float32 works too.

Attention dropout during training (``attention_dropout > 0``) is the library's
``dropout_p`` (Philox, seeded from torch's generator, so ``torch.manual_seed`` makes a
step reproducible), and attention sinks (``s_aux``, gpt-oss) its ``sinks=``, whose
gradient reaches the model's sink parameters. Attention weights are never returned
(``output_attentions`` gives None, as with flash_attention_2).
Needs a transformers with ``AttentionMaskInterface`` and PyTorch >= 2.4.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..interface import flash_attn_func, flash_attn_varlen_func

__all__ = ["NAME", "attention_forward", "register"]

# The attn_implementation name registered on import; no lowercase "flash" in it
# (see the module docstring).
NAME = "FlashAttn"


def register(name: str = NAME) -> str:
    """Registers :func:`attention_forward` and its mask format with transformers
    under ``name`` (done for :data:`NAME` on import); returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    # The padding mask only (or None): what the varlen path needs, the same
    # format transformers gives flash_attention_2.
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None,
                      **kwargs) -> Tuple[torch.Tensor, None]:
    """The attention function transformers calls (``AttentionInterface`` signature).

    query: (batch, heads, seqlen_q, head_dim); key, value: (batch, heads_kv, seqlen_k,
    head_dim); attention_mask: None or the (batch, seqlen_k) padding mask (True/1 =
    a real token). Returns (output (batch, seqlen_q, heads, head_dim), None).
    """
    causal = bool(module.is_causal if is_causal is None else is_causal)
    # transformers passes dropout = 0.0 outside training, the config's attention_dropout
    # in it; s_aux is gpt-oss's per-head sink logit (the library's sinks=, differentiable).
    options = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling, causal=causal,
                   window_size=_window(sliding_window, key.shape[2], causal),
                   softcap=float(softcap or 0.0), sinks=s_aux)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, dim)
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, options), None
    packed = _packed_cu_seqlens(q, k, kwargs)
    if packed is not None:
        return _packed_attention(q, k, v, packed, options), None
    return flash_attn_func(q, k, v, **options), None


def _window(sliding_window: Optional[int], seqlen_k: int, causal: bool) -> Tuple[int, int]:
    # NOTES: transformers' sliding window of w keeps keys j with i - w < j (the
    # query itself and w - 1 before it): window_left = w - 1; causal fixes the right
    # side at 0, a bidirectional window is symmetric (as transformers' flash path).
    if sliding_window is None or seqlen_k <= sliding_window:
        return (-1, -1)
    left = int(sliding_window) - 1
    return (left, 0 if causal else left)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """int32 cumulative lengths (batch + 1 entries, from 0) of per-sequence lengths."""
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _layout(mask: torch.Tensor):
    """Flat indices of the true entries of mask (batch, seqlen), the cu_seqlens of
    its rows and the longest row."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    return mask.reshape(-1).nonzero().reshape(-1), _cu_seqlens(lengths), int(lengths.max())


def _rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` of x (batch, seqlen, heads, dim) as (len(indices), heads, dim)."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, indices)


def _padded_attention(q, k, v, attention_mask, options):
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, seqlen_k):
        raise ValueError(
            f"flashattn takes a 2-D padding mask of shape (batch, seqlen_k) = ({batch}, "
            f"{seqlen_k}), got {tuple(attention_mask.shape)}")
    mask_k = attention_mask.bool()
    # The queries are the last seqlen_q positions of the keys' sequence (the new
    # tokens after the cache).
    q_index, cu_q, max_q = _layout(mask_k[:, seqlen_k - seqlen_q:])
    k_index, cu_k, max_k = _layout(mask_k)
    out_rows = flash_attn_varlen_func(_rows(q, q_index), _rows(k, k_index), _rows(v, k_index),
                                      cu_q, cu_k, max_q, max_k, **options)
    out = out_rows.new_zeros(batch * seqlen_q, heads, out_rows.shape[-1])
    return out.index_copy(0, q_index, out_rows).view(batch, seqlen_q, heads, -1)


def _packed_cu_seqlens(q, k, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of packed sequences, or None if
    the batch is not packed. transformers passes cu_seq_lens_q/k and max_length_q/k
    when a data collator flattened the batch; otherwise position_ids restarting
    at 0 within a batch of one mark where each sequence starts."""
    given = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                     "max_length_k")]
    if all(x is not None for x in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    position_ids = kwargs.get("position_ids")
    seqlen = q.shape[1]
    if position_ids is None or q.shape[0] != 1 or seqlen != k.shape[1] or seqlen == 1:
        return None
    positions = position_ids.reshape(-1)
    starts = (positions == 0).nonzero().reshape(-1)
    if starts.numel() < 2 or int(starts[0]) != 0:
        return None
    cu = torch.cat([starts, starts.new_tensor([seqlen])]).to(torch.int32)
    longest = int(cu.diff().max())
    return cu, cu, longest, longest


def _packed_attention(q, k, v, packed, options):
    cu_q, cu_k, max_q, max_k = packed
    out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, **options)
    return out.unsqueeze(0)


register()
