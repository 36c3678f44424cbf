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
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; library {_capi.build_commit()}")
    print("| call | host us per call |\n|---|---|")
    for name, fn in rows:
        print(f"| {name} | {per_call_us(fn):.1f} |")


if __name__ == "__main__":
    main()
