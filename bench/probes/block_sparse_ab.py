"""Kernel time of block-sparse calls, one library per process, for A/B runs of two builds
(each invocation prints one line per mask; run it once per library, in turns).

    FLASHATTN_LIBRARY=A/libflashattn.so PYTHONPATH=python \\
        python3 bench/probes/block_sparse_ab.py TAG [--block 128] [--varlen]

bf16, 16 heads, d 128. Fixed length (default): batch 1, seqlen 8192, the masks of
bench/probes/block_sparse_cuda.py (random lists of BLOCK x BLOCK blocks at densities 1, 0.5,
0.1, every listed block "full", and create_block_mask's causal mask with causal=True);
--block 64 or 32: blocks that cut the Hopper kernels' tiles. --varlen: four sequences of
2048 / 1536 / 2048 / 1024 tokens through flash_attn_varlen_func, random per-sequence lists
at densities 1, 0.5, 0.1, each without and with causal. Per mask: the forward's and the
backward's kernel time per call (the CUDA profiler's summed kernel and copy durations, the
backward as forward + backward minus forward; block_sparse_cuda.kernel_ms, 20 calls after 3
warm-up calls).
"""

import argparse

import torch
from torch.nn.attention import flex_attention as flex

import block_sparse_cuda as probe
import flashattn

HEADS, DIM = 16, 128


def fixed_length_calls(gen):
    """(name, call) of the fixed-length masks, and the inputs."""
    n = 8192
    q, k, v, dout = (torch.randn(1, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    calls = []
    for density in (1.0, 0.5, 0.1):
        num, idx = probe.random_lists(gen, HEADS, n // probe.BLOCK, density)
        hm = probe.host_mask(probe.flex_mask_from_full(num, idx, n))
        calls.append((f"random {density}", hm, False))
    causal = flex.create_block_mask(lambda b, hh, i, j: i >= j, None, None, n, n, device="cuda",
                                    BLOCK_SIZE=probe.BLOCK)
    calls.append(("causal", probe.host_mask(causal), True))
    return [(name, lambda a, b, c, hm=hm, cz=cz: flashattn.flash_attn_func(a, b, c, causal=cz, block_mask=hm))
            for name, hm, cz in calls], (q, k, v), dout


def varlen_calls(gen):
    """(name, call) of the varlen masks, and the inputs."""
    lens, n = [2048, 1536, 2048, 1024], 2048
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v, dout = (torch.randn(sum(lens), HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    blocks = n // probe.BLOCK
    calls = []
    for density in (1.0, 0.5, 0.1):
        listed = torch.rand((len(lens), HEADS, blocks, blocks), generator=gen) < density
        num = listed.sum(-1).to(torch.int32)
        order = torch.argsort((~listed).to(torch.int32) * blocks + torch.arange(blocks), dim=-1).to(torch.int32)
        bm = flashattn.BlockMask(num, order, None, None, BLOCK_SIZE=probe.BLOCK)
        for causal in (False, True):
            calls.append((f"varlen random {density}{' causal' if causal else ''}",
                          lambda a, b, c, bm=bm, cz=causal: flashattn.flash_attn_varlen_func(
                              a, b, c, cu, cu, n, n, causal=cz, block_mask=bm)))
    return calls, (q, k, v), dout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tag")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--varlen", action="store_true")
    args = ap.parse_args()
    probe.BLOCK = args.block
    gen = torch.Generator().manual_seed(0)
    calls, inputs, dout = (varlen_calls if args.varlen else fixed_length_calls)(gen)
    inputs = tuple(t.requires_grad_() for t in inputs)
    for name, call in calls:
        f, fb = probe.fwd_and_fb(call, inputs, dout, 3, 20, probe.kernel_ms)
        print(f"{args.tag} | blocks {probe.BLOCK} | {name} | fwd {f:.4f} ms | bwd {fb - f:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
