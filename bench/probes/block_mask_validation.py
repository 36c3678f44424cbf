"""CPU backend: what validating a large block mask costs per call. A forward over 64 query
and 64 key rows with 16 heads and 1 x 1 blocks, every block listed (65,536 list entries),
against the same call without a mask; the attention itself is tiny, so the difference is
the lists' validation and walk.

    FLASHATTN_LIBRARY=build-cpu/libflashattn.so PYTHONPATH=python \\
        python3 bench/probes/block_mask_validation.py [--repeats 20]

Prints the median wall-clock time per call (ms) of each; float32, head dim 64, one thread.
"""

import argparse
import statistics
import time

import numpy as np

from flashattn import _capi

HEADS, SEQLEN, HEAD_DIM = 16, 64, 64


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, SEQLEN, HEADS, HEAD_DIM)).astype(np.float32)
    out, lse = np.empty_like(q), np.empty((1, HEADS, SEQLEN), np.float32)
    num = np.full((1, HEADS, SEQLEN), SEQLEN, np.int32)
    idx = np.broadcast_to(np.arange(SEQLEN, dtype=np.int32), (1, HEADS, SEQLEN, SEQLEN)).copy()
    mask = _capi.BlockMask(num, idx, BLOCK_SIZE=(1, 1))
    for name, m in (("no mask", None), (f"block mask ({idx.size} entries)", mask)):
        for _ in range(3):
            _capi.forward(q, q, q, out, lse, block_mask=m, num_threads=1)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            _capi.forward(q, q, q, out, lse, block_mask=m, num_threads=1)
            times.append(time.perf_counter() - t)
        print(f"{name}: {statistics.median(times) * 1e3:.2f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
