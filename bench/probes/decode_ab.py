#!/usr/bin/env python3
"""A/B of decode kernels: several builds of libflashattn, each in its own process (one library
per process, as bench/bench_decode.py runs), in turn for `--rounds` rounds, on the benchmark's
shapes (bf16, 32/8 heads, d128, one query token, CUDA-graph replays). Prints GB/s of K+V read
per build and round, then the median per build and its ratio to the first build. List an A/A
copy of the baseline to see the run's own spread. Each process also checks its output against
SDPA's math backend (max difference printed).

  PYTHONPATH=python:bench python3 bench/probes/decode_ab.py base=a/libflashattn.so new=b/libflashattn.so \\
      [--pages 0,16] [--rounds 2] [--shapes 1x4096,16x4096] [--hdim 128]
  (a build may carry environment variables for its process: small=b/libflashattn.so,FLASHATTN_DECODE_SMALL_RING=1)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def child(pages, shapes, hdim):
    """Runs in the child process: GB/s per (shape, page) for the library FLASHATTN_LIBRARY names."""
    import torch
    import bench_decode as bd
    bd.HEAD_DIM = hdim  # read by bench_decode.Decode at every call
    rows = {}
    for batch, kv in shapes:
        d = bd.Decode(batch, kv)
        for page in pages:
            rows[f"{batch}x{kv} p{page}"] = bd.gbs(d.bytes, bd.graph_time_us(d.flashattn_fn(page)))
        rows[f"{batch}x{kv} diff"] = max(d.max_difference(page) for page in pages)
        del d
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(rows), flush=True)


def run_build(path, args):
    # path[,KEY=VALUE...]: the library and environment variables of its process
    path, *settings = path.split(",")
    env = dict(os.environ, FLASHATTN_LIBRARY=os.path.abspath(path), **dict(s.split("=", 1) for s in settings))
    cmd = [sys.executable, __file__, "--child", "--pages", args.pages, "--shapes", args.shapes,
           "--hdim", str(args.hdim)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{path}: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def parse_shapes(text):
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="*", help="NAME=path/to/libflashattn.so[,ENV=VALUE...] (variables for that "
                    "build's process, e.g. FLASHATTN_DECODE_SMALL_RING=1)")
    ap.add_argument("--pages", default="0", help="page sizes, 0 = contiguous cache")
    ap.add_argument("--shapes", default="1x4096,1x16384,1x65536,1x262144,16x4096,16x16384,"
                    "64x4096,64x16384,128x8192")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hdim", type=int, default=128, help="head dim (bench_decode's shapes otherwise)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    pages = [int(p) for p in args.pages.split(",")]
    if args.child:
        child(pages, parse_shapes(args.shapes), args.hdim)
        return
    builds = [lib.split("=", 1) for lib in args.libs]
    results = {name: [] for name, _ in builds}
    for r in range(args.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, path in order:
            res = run_build(path, args)
            results[name].append(res)
            print(f"round {r} {name}: " + " ".join(f"{k}={v:.0f}" if "diff" not in k else f"{k}={v:.1e}"
                                                   for k, v in res.items()), flush=True)
    base = builds[0][0]
    keys = [k for k in results[base][0] if "diff" not in k]
    print("| shape | " + " | ".join(name for name, _ in builds) + " | " +
          " | ".join(f"{name} / {base}" for name, _ in builds[1:]) + " |")
    print("|---" * (1 + 2 * len(builds) - 1) + "|")
    for k in keys:
        med = {name: statistics.median(res[k] for res in results[name]) for name, _ in builds}
        print(f"| {k} | " + " | ".join(f"{med[name]:.0f}" for name, _ in builds) + " | " +
              " | ".join(f"{med[name] / med[base]:.3f}" for name, _ in builds[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
