#!/usr/bin/env python3
"""Deterministic varlen backward: the Hopper kernel against the sm80 kernel
(FLASHATTN_DISABLE_SM90=1, read on every call) in one process. 16k tokens in
sequences of ragged lengths (ends inside query tiles), hidden 2048, bf16; time of
forward + backward minus forward (triton do_bench medians), deterministic=True and
False; gradients of the two kernels compared.

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/varlen_deterministic.py [--dropout P]

With --dropout, every call drops with probability P, and the generator is reseeded before the
two kernels' gradient runs, so both draw the same mask.
"""
import argparse
import os

import torch
from triton.testing import do_bench

from flashattn import flash_attn_varlen_func

LENGTHS = [2000, 1777, 3001, 1, 2500, 1300, 4000, 1805]  # 16384 tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dropout", type=float, default=0.0)
    drop = ap.parse_args().dropout
    torch.manual_seed(0)
    cu = torch.tensor([0] + LENGTHS, device="cuda").cumsum(0).to(torch.int32)
    total, longest = int(cu[-1]), max(LENGTHS)
    print(f"| d | causal | det | sm80 ms | Hopper ms | sm80 / Hopper | max |dq| diff |")
    print("|---|---|---|---|---|---|---|")
    for d in (64, 128, 256):
        h = 2048 // d
        q, k, v, do = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            for det in (True, False):
                def run(q=q, k=k, v=v):
                    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                    out = flash_attn_varlen_func(qq, kk, vv, cu, cu, longest, longest, dropout_p=drop,
                                                 causal=causal, deterministic=det)
                    return torch.autograd.grad(out, (qq, kk, vv), do)

                def fwd():
                    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, dropout_p=drop, causal=causal)

                times, grads = {}, {}
                for path in ("sm80", "hopper"):
                    if path == "sm80":
                        os.environ["FLASHATTN_DISABLE_SM90"] = "1"
                    else:
                        os.environ.pop("FLASHATTN_DISABLE_SM90", None)
                    torch.manual_seed(1)
                    grads[path] = run()
                    times[path] = do_bench(run, warmup=10, rep=50) - do_bench(fwd, warmup=10, rep=50)
                os.environ.pop("FLASHATTN_DISABLE_SM90", None)
                diff = (grads["sm80"][0].float() - grads["hopper"][0].float()).abs().max().item()
                print(f"| {d} | {causal} | {det} | {times['sm80']:.3f} | {times['hopper']:.3f} | "
                      f"{times['sm80'] / times['hopper']:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
