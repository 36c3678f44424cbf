"""Where a block-mask call's host time goes: the host time of one flash_attn_func forward
call (after a synchronize, median of 30) with random 128 x 128 block lists at densities 1 and
0.1 and without a mask, and cProfile's top functions over 50 calls (bf16, batch 1, 16 heads,
seqlen 8192, d128; the lists as in block_sparse_cuda.py).

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/block_mask_host.py
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import flashattn
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from block_sparse_cuda import random_lists, BLOCK

n, h, d = 8192, 16, 128
q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gen = torch.Generator().manual_seed(0)
for density in (1.0, 0.1):
    num, idx = random_lists(gen, h, n // BLOCK, density)
    hm = flashattn.BlockMask(num, idx, None, None, BLOCK_SIZE=BLOCK)
    call = lambda: flashattn.flash_attn_func(q, k, v, block_mask=hm)
    with torch.no_grad():
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        ts = []
        for _ in range(30):
            torch.cuda.synchronize()
            t = time.perf_counter(); call(); ts.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        print(f"density {density}: host ms per call median {statistics.median(ts):.3f} min {min(ts):.3f}")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
        print("\n".join(s.getvalue().splitlines()[:30]))
# dense for comparison
with torch.no_grad():
    ts = []
    for _ in range(30):
        torch.cuda.synchronize()
        t = time.perf_counter(); flashattn.flash_attn_func(q, k, v); ts.append((time.perf_counter() - t) * 1e3)
    print(f"dense: host ms per call median {statistics.median(ts):.3f}")
