"""Kernel time of block-sparse calls, one library per process, for A/B runs of two builds
(each invocation prints one line per mask; run it once per library, in turns).

    FLASHATTN_LIBRARY=A/libflashattn.so PYTHONPATH=python python3 bench/probes/block_sparse_ab.py TAG [BLOCK]

bf16, batch 1, 16 heads, seqlen 8192, d 128; the masks of bench/probes/block_sparse_cuda.py
(random lists of BLOCK x BLOCK blocks at densities 1, 0.5, 0.1, every listed block "full", and
create_block_mask's causal mask with causal=True); BLOCK 128 by default (64 or 32: blocks that
cut the Hopper kernels' tiles). Per mask: the forward's and the backward's kernel time per
call (the CUDA profiler's summed kernel and copy durations, the backward as forward +
backward minus forward; block_sparse_cuda.kernel_ms, 20 calls after 3 warm-up calls).
"""

import sys

import torch
from torch.nn.attention import flex_attention as flex

import block_sparse_cuda as probe
import flashattn


def main():
    tag = sys.argv[1]
    probe.BLOCK = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    n, h, d = 8192, 16, 128
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    masks = []
    for density in (1.0, 0.5, 0.1):
        num, idx = probe.random_lists(gen, h, n // probe.BLOCK, density)
        masks.append((f"random {density}", False, probe.flex_mask_from_full(num, idx, n)))
    causal = flex.create_block_mask(lambda b, hh, i, j: i >= j, None, None, n, n, device="cuda",
                                    BLOCK_SIZE=probe.BLOCK)
    masks.append(("causal", True, causal))
    for name, is_causal, bm in masks:
        hm = probe.host_mask(bm)
        f, fb = probe.fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=is_causal, block_mask=hm),
                                 (q, k, v), dout, 3, 20, probe.kernel_ms)
        print(f"{tag} | blocks {probe.BLOCK} | {name} | fwd {f:.4f} ms | bwd {fb - f:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
