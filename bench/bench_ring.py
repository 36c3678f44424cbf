#!/usr/bin/env python3
"""Ring attention scaling over GPUs (issue #32's protocol): per-GPU throughput of
flashattn.ring_attention at P GPUs with P times the sequence, against the single-GPU kernel
on the per-GPU length, forward + backward, bf16, causal and not.

  NCCL_NVLS_ENABLE=0 FLASHATTN_LIBRARY=build/libflashattn.so \\
      torchrun --nproc_per_node=8 bench/bench_ring.py --tokens-per-gpu 8192 16384 32768

Every rank holds its zigzag slice of batch 1 sequences of P * tokens_per_gpu tokens (heads =
2048 / head_dim, default d128). Timing: CUDA events around forward + backward, median of
--reps after --warmup, all ranks synchronised before each repetition; FLOPs per GPU
= 3.5 * 4 * h * s_total^2 * d / P (forward + 2.5x backward), halved when causal. Rank 0
prints a markdown table (efficiency = ring per-GPU TFLOP/s / single-GPU TFLOP/s at the
per-GPU length and the same total work per token) and writes it with the device, date and
command to bench/out/ (git-ignored) or --out.

It needs several GPUs; docs/ring.md has its results on 2 and 4 H100s.
"""
import argparse
import datetime
import os
import shlex
import statistics
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import flashattn  # noqa: E402
from flashattn import ring  # noqa: E402

HIDDEN = 2048
# Forward + backward FLOPs over the forward's (the backward's 5 matmuls to the forward's 2).
FWD_BWD_FACTOR = 3.5


def attention_flops(heads, seqlen, head_dim, causal):
    f = 4.0 * heads * seqlen * seqlen * head_dim * FWD_BWD_FACTOR
    return f / 2 if causal else f


def time_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fwd_bwd(attend, q, k, v, dout):
    def run():
        out = attend(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)
    return run


def bench_row(tokens, head_dim, causal, world, rank, args):
    heads = HIDDEN // head_dim
    seqlen = tokens * world
    gen = torch.Generator(device="cuda").manual_seed(rank)
    shape_local = (1, ring.local_seqlen(seqlen, world, rank), heads, head_dim)
    q, k, v, dout = (torch.randn(shape_local, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    ring_ms = time_ms(fwd_bwd(lambda a, b, c: ring.ring_attention(a, b, c, causal=causal,
                                                                   seqlen=seqlen),
                              q, k, v, dout), args.warmup, args.reps)
    # The single-GPU kernel on the per-GPU length (same per-GPU tokens, 1/P of the keys).
    s_q, s_k, s_v, s_d = (torch.randn((1, tokens, heads, head_dim), device="cuda",
                                      dtype=torch.bfloat16, generator=gen) for _ in range(4))
    for t in (s_q, s_k, s_v):
        t.requires_grad_()
    single_ms = time_ms(fwd_bwd(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=causal),
                                s_q, s_k, s_v, s_d), args.warmup, args.reps)
    ring_tflops = attention_flops(heads, seqlen, head_dim, causal) / world / ring_ms / 1e9
    single_tflops = attention_flops(heads, tokens, head_dim, causal) / single_ms / 1e9
    return (f"| {world} | {tokens} | {head_dim} | {causal} | {ring_ms:.2f} | {ring_tflops:.0f} "
            f"| {single_tflops:.0f} | {ring_tflops / single_tflops:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens-per-gpu", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        raise SystemExit("set NCCL_NVLS_ENABLE=0 (NVLink multicast off; docs/ring.md)")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = ["| GPUs | tokens/GPU | d | causal | ring ms | ring TFLOP/s/GPU | single TFLOP/s "
            "| efficiency |", "|---|---|---|---|---|---|---|---|"]
    for tokens in args.tokens_per_gpu:
        for causal in (False, True):
            rows.append(bench_row(tokens, args.head_dim, causal, world, rank, args))
    if rank == 0:
        header = (f"device: {torch.cuda.get_device_name()} x{world}\n"
                  f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat()}\n"
                  f"commit: {flashattn.library_commit()}\n"
                  f"command: NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node={world} "
                  f"{shlex.join(sys.argv)}\n")
        table = header + "\n".join(rows) + "\n"
        print(table)
        out = args.out or os.path.join(HERE, "out", f"bench_ring_{world}gpu.md")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            f.write(table)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
