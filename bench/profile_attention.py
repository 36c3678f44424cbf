"""One shape of flashattn's CUDA forward or backward, run a few times, for ncu / nsys.

The protocol's shapes (16384 tokens, hidden 2048, bf16 randn). --phase backward: out and
lse come from the library's forward, and each iteration is one fa_backward call
(pre-pass, main kernel, post-pass). An ncu filter such as
`-k regex:forward_kernel --launch-skip 2 --launch-count 1` picks a warm launch.
--impl cudnn / fa2 runs torch SDPA's anchor instead (forward only; layout b, h, s, d),
so its kernel can be profiled the same way (`-k regex:"sdpa|fmha|flash_fwd"`).

Usage: FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \\
       python3 bench/profile_attention.py --phase forward --hdim 128 --seqlen 2048 [--causal]
"""

import argparse

import torch

from flashattn import _capi

TOKENS, HIDDEN = 16384, 2048


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=("forward", "backward"), default="backward")
    ap.add_argument("--hdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--impl", choices=("ours", "cudnn", "fa2"), default="ours")
    args = ap.parse_args()
    d, s = args.hdim, args.seqlen
    b, h = TOKENS // s, HIDDEN // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
    if args.impl != "ours":
        assert args.phase == "forward", "the anchors are profiled forward only"
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = SDPBackend.CUDNN_ATTENTION if args.impl == "cudnn" else SDPBackend.FLASH_ATTENTION
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        results = []  # the last call's output

        def run():
            with sdpa_kernel(backend):
                results[:] = [F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)]
    elif args.phase == "forward":
        run = lambda: _capi.forward(q, k, v, out, lse, causal=args.causal)
        results = (out, lse)
    else:
        _capi.forward(q, k, v, out, lse, causal=args.causal)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        ws = torch.empty(_capi.backward_workspace_size(q, k, v, causal=args.causal), device="cuda",
                         dtype=torch.uint8)
        run = lambda: _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=args.causal,
                                     workspace=ws)
        results = (dq, dk, dv)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.iters):
        start.record()
        run()
        stop.record()
    torch.cuda.synchronize()
    assert all(torch.isfinite(x).all() for x in results)
    print(f"{args.phase} d{d} s{s} causal={args.causal}: last call {start.elapsed_time(stop) * 1e3:.0f} us")


if __name__ == "__main__":
    main()
