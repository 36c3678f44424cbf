#!/usr/bin/env python3
"""Decode time with ALiBi (one slope per head), attention sinks, both and neither: what the
decode kernel's bias (in the scores) and the sink (in the epilogue or the combine's merge) cost.
bf16, 32/8 heads, d128, one query token, contiguous cache, CUDA-graph replays
(bench/bench_decode.py's timing). The variants are timed in turn, ROUNDS times over, and each
one's median is reported (a long shape drifts by several percent over a run on the H200, so
variants timed once each, one after the other, are not comparable). --plain-only times the
plain call alone (a build without the extras in the decode kernel, for an A/B of the plain path).

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python:bench python3 bench/probes/decode_extras.py [--plain-only]
"""
import statistics
import sys

import torch

import bench_decode as bd
import flashattn

SHAPES = ((1, 16384), (16, 4096), (64, 16384))
ROUNDS = 5


def variant_fn(d, slopes, sinks):
    return lambda: flashattn.flash_attn_with_kvcache(d.q, d.k, d.v, cache_seqlens=d.lens,
                                                     alibi_slopes=slopes, sinks=sinks)


slopes = 2.0 ** (-8.0 * torch.arange(1, bd.HEADS_Q + 1, device="cuda", dtype=torch.float32) / bd.HEADS_Q)
sinks = torch.randn(bd.HEADS_Q, device="cuda", dtype=torch.float32)
variants = {"plain": (None, None)}
if "--plain-only" not in sys.argv:
    variants.update({"ALiBi": (slopes, None), "sinks": (None, sinks), "both": (slopes, sinks)})
print("| batch | kv len | " + " | ".join(f"{v} us (spread)" for v in variants) + " | " +
      " | ".join(f"{v} / plain" for v in list(variants)[1:]) + " |")
print("|---" * (2 + 2 * len(variants) - 1) + "|")
for batch, kv in SHAPES:
    d = bd.Decode(batch, kv)
    fns = {name: variant_fn(d, *args) for name, args in variants.items()}
    times = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            times[name].append(bd.graph_time_us(fn))
    med = {name: statistics.median(t) for name, t in times.items()}
    cells = [f"{med[n]:.2f} ({min(t):.2f}-{max(t):.2f})" for n, t in times.items()]
    ratios = [f"{med[n] / med['plain']:.3f}" for n in list(variants)[1:]]
    print(f"| {batch} | {kv} | " + " | ".join(cells + ratios) + " |", flush=True)
    del d, fns
    torch.cuda.empty_cache()
