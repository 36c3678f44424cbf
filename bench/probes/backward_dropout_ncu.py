#!/usr/bin/env python3
"""One Hopper backward call without and one with dropout (p 0.1), between
cudaProfilerStart/Stop, for ncu to profile side by side (bf16, batch 8, 2048 tokens, 16
heads, d128). What docs/variants.md ("Dropout's cost") reports came from:

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python ncu --profile-from-start off \\
      --set full --kernel-name regex:'backward_kernel' -o /tmp/bwd \\
      python3 bench/probes/backward_dropout_ncu.py
  ncu --import /tmp/bwd.ncu-rep --page raw --csv   (instructions, stall samples, local memory)
"""
import torch

import flashattn

BATCH, SEQLEN, HEADS, HEAD_DIM = 8, 2048, 16, 128


def main():
    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, SEQLEN, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    calls = []
    for p in (0.0, 0.1):
        o = flashattn.flash_attn_func(q, k, v, dropout_p=p)
        g = torch.randn_like(o)
        for _ in range(2):
            torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
        calls.append((o, g))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for o, g in calls:
        torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
