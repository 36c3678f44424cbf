#!/usr/bin/env python3
"""Decode bandwidth (GB/s of K+V read) at forced split counts: does the split heuristic
(src/cuda/decode/split.h, num_splits=0) pick the best count? bf16, 32/8 heads, d128, one query
token, contiguous cache, CUDA-graph replays (bench/bench_decode.py's timing).

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python:bench python3 bench/probes/decode_split_sweep.py
"""
import bench_decode as bd

SHAPES = ((1, 4096), (1, 16384), (1, 65536), (16, 4096))
SPLITS = (0, 4, 8, 16, 24, 32, 48, 64)

for batch, kv in SHAPES:
    d = bd.Decode(batch, kv)
    row = [f"{s}:{bd.gbs(d.bytes, bd.graph_time_us(d.flashattn_fn(0, s))):.0f}" for s in SPLITS]
    print(f"b{batch} kv{kv}: " + " ".join(row), flush=True)
