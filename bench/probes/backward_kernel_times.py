"""Kernel time of one flashattn backward call, split by kernel (the main kernel, the pre-pass
D = rowsum(dO * O) with the dQ accumulator zeroed, the post-pass accumulator -> dq), from the
torch profiler over 10 calls; protocol shapes (16k tokens, hidden 2048, bf16).

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/probes/backward_kernel_times.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import flashattn

CALLS = 10


def main():
    for d in (64, 128):
        for s in (1024, 2048, 8192):
            for causal in (False, True):
                h, b = 2048 // d, 16384 // s
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                o = flashattn.flash_attn_func(q, k, v, causal=causal)
                g = torch.randn_like(o)
                for _ in range(3):
                    torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(CALLS):
                        torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
                    torch.cuda.synchronize()
                per_kernel = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        per_kernel[e.name[:60]] = per_kernel.get(e.name[:60], 0.0) + e.device_time / CALLS
                total = sum(per_kernel.values())
                print(f"d{d} s{s} causal={causal}: {total:.1f} us per backward")
                for name, t in sorted(per_kernel.items(), key=lambda x: -x[1])[:5]:
                    print(f"   {t:8.1f} us {100 * t / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
