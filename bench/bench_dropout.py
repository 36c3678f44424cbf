"""Dropout's cost on the CUDA kernels (docs/variants.md, "Dropout's cost").

For each shape (bf16, 16 heads, TOKENS tokens per batch, d 128 by default) and mask, times
flashattn.flash_attn_func forward and forward + backward (autograd, as bench_attention.py
--backward) in four configurations:
  sm80        FLASHATTN_DISABLE_SM90=1, no dropout
  sm80+drop   FLASHATTN_DISABLE_SM90=1, dropout_p = P
  hopper      the default dispatch (the Hopper kernels on an H100), no dropout
  hopper+drop the default dispatch with dropout_p = P (the Hopper forward and backward)
Each time is the median of ROUNDS rounds of triton.testing.do_bench medians (warmup 100 ms,
rep 500 ms), the four configurations in a different order each round (timing_order.py).
Prints a table with the ratios dropout / sm80 and dropout / hopper.

    python3 bench/bench_dropout.py [--seqlens 2048,8192] [--masks none,causal] [--p 0.1]
                                   [--configs hopper,hopper+drop]   (a subset, for A/B runs of builds)
                                   [--density 0.5]   (every call with a block mask: random lists of
                                                      128 x 128 blocks per batch and head, all full)
"""
import argparse
import os
import statistics
import sys

import torch
import triton.testing

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from timing_order import round_order  # noqa: E402

import flashattn  # noqa: E402

TOKENS = 16384
HEADS = 16
CONFIGS = ("sm80", "sm80+drop", "hopper", "hopper+drop")


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=100, rep=500, return_mode="median")


BLOCK = 128


def random_block_mask(batch, seqlen, density, gen):
    """A flashattn.BlockMask of 128 x 128 blocks, each (query block, key block) listed with
    probability `density`, every listed block full (host lists, as a caller keeping its mask)."""
    n = (seqlen + BLOCK - 1) // BLOCK
    listed = torch.rand((batch, HEADS, n, n), generator=gen) < density
    num = listed.sum(-1).to(torch.int32)
    order = torch.argsort((~listed).to(torch.int32) * n + torch.arange(n), dim=-1).to(torch.int32)
    return flashattn.BlockMask(torch.zeros_like(num), order, num, order, BLOCK_SIZE=BLOCK)


def runner(config, q, k, v, dout, causal, p, backward, block_mask=None):
    """A zero-argument callable for one configuration (sets the dispatch switch itself)."""
    sm80 = config.startswith("sm80")
    drop = p if config.endswith("+drop") else 0.0

    def run():
        if sm80:
            os.environ["FLASHATTN_DISABLE_SM90"] = "1"  # read by the library at every call
        else:
            os.environ.pop("FLASHATTN_DISABLE_SM90", None)
        if backward:
            flashattn.flash_attn_func(q, k, v, dropout_p=drop, causal=causal, block_mask=block_mask).backward(dout)
        else:
            with torch.no_grad():
                flashattn.flash_attn_func(q, k, v, dropout_p=drop, causal=causal, block_mask=block_mask)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="a subset of " + ",".join(CONFIGS))
    ap.add_argument("--density", type=float, default=None, help="every call with a random block mask")
    args = ap.parse_args()
    configs = args.configs.split(",")
    if any(c not in CONFIGS for c in configs):
        ap.error(f"--configs: each of {','.join(CONFIGS)}")
    print(f"# {torch.cuda.get_device_name()}, flashattn {flashattn._capi.library_path()}, "
          f"bf16, {HEADS} heads, d {args.hdim}, {TOKENS} tokens per batch, dropout_p {args.p}, "
          f"median of {args.rounds} rounds of do_bench medians"
          + ("" if args.density is None else f", block mask of density {args.density} (128 x 128 blocks)"))
    ratios = [(f"{base}+drop", base) for base in ("sm80", "hopper") if base in configs and f"{base}+drop" in configs]
    print("| seqlen | mask | pass | " + " | ".join(f"{c} ms" for c in configs)
          + "".join(f" | drop / {base}" for _, base in ratios) + " |")
    print("|" + " --- |" * (3 + len(configs) + len(ratios)))
    for s in (int(x) for x in args.seqlens.split(",")):
        b = max(1, TOKENS // s)
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, s, HEADS, args.hdim, device="cuda", dtype=torch.bfloat16, generator=gen,
                               requires_grad=True) for _ in range(3))
        dout = torch.randn(b, s, HEADS, args.hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
        bm = None if args.density is None else random_block_mask(b, s, args.density, torch.Generator().manual_seed(s))
        for mask in args.masks.split(","):
            causal = mask == "causal"
            for backward in (False, True):
                times = {c: [] for c in configs}
                for r in range(args.rounds):
                    for c in round_order(list(configs), r):
                        times[c].append(time_ms(runner(c, q, k, v, dout, causal, args.p, backward, bm)))
                med = {c: statistics.median(times[c]) for c in configs}
                print(f"| {s} | {mask} | {'fwd+bwd' if backward else 'fwd'} | "
                      + " | ".join(f"{med[c]:.3f}" for c in configs)
                      + "".join(f" | {med[d] / med[base]:.3f}" for d, base in ratios) + " |", flush=True)
    os.environ.pop("FLASHATTN_DISABLE_SM90", None)


if __name__ == "__main__":
    main()
