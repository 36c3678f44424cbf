"""Backward time with softcap and ALiBi together, against each alone and neither (docs/variants.md, ALiBi).

For each shape (bf16, 16 heads, TOKENS tokens per batch) and mask, times the backward of
flashattn.flash_attn_func (autograd, out.backward(dout) after a forward outside the timing) with
no modifier, softcap alone, ALiBi alone and both (softcap 30, ALiBi slopes 2^-(8 (h + 1) / heads)),
the four in a different order each round (timing_order.py); each time is the median of ROUNDS
rounds of triton.testing.do_bench medians. Prints ms and the ratio to no modifier. Run once per
library to compare builds (a build whose Hopper backward does not take softcap with ALiBi runs
that column on the sm80 kernel):

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/softcap_alibi_backward.py
        [--hdims 64,128,256] [--seqlens 2048,8192] [--masks none,causal] [--rounds 3]
"""
import argparse
import os
import statistics
import sys

import torch
import triton.testing

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))
from timing_order import round_order  # noqa: E402

import flashattn  # noqa: E402

TOKENS = 16384
HEADS = 16
CONFIGS = ("none", "softcap", "alibi", "softcap+alibi")


def backward_runner(config, q, k, v, dout, causal, slopes):
    softcap = 30.0 if "softcap" in config else 0.0
    alibi = slopes if "alibi" in config else None
    out = flashattn.flash_attn_func(q, k, v, causal=causal, softcap=softcap, alibi_slopes=alibi)

    def run():
        q.grad = k.grad = v.grad = None
        out.backward(dout, retain_graph=True)

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)], device="cuda")
    print(f"# {torch.cuda.get_device_name()}, flashattn {os.environ.get('FLASHATTN_LIBRARY', 'default')}, "
          f"bf16, {HEADS} heads, {TOKENS} tokens per batch, backward ms, median of {a.rounds} rounds")
    print("| d | seqlen | mask | " + " | ".join(CONFIGS) + " | both / none |")
    print("|" + " --- |" * (len(CONFIGS) + 4))
    for d in (int(x) for x in a.hdims.split(",")):
        for s in (int(x) for x in a.seqlens.split(",")):
            b = max(1, TOKENS // s)
            q, k, v, dout = (torch.randn(b, s, HEADS, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)
            for mask in a.masks.split(","):
                causal = mask == "causal"
                runners = {c: backward_runner(c, q, k, v, dout, causal, slopes) for c in CONFIGS}
                times = {c: [] for c in CONFIGS}
                for r in range(a.rounds):
                    for c in round_order(CONFIGS, r):
                        times[c].append(triton.testing.do_bench(runners[c], warmup=100, rep=500,
                                                                return_mode="median"))
                ms = {c: statistics.median(times[c]) for c in CONFIGS}
                cells = " | ".join(f"{ms[c]:.3f}" for c in CONFIGS)
                print(f"| {d} | {s} | {mask} | {cells} | {ms['softcap+alibi'] / ms['none']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
