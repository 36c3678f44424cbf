#!/usr/bin/env python3
"""Throughput, SM clock and board power of forward kernels run back to back for seconds.

The H100 runs most protocol shapes at its 700 W cap, where the clock a kernel gets depends on
the energy it spends per unit of work; do_bench's 100-500 ms windows mix that with the previous
kernel's heat. Here each library (NAME=PATH, as bench/sm90_fwd_ab.py) and torch's cuDNN SDPA run
one shape for `--seconds` in batches of 20 calls timed with CUDA events, while nvidia-smi samples
the clock and power every 50 ms; prints the median TFLOP/s of the second half of the window (and
of the first), and the median clock / power of the last three quarters. Two rounds.

  PYTHONPATH=python python3 bench/probes/sm90_fwd_sustained.py new=build/libflashattn.so --shapes 128x2048,128x4096
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "..", "python")]  # sm90_fwd_ab, flashattn
from sm90_fwd_ab import load_binding  # noqa: E402

TOKENS, HIDDEN = 16384, 2048


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libs", nargs="+", help="NAME=path/to/libflashattn.so")
    ap.add_argument("--shapes", default="128x2048", help="HDIMxSEQLEN,... (non-causal)")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    bind = {n: load_binding(n, p) for n, p in (x.split("=", 1) for x in args.libs)}
    for shape in args.shapes.split(","):
        d, s = (int(x) for x in shape.split("x"))
        b, h = TOKENS // s, HIDDEN // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        o = torch.empty_like(q)
        lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
        fns = {n: (lambda m=m: m.forward(q, k, v, o, lse, causal=False)) for n, m in bind.items()}

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt)
        fns["cudnn"] = cudnn
        flop = 4.0 * b * h * s * s * d
        for rnd in range(2):
            for name, fn in fns.items():
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
                t0, ms = time.time(), []
                while time.time() - t0 < args.seconds:
                    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    for _ in range(20):
                        fn()
                    z.record()
                    torch.cuda.synchronize()
                    ms.append(a.elapsed_time(z) / 20)
                smi.terminate()
                rows = [[float(x) for x in line.split(",")] for line in smi.communicate()[0].split("\n") if line.strip()]
                rows = rows[len(rows) // 4:]
                late, early = ms[len(ms) // 2:], ms[:len(ms) // 2]
                print(f"d{d} s{s} round {rnd} {name:8s}: {flop / statistics.median(late) / 1e9:4.0f} TFLOP/s "
                      f"(first half {flop / statistics.median(early) / 1e9:.0f}); clock "
                      f"{statistics.median(r[0] for r in rows):.0f} MHz, power {statistics.median(r[1] for r in rows):.0f} W",
                      flush=True)


if __name__ == "__main__":
    main()
