"""One shape of flashattn's CUDA backward, run a few times, for ncu / nsys.

The protocol's shapes (16384 tokens, hidden 2048, bf16 randn); out and lse come
from the library's forward. Each iteration is one fa_backward call (pre-pass,
main kernel, post-pass), so an ncu filter such as
`-k regex:backward_kernel --launch-skip 2 --launch-count 1` picks a warm launch.

Usage: FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \
       python3 bench/profile_backward.py --hdim 256 --seqlen 1024 [--causal] [--iters 5]
"""

import argparse

import torch

from flashattn import _capi

TOKENS, HIDDEN = 16384, 2048


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    d, s = args.hdim, args.seqlen
    b, h = TOKENS // s, HIDDEN // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
    _capi.forward(q, k, v, out, lse, causal=args.causal)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    ws = torch.empty(_capi.backward_workspace_size(q, k, v, causal=args.causal), device="cuda",
                     dtype=torch.uint8)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.iters):
        start.record()
        _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=args.causal, workspace=ws)
        stop.record()
    torch.cuda.synchronize()
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    print(f"d{d} s{s} causal={args.causal}: last backward {start.elapsed_time(stop) * 1e3:.0f} us")


if __name__ == "__main__":
    main()
