"""CPU backend: forward and forward + backward time with random block masks of several
densities against the same call without a mask: does a skipped block cost nothing?

    FLASHATTN_LIBRARY=build-cpu/libflashattn.so PYTHONPATH=python \\
        python3 bench/probes/block_sparse_cpu.py [--seqlen 2048] [--threads 1]

Prints the median of --repeats wall-clock timings per configuration (ms) and its ratio to
the dense call; float32, batch 1, 2 heads, head dim 64, blocks 128 x 128. The
configurations take turns within each repeat, so load from other processes and clock
drift spread over all of them instead of biasing the one timed last.
"""

import argparse
import statistics
import time

import numpy as np

import flashattn
from flashattn import _capi


def random_mask(rng, heads, n_blocks, density):
    """Every (query block, key block) pair listed with probability density, as partial."""
    listed = rng.random((1, heads, n_blocks, n_blocks)) < density
    num = listed.sum(-1).astype(np.int32)
    idx = np.zeros((1, heads, n_blocks, n_blocks), np.int32)
    for pos in np.ndindex(1, heads, n_blocks):
        blocks = np.flatnonzero(listed[pos])
        idx[pos][:len(blocks)] = blocks
    return flashattn.BlockMask(num, idx, BLOCK_SIZE=128)


def once_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, heads, d = args.seqlen, 2, 64
    q, k, v, dout = (rng.standard_normal((1, n, heads, d)).astype(np.float32) for _ in range(4))
    out = np.empty_like(q)
    lse = np.empty((1, heads, n), np.float32)
    dq, dk, dv = (np.empty_like(q) for _ in range(3))
    common = dict(backend="cpu", num_threads=args.threads)

    def run(mask, backward):
        _capi.forward(q, k, v, out, lse, block_mask=mask, **common)
        if backward:
            _capi.backward(q, k, v, out, dout, lse, dq, dk, dv, block_mask=mask, **common)

    configs = [("none", None)] + [(f"density {density:<4}", random_mask(rng, heads, (n + 127) // 128, density))
                                  for density in (1.0, 0.5, 0.1)]
    times = {(name, b): [] for name, _ in configs for b in (False, True)}
    for _ in range(args.repeats):
        for name, mask in configs:
            for b in (False, True):
                times[(name, b)].append(once_ms(lambda: run(mask, b)))
    med = {key: statistics.median(t) for key, t in times.items()}
    print(f"seqlen {n}, heads {heads}, d {d}, f32, {args.threads} thread(s), blocks 128 x 128")
    print("mask            fwd ms  ratio   fwd+bwd ms  ratio")
    for name, _ in configs:
        f, fb = med[(name, False)], med[(name, True)]
        print(f"{name:<12}  {f:8.1f}   {f / med[('none', False)]:.2f}   {fb:10.1f}   {fb / med[('none', True)]:.2f}")


if __name__ == "__main__":
    main()
