"""A FlexAttention BlockMask's mask_mod checked against the call's element mask.

flashattn walks a BlockMask's lists but evaluates no mask_mod: inside every listed
block only the element mask of the call applies (causal, window_size, the sequence
lengths). A BlockMask from create_block_mask carries the mask_mod its lists were made
from, so a call can verify that the two agree where they meet:

- inside a partial block (kv_num_blocks / kv_indices), mask_mod(b, h, i, j) must equal
  the element mask at every pair (i, j) inside the sequence;
- a full block (full_kv_num_blocks / full_kv_indices: mask_mod is true throughout)
  must be all visible under the element mask.

Otherwise the result would not be the BlockMask's attention, and the call raises
ValueError naming the first pair that differs. The check runs once per (mask, call
shape and element mask) and is remembered while the BlockMask lives; masks without a
mask_mod (flashattn.BlockMask, or FlexAttention's noop_mask) are taken as they are.
It runs in eager calls; under torch.compile and CUDA-graph capture (which its
evaluation would break) the lists are taken as they are.
"""

import contextlib
import weakref

import torch

# id(block_mask) -> (weak reference, the call keys already verified for it)
_VERIFIED = {}

# Partial blocks evaluated per batch of the check (bounds its temporaries: a block of
# 128 x 128 pairs is 16 Ki mask values, so 256 blocks ~4 Mi values, a few tens of MB).
_BLOCKS_PER_BATCH = 256


class _Call:
    """The element mask of a (non-varlen) call: rows i < sq, keys j < sk, and
    j - (i + sk - sq) within [-left, right] (-1 = unbounded), with causal right = 0."""

    def __init__(self, sq, sk, causal, window):
        self.sq, self.sk = int(sq), int(sk)
        left, right = (int(w) for w in window)
        if causal:
            right = 0
        self.left, self.right = left, right

    def key(self):
        return (self.sq, self.sk, self.left, self.right)

    def visible(self, i, j):
        """The element mask at pairs (i, j) (broadcasting integer tensors)."""
        d = j - (i + (self.sk - self.sq))
        ok = (i < self.sq) & (j < self.sk)
        if self.left >= 0:
            ok &= d >= -self.left
        if self.right >= 0:
            ok &= d <= self.right
        return ok

    def all_visible(self, i0, i1, j0, j1):
        """Whether every in-range pair of rows [i0, i1) x keys [j0, j1) is visible
        (tensors of block bounds; blocks with no in-range pair count as visible)."""
        i1 = torch.clamp(i1, max=self.sq)
        j1 = torch.clamp(j1, max=self.sk)
        ok = (i0 >= i1) | (j0 >= j1)
        # d = j - i - offset is largest at (i0, j1 - 1) and smallest at (i1 - 1, j0).
        inside = torch.ones_like(ok)
        offset = self.sk - self.sq
        if self.right >= 0:
            inside &= (j1 - 1) - (i0 + offset) <= self.right
        if self.left >= 0:
            inside &= j0 - ((i1 - 1) + offset) >= -self.left
        return ok | inside


def _mask_mod(block_mask):
    """The BlockMask's mask_mod, or None when it has none to check."""
    mask_mod = getattr(block_mask, "mask_mod", None)
    if mask_mod is None:
        return None
    from torch.nn.attention.flex_attention import noop_mask
    return None if mask_mod is noop_mask else mask_mod


def _listed(num, indices):
    """(b, h, query block, key block) of every listed entry: num (B, H, QB), indices
    (B, H, QB, N) int32, the first num[b, h, qb] entries of each row."""
    n = indices.shape[-1]
    used = torch.arange(n, device=indices.device) < num.unsqueeze(-1).long()
    b, h, qb, slot = used.nonzero(as_tuple=True)
    return b, h, qb, indices[b, h, qb, slot].long()


def _evaluate(mask_mod, b, h, i, j):
    """mask_mod at P blocks: b, h (P,), rows i (P, BQ), keys j (P, BK) -> (P, BQ, BK),
    vmapped per pair as create_block_mask evaluates it (tensor-indexed captures work)."""
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
        indexing = TransformGetItemToIndex()
    except ImportError:  # an older torch: indexing by 0-d tensors works as it is
        indexing = contextlib.nullcontext()
    per_key = torch.func.vmap(mask_mod, in_dims=(None, None, None, 0))
    per_row = torch.func.vmap(per_key, in_dims=(None, None, 0, None))
    per_block = torch.func.vmap(per_row, in_dims=(0, 0, 0, 0))
    with indexing:
        return per_block(b, h, i, j).bool()


def _differs(what, b, h, i, j, call):
    return ValueError(
        f"block_mask: its mask_mod and the call's element mask (causal / window_size / "
        f"lengths {call.sq} x {call.sk}) differ inside its {what} blocks, first at batch {b}, "
        f"head {h}, query {i}, key {j}. flashattn evaluates no mask_mod: inside listed blocks "
        f"only the element mask applies, so pass the mask_mod's equivalent as causal / "
        f"window_size, or lists whose blocks hold no pair that the two treat differently "
        f"(docs/variants.md, Bringing a FlexAttention BlockMask)")


def _check_partial(mask_mod, num, indices, bq, bk, call, lengths):
    b, h, qb, kb = _listed(num, indices)
    rows_end, keys_end = min(call.sq, lengths[0]), min(call.sk, lengths[1])
    if rows_end <= 0 or keys_end <= 0:
        return
    rows = torch.arange(bq, device=qb.device)
    keys = torch.arange(bk, device=qb.device)
    for s in range(0, b.numel(), _BLOCKS_PER_BATCH):
        part = slice(s, s + _BLOCKS_PER_BATCH)
        i = qb[part, None] * bq + rows
        j = kb[part, None] * bk + keys
        want = call.visible(i[:, :, None], j[:, None, :])
        inside = (i[:, :, None] < rows_end) & (j[:, None, :] < keys_end)
        # mask_mod is defined inside the sequence only (it may index arrays of its length):
        # the pairs past it are evaluated at the last row / key and not compared.
        got = _evaluate(mask_mod, b[part], h[part], i.clamp(max=rows_end - 1), j.clamp(max=keys_end - 1))
        bad = (got != want) & inside
        if bool(bad.any()):
            p, r, c = (x[0].item() for x in bad.nonzero(as_tuple=True))
            raise _differs("partial", b[part][p].item(), h[part][p].item(), i[p, r].item(), j[p, c].item(), call)


def _check_full(num, indices, bq, bk, call):
    b, h, qb, kb = _listed(num, indices)
    ok = call.all_visible(qb * bq, (qb + 1) * bq, kb * bk, (kb + 1) * bk)
    if not bool(ok.all()):
        p = int((~ok).nonzero()[0, 0])
        i0, j0 = qb[p].item() * bq, kb[p].item() * bk
        i1, j1 = min(i0 + bq, call.sq), min(j0 + bk, call.sk)
        # the block's pair of largest j - i, or of the smallest if that one is visible
        i, j = (i0, j1 - 1) if not call.visible(i0, j1 - 1) else (i1 - 1, j0)
        raise _differs("full", b[p].item(), h[p].item(), i, j, call)


def check_block_mask(block_mask, parts, sq, sk, causal, window):
    """Raises ValueError when a FlexAttention BlockMask's mask_mod and the element mask of
    a call with sq queries and sk keys (causal, window (left, right)) differ where the
    call visits (module docstring). parts: _capi.block_mask_parts(block_mask)."""
    mask_mod = _mask_mod(block_mask)
    if mask_mod is None or parts is None:
        return
    call = _Call(sq, sk, causal, window)
    entry = _VERIFIED.get(id(block_mask))
    if entry is not None and entry[0]() is block_mask and call.key() in entry[1]:
        return
    bq, bk, num, indices, full_num, full_indices = parts
    with torch.no_grad():
        # the lengths mask_mod was made for (create_block_mask's), where the BlockMask says
        lengths = tuple(getattr(block_mask, "seq_lengths", None) or (call.sq, call.sk))
        _check_partial(mask_mod, torch.as_tensor(num), torch.as_tensor(indices), bq, bk, call, lengths)
        if full_num is not None and full_indices is not None:
            _check_full(torch.as_tensor(full_num), torch.as_tensor(full_indices), bq, bk, call)
    if entry is None or entry[0]() is not block_mask:
        key = id(block_mask)
        entry = (weakref.ref(block_mask, lambda _, key=key: _VERIFIED.pop(key, None)), set())
        _VERIFIED[key] = entry
    entry[1].add(call.key())
