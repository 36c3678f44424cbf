#!/usr/bin/env python3
"""Per-query-tile and per-key cost of the forward, ours against cuDNN: time over seqlen_k.

With the query tiles fixed (seqlen_q x batch, 16 heads at d128), the forward's time is about
a + b * seqlen_k: b is the cost of a key, a what every query tile pays once (prologue, epilogue,
the tile order's lookup, the last round's tail). Fits both for ours (the library
FLASHATTN_LIBRARY points at, logsumexp on) and torch's cuDNN SDPA, timed in turn
(`--rounds`, order by timing_order.py, do_bench medians), bf16, non-causal.

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/fixed_cost_sweep.py
"""
import argparse
import os
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))  # timing_order
from timing_order import round_order  # noqa: E402
from flashattn import _capi  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--queries", default="2048x8,4096x4", help="SEQLEN_QxBATCH,...")
    ap.add_argument("--keys", default="1024,2048,3072,4096,6144",
                    help="seqlen_k values (below 8192 the d128 kernel keeps its 128-key tiles)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    h, d = args.heads, args.hdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    for spec in args.queries.split(","):
        sq, b = (int(x) for x in spec.split("x"))
        keys = [int(x) for x in args.keys.split(",")]
        med = {"ours": [], "cudnn": []}
        for sk in keys:
            q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
            out = torch.empty_like(q)
            lse = torch.empty(b, h, sq, device="cuda", dtype=torch.float32)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def ours():
                _capi.forward(q, k, v, out, lse)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt)

            fns = {"ours": ours, "cudnn": cudnn}
            times = {n: [] for n in fns}
            for r in range(args.rounds):
                for n in round_order(list(fns), r):
                    times[n].append(triton.testing.do_bench(fns[n], warmup=50, rep=300, return_mode="median"))
            flop = 4.0 * b * h * sq * sk * d
            cells = []
            for n in fns:
                t = statistics.median(times[n])
                med[n].append(t * 1e3)
                cells.append(f"{n} {t * 1e3:.1f} us ({flop / t / 1e9:.0f} TFLOP/s)")
            print(f"seqlen_q {sq} x {b}, seqlen_k {sk}: " + ", ".join(cells) +
                  f", ours/cuDNN {med['cudnn'][-1] / med['ours'][-1]:.3f}", flush=True)
        for n, ys in med.items():
            slope, icpt = np.polyfit(np.array(keys, dtype=float), np.array(ys), 1)
            print(f"fit seqlen_q {sq} {n}: {icpt:.1f} us + {slope * 1e3:.2f} us per 1k keys "
                  f"(fixed cost = {icpt / slope:.0f} keys)")


if __name__ == "__main__":
    main()
