#!/usr/bin/env python3
"""The block-sparse backward, plain and deterministic, on the Hopper kernel and on the sm80
kernel (FLASHATTN_DISABLE_SM90=1, read on every call) in one process: 8k tokens, 16 heads,
d128, bf16, random 128 x 128 block lists of density 0.5 (each query block keeps its
diagonal block), causal and not. Time: forward + backward minus forward (triton do_bench
medians). Also prints whether two deterministic calls gave the same bits and the largest dq
difference between the two kernels.

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/block_sparse_deterministic.py
"""
import os

import numpy as np
import torch
from triton.testing import do_bench

import flashattn

N, HEADS, HEAD_DIM, BLOCK, DENSITY = 8192, 16, 128, 128, 0.5


def random_mask(causal, rng):
    blocks = N // BLOCK
    lists = [[kb for kb in range(blocks) if (not causal or kb <= qb) and (rng.random() < DENSITY or kb == qb)]
             for qb in range(blocks)]
    num = np.array([[[len(ks) for ks in lists]]], np.int32)
    idx = np.zeros((1, 1, blocks, blocks), np.int32)
    for qb, ks in enumerate(lists):
        idx[0, 0, qb, :len(ks)] = ks
    return flashattn.BlockMask(torch.from_numpy(num), torch.from_numpy(idx), BLOCK_SIZE=BLOCK)


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    print("| causal | sm80 ms | sm80 det ms | Hopper ms | Hopper det ms | det bitwise (sm80 / Hopper) | max dq diff |")
    print("|---|---|---|---|---|---|---|")
    for causal in (False, True):
        bm = random_mask(causal, rng)
        q, k, v, do = (torch.randn(1, N, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        res = {}
        for path in ("sm80", "hopper"):
            if path == "sm80":
                os.environ["FLASHATTN_DISABLE_SM90"] = "1"
            else:
                os.environ.pop("FLASHATTN_DISABLE_SM90", None)
            for det in (False, True):
                def run():
                    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                    out = flashattn.flash_attn_func(qq, kk, vv, causal=causal, deterministic=det, block_mask=bm)
                    return torch.autograd.grad(out, (qq, kk, vv), do)

                def fwd():
                    return flashattn.flash_attn_func(q, k, v, causal=causal, block_mask=bm)

                first, second = run(), run()
                same = all(torch.equal(a, b) for a, b in zip(first, second))
                ms = do_bench(run, warmup=5, rep=40) - do_bench(fwd, warmup=5, rep=40)
                res[(path, det)] = (ms, same, first[0])
        os.environ.pop("FLASHATTN_DISABLE_SM90", None)
        diff = (res[("sm80", True)][2].float() - res[("hopper", True)][2].float()).abs().max().item()
        print(f"| {causal} | {res[('sm80', False)][0]:.3f} | {res[('sm80', True)][0]:.3f} | "
              f"{res[('hopper', False)][0]:.3f} | {res[('hopper', True)][0]:.3f} | "
              f"{res[('sm80', True)][1]} / {res[('hopper', True)][1]} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
