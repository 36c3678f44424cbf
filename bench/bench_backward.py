"""Backward-pass benchmark: flashattn's CUDA backward vs torch SDPA (FlashAttention-2
and cuDNN backends), the protocol of docs/performance.md.

Shapes: batch*seqlen = 16384 tokens, hidden 2048 (heads = 2048 / headdim), bf16,
q/k/v/dout from randn. FLOPs: backward = 2.5 * 4*b*h*s*s*d (halved when causal).
Timing: triton.testing.do_bench median.

torch backends: backward time = time(fwd+bwd) - time(fwd), as the protocol says.
flashattn: its backward alone (out and lse come from torch's FA2 forward, since
the library's CUDA forward is a separate kernel); the deterministic mode is
timed too and its cost reported. Each flashattn result is first checked
against torch's float32 gradients where that reference fits in memory
(batch * heads * seqlen^2 <= 2^29; "-" in the rel err column otherwise).

Usage: FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \
       python3 bench/bench_backward.py [--quick] [--out bench/out/backward.md]
"""

import argparse
import datetime
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn import _capi

TOKENS, HIDDEN = 16384, 2048


def flops_bwd(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return 2.5 * (f / 2 if causal else f)


def time_ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def torch_bwd_ms(backend, q, k, v, do, causal):
    """time(fwd+bwd) - time(fwd) through SDPA autograd, layout (b, h, s, d)."""
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def fwd_bwd():
        o = fwd()
        torch.autograd.grad(o, (qt, kt, vt), dot)

    try:
        return time_ms(fwd_bwd) - time_ms(fwd)
    except RuntimeError as e:  # backend refuses the shape
        print(f"  {backend}: {e}", file=sys.stderr)
        return float("nan")


def _err(err):
    """The check's relative error, or "-" where the shape was too large for the float32 reference."""
    return "-" if math.isnan(err) else "%.1e" % err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="seqlen 1k and 4k only")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    seqlens = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    rows = []
    for d in [int(x) for x in args.hdims.split(",")]:
        h = HIDDEN // d
        for causal in (False, True):
            for s in seqlens:
                b = TOKENS // s
                q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                               for _ in range(4))
                # out and lse from torch's FA2 forward (b, h, s, d views of our (b, s, h, d)).
                o_t, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal)[:2]
                out = o_t.transpose(1, 2)
                dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
                ws = {}
                for det in (False, True):
                    n = _capi.backward_workspace_size(q, k, v, causal=causal, deterministic=det)
                    ws[det] = torch.empty(n, dtype=torch.uint8, device="cuda")

                def ours(det):
                    _capi.backward(q, k, v, out, do, lse, dq, dk, dv, causal=causal,
                                   deterministic=det, workspace=ws[det])

                # Check against torch's gradients before timing.
                qt, kt, vt = (x.detach().transpose(1, 2).float().requires_grad_(True) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.MATH):
                    ref = torch.autograd.grad(
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                        (qt, kt, vt), do.transpose(1, 2).float()) if b * h * s * s <= 2**29 else None
                ours(False)
                torch.cuda.synchronize()
                err = float("nan")
                if ref is not None:
                    err = max(((g.float() - r.transpose(1, 2)).norm() / r.norm()).item()
                              for g, r in zip((dq, dk, dv), ref))
                    assert err < 2e-2, f"flashattn gradients off: rel err {err}"
                del ref, qt, kt, vt

                fl = flops_bwd(b, h, s, d, causal)
                t_ours = time_ms(lambda: ours(False))
                t_det = time_ms(lambda: ours(True))
                t_fa2 = torch_bwd_ms(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal)
                t_cud = torch_bwd_ms(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal)
                tf = lambda t: fl / (t * 1e-3) / 1e12
                row = (d, "causal" if causal else "none", s, tf(t_ours), tf(t_det), tf(t_fa2),
                       tf(t_cud), t_fa2 / t_ours, t_cud / t_ours, t_det / t_ours - 1, err)
                rows.append(row)
                print("d%-4d %-7s s=%-6d ours %6.1f det %6.1f fa2 %6.1f cudnn %6.1f | "
                      "vs fa2 %.2fx vs cudnn %.2fx det cost %+.0f%% err %s" %
                      (row[0], row[1], row[2], *row[3:9], 100 * row[9], _err(row[10])), flush=True)
                del q, k, v, do, out, lse, dq, dk, dv, ws, o_t

    lines = [
        f"# Backward TFLOP/s ({dev}, {datetime.date.today()}, torch {torch.__version__})",
        "",
        "flashattn: backward kernel alone; torch: time(fwd+bwd) - time(fwd). bf16, 16k tokens, hidden 2048.",
        "",
        "| hdim | mask | seqlen | flashattn | flashattn det | torch FA2 | cuDNN | vs FA2 | vs cuDNN | det cost | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| %d | %s | %d | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx | %+.0f%% | %s |" %
                     (*r[:9], 100 * r[9], _err(r[10])))
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
