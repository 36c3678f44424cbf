"""Host time per call of flashattn's Python entry points, against torch SDPA's FA2.

A tiny problem (batch 1, seqlen 128, 2 heads, head dim 128, bf16, causal) so that the GPU never
limits: the time per call is what Python, the bindings and the library spend on the host. This
is what decides the protocol's short-sequence cells when a call's GPU work is ~1 ms or less
(docs/performance.md, host overhead).

Usage: FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/host_overhead.py
"""

import ctypes
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn import _capi

B, S, H, D = 1, 128, 2, 128
CALLS = 300


def per_call_us(fn):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    dt = (time.perf_counter() - t) / CALLS
    torch.cuda.synchronize()
    return dt * 1e6


def main():
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out = torch.empty_like(qd)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    dq, dk, dv = (torch.empty_like(qd) for _ in range(3))
    ws = torch.empty(_capi.backward_workspace_size(qd, kd, vd, causal=True), dtype=torch.uint8,
                     device="cuda")
    opts = dict(cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0,
                deterministic=False, backend=None, stream=None, num_threads=0)
    c = _capi._Call(qd, kd, vd, **opts)
    o, ls = c.tensor(out, "out", output=True), c.tensor(lse, "lse", output=True)
    lib = _capi.library()
    scale = D ** -0.5
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def fa2():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    rows = [
        ("C fa_forward (prebuilt arguments)",
         lambda: lib.fa_forward(ctypes.byref(c.q), ctypes.byref(c.k), ctypes.byref(c.v),
                                ctypes.byref(o), ctypes.byref(ls), None, ctypes.byref(c.options))),
        ("_capi._Call(q, k, v)", lambda: _capi._Call(qd, kd, vd, **opts)),
        ("_capi.forward", lambda: _capi.forward(qd, kd, vd, out, lse, causal=True)),
        ("_capi.backward (buffer workspace)",
         lambda: _capi.backward(qd, kd, vd, out, dout, lse, dq, dk, dv, causal=True, workspace=ws)),
        ("torch.ops.flashattn.fwd (custom op)",
         lambda: torch.ops.flashattn.fwd(qd, kd, vd, scale, True, -1, 0, 0.0, False)),
        ("torch.ops.flashattn.bwd (custom op)",
         lambda: torch.ops.flashattn.bwd(dout, qd, kd, vd, out, lse, scale, True, -1, 0, 0.0, False)),
        ("flash_attn_func forward (requires_grad)", lambda: flashattn.flash_attn_func(q, k, v, causal=True)),
        ("flash_attn_func forward + backward",
         lambda: flashattn.flash_attn_func(q, k, v, causal=True).backward(dout)),
        ("torch SDPA FA2 forward", fa2),
        ("torch SDPA FA2 forward + backward", lambda: fa2().backward(dout.transpose(1, 2))),
    ]
    rows += decode_rows(lib)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; library {_capi.build_commit()}")
    print("| call | host us per call |\n|---|---|")
    for name, fn in rows:
        print(f"| {name} | {per_call_us(fn):.1f} |")


def decode_rows(lib):
    """One decode step: batch 1, one query token, 256 cached keys, 32 query / 8 KV heads, d128."""
    b, hq, hk, d, n = 1, 32, 8, 128, 256
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, n + 64, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, 1, device="cuda", dtype=torch.float32)
    kw = dict(cache_seqlens=lens, causal=True)
    ws = torch.empty(max(_capi.forward_kvcache_workspace_size(q, kc, vc, **kw), 1), dtype=torch.uint8,
                     device="cuda")
    args = {**_capi._KV_DEFAULTS, **kw}
    trusted = _capi._KvCall(q, kc, vc, **{**args, "trust_indices": True})
    checked = _capi._KvCall(q, kc, vc, **args)
    o, ls = trusted.tensor(out, "out", output=True), trusted.tensor(lse, "lse", output=True)

    def c_call(c):
        return lambda: lib.fa_forward_kvcache_ex(ctypes.byref(c.q), ctypes.byref(c.cache), ctypes.byref(o),
                                                 ctypes.byref(ls), ctypes.byref(c.options), None,
                                                 ctypes.c_void_p(ws.data_ptr()), ws.numel())
    qt = q.transpose(1, 2)
    kt, vt = (x[:, :n].repeat_interleave(hq // hk, dim=2).transpose(1, 2) for x in (kc, vc))

    def fa2():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt)
    return [
        ("decode: C fa_forward_kvcache (prebuilt arguments, trust_indices)", c_call(trusted)),
        ("decode: C fa_forward_kvcache (prebuilt arguments, indices checked on the host)", c_call(checked)),
        ("decode: _capi.forward_kvcache (buffer workspace)",
         lambda: _capi.forward_kvcache(q, kc, vc, out, lse, workspace=ws, **kw)),
        ("decode: flash_attn_with_kvcache", lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, **kw)),
        ("decode: torch SDPA FA2 (GQA heads expanded)", fa2),
    ]


if __name__ == "__main__":
    main()
