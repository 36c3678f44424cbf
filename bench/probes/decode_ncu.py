#!/usr/bin/env python3
"""One decode step of flashattn and one of cuDNN (torch SDPA) per shape, between
cudaProfilerStart/Stop, for ncu to profile side by side (bf16, 32/8 heads, d128, one query
token, bench_decode's contiguous cache). What docs/performance.md 3.6 reports came from:

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python ncu --profile-from-start off \\
      --clock-control none --set full --kernel-name regex:'decode_kernel|cudnn|lean|combine' \\
      -o /tmp/decode python3 bench/probes/decode_ncu.py 64x16384,1x4096
  ncu --import /tmp/decode.ncu-rep --page details
  (--page source --print-source sass for the copies' per-instruction sectors and wavefronts)
"""
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, "bench")
import bench_decode as bd  # noqa: E402


def main():
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[1].split(",")]
    for batch, kv in shapes:
        d = bd.Decode(batch, kv)
        ours, cudnn = d.flashattn_fn(0), d.sdpa_fn(SDPBackend.CUDNN_ATTENTION)
        for fn in (ours, cudnn):
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        ours()
        cudnn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del d
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
