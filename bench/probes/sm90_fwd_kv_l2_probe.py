#!/usr/bin/env python3
"""How much do K/V misses in L2 cost the forward? Same queries, K/V with all heads (MHA)
vs one K/V head shared by all (MQA: every K/V load hits L2), per protocol shape.

Caveat: with one K/V head the tile order puts all heads in one group (its L2 budget is
per K/V head), so causal rows also change the load balance: read the causal rows with care.

  PYTHONPATH=python python3 bench/probes/sm90_fwd_kv_l2_probe.py name=build/libflashattn.so
"""
import os, sys, torch, triton.testing
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "..", "python")]  # sm90_fwd_ab, flashattn
from sm90_fwd_ab import load_binding
libs = [x.split("=", 1) for x in sys.argv[1:]]
bind = {n: load_binding(n, p) for n, p in libs}
print("| lib | hdim | mask | seqlen | MHA TFLOP/s | MQA TFLOP/s | MQA/MHA |")
print("|---|---|---|---|---|---|---|")
for n, _ in libs:
    for d in (64, 128, 256):
        for causal in (False, True):
            for s in (1024, 2048, 4096, 16384):
                h, b = 2048 // d, 16384 // s
                g = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
                res = []
                for hk in (h, 1):
                    k, v = (torch.randn((b, s, hk, d), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
                    o = torch.empty_like(q); lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
                    t = triton.testing.do_bench(lambda: bind[n].forward(q, k, v, o, lse, causal=causal), warmup=25, rep=100, return_mode="median")
                    res.append(4.0 * b * h * s * s * d / (2 if causal else 1) / (t * 1e-3) / 1e12)
                print(f"| {n} | {d} | {'causal' if causal else 'none'} | {s} | {res[0]:.0f} | {res[1]:.0f} | {res[1]/res[0]:.3f} |", flush=True)
