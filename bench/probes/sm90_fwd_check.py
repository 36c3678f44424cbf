#!/usr/bin/env python3
"""Correctness of several builds of libflashattn side by side, before an A/B is trusted.

Each NAME=PATH library runs the forward twice on a few protocol shapes (16k tokens,
hidden 2048, bf16) with NaN-poisoned outputs; prints its max error against torch's
fp32 SDPA, NaN count and elements off by > 0.05, then each output's max difference
from the first library's. (It has caught an A/B whose "baseline" build was not the
build it claimed to be.)

  PYTHONPATH=python python3 bench/probes/sm90_fwd_check.py old=a/libflashattn.so new=b/libflashattn.so
"""
import os, sys, torch, torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "..", "python")]  # sm90_fwd_ab, flashattn
from sm90_fwd_ab import load_binding
libs = [x.split("=", 1) for x in sys.argv[1:]]
bind = {n: load_binding(n, p) for n, p in libs}
for d, s, causal in [(128, 2048, False), (64, 1024, False), (128, 1024, True), (256, 2048, False)]:
    h, b = 2048 // d, 16384 // s
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=causal).transpose(1, 2)
    outs = {}
    for n, _ in libs:
        for rep in range(2):
            o = torch.full_like(q, float("nan")); lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
            bind[n].forward(q, k, v, o, lse, causal=causal)
            torch.cuda.synchronize()
            err = (o.float() - ref).abs()
            bad = (err > 0.05).nonzero()
            print(f"d{d} s{s} causal={causal} {n} rep{rep}: max err vs fp32 {err.max().item():.3e}, nan {o.isnan().sum().item()}, "
                  f"bad elems {bad.shape[0]}, first bad {bad[:3].tolist()}", flush=True)
            outs[(n, rep)] = o
    keys = list(outs)
    for kk in keys[1:]:
        print("  diff", kk, "vs", keys[0], (outs[kk].float() - outs[keys[0]].float()).abs().max().item())
