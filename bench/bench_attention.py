#!/usr/bin/env python3
"""Attention throughput: flashattn against torch SDPA's FlashAttention-2 and cuDNN backends.

Protocol (docs/performance.md): batch * seqlen = 16k tokens, hidden 2048 (heads =
2048 / head_dim), seqlen 512..16k, head dims 64/128/256, causal and not, bf16, q/k/v from
randn; every implementation timed in this one process with triton.testing.do_bench
(median of CUDA-event timings after warm-up). FLOPs: forward 4*b*h*s*s*d, halved when causal;
backward 2.5x forward, timed as time(forward + backward) - time(forward).

Layouts: ours is (b, s, h, d); torch SDPA takes (b, h, s, d), given here as a transposed view
of the same memory (what flash-attn users pass; no copy inside the timed region).

  FLASHATTN_LIBRARY=build/libflashattn.so python3 bench/bench_attention.py [--backward]

prints a markdown table and writes it, with device, date, git commit and the command, to
bench/out/ (git-ignored) or --out.
"""
import argparse
import datetime
import os
import shlex
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)  # timing_order, also when flashattn.bench loads this file
from timing_order import round_order  # noqa: E402

TOKENS = 16384
HIDDEN = 2048


def flops(b, h, s, d, causal, backward):
    f = 4.0 * b * h * s * s * d
    if causal:
        f /= 2
    return f * 2.5 if backward else f


def ours_forward():
    """fa_forward through the project's ctypes binding, into preallocated out/lse."""
    from flashattn import _capi

    def run(q, k, v, out, lse, causal):
        _capi.forward(q, k, v, out, lse, causal=causal)

    return run


def make_fns(b, h, s, d, causal, backward):
    """name -> (forward, forward + backward or None): zero-argument callables."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (b, s, h, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen,
                           requires_grad=backward) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (b, h, s, d) views
    fns = {}

    if backward:
        import flashattn

        def ours_fwd():
            return flashattn.flash_attn_func(q, k, v, causal=causal)
    else:
        run = ours_forward()
        out = torch.empty_like(q)
        lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)

        def ours_fwd():
            run(q, k, v, out, lse, causal)
            return out
    fns["ours"] = (ours_fwd, (lambda: ours_fwd().backward(dout)) if backward else None)
    if backward:  # the deterministic backward (--impls ours,ours-det,...): its cost vs "ours"
        def ours_det_fwd():
            return flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=True)
        fns["ours-det"] = (ours_det_fwd, lambda: ours_det_fwd().backward(dout))

    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def sdpa_fwd(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        fns[name] = (sdpa_fwd, (lambda f=sdpa_fwd: f().backward(dout.transpose(1, 2))) if backward else None)

    def check():
        """max |ours - torch FA2| on the forward output (sanity: we time the right thing)."""
        with torch.no_grad():
            o_ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            o = torch.empty_like(q)
            ours_forward()(q.detach(), k.detach(), v.detach(), o, None, causal)
            return (o.float() - o_ref.float()).abs().max().item()

    return fns, check


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=100, rep=500, return_mode="median")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--backward", action="store_true", help="time the backward pass instead")
    ap.add_argument("--impls", default="ours,fa2,cudnn")
    ap.add_argument("--sm80", action="store_true",
                    help="time the sm80 (mma.sync) kernels on every GPU (sets FLASHATTN_DISABLE_SM90=1)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every implementation this many times per shape, the order varied "
                         "each round (timing_order.py), and report each one's median (1: one pass, ours first)")
    ap.add_argument("--out", default=None, help="results file (default: bench/out/<date>-<device>-<mode>.md)")
    args = ap.parse_args()

    if args.sm80:
        os.environ["FLASHATTN_DISABLE_SM90"] = "1"  # read by the library at every call
    impls = args.impls.split(",")
    mode = "backward" if args.backward else "forward"
    dev = torch.cuda.get_device_name()
    rows = []
    header = ("| hdim | mask | seqlen | " + " | ".join(f"{i} TFLOP/s" for i in impls) +
              (" | ours/FA2 | ours/cuDNN | max abs diff |" if "ours" in impls else " |"))
    print(header, flush=True)
    print("|" + "---|" * (header.count("|") - 1), flush=True)
    for d in (int(x) for x in args.hdims.split(",")):
        for mask in args.masks.split(","):
            causal = mask == "causal"
            for s in (int(x) for x in args.seqlens.split(",")):
                h, b = HIDDEN // d, TOKENS // s
                fns, check = make_fns(b, h, s, d, causal, args.backward)
                # NOTES (--rounds): the GPU runs at its power cap on most shapes, so its clock
                # depends on what ran just before; a fixed order times ours right after the
                # previous shape's cuDNN and cuDNN right after FA2 (the coolest). round_order
                # varies who follows whom (timing_order.py) and the medians spread it out.
                times = {name: [] for name in impls}
                for r in range(args.rounds):
                    for name in round_order(impls, r):
                        try:
                            fwd, fwd_bwd = fns[name]
                            t = time_ms(fwd)
                            if args.backward:
                                t = time_ms(fwd_bwd) - t
                            times[name].append(t)
                        except Exception as e:  # a backend that refuses a shape: say so, keep going
                            print(f"<!-- {name} d={d} s={s} {mask}: {type(e).__name__}: {e} -->", flush=True)
                            times[name].append(float("nan"))
                tf = {name: flops(b, h, s, d, causal, args.backward) / (statistics.median(t) * 1e-3) / 1e12
                      for name, t in times.items()}
                cells = [f"{tf[n]:.0f}" for n in impls]
                if "ours" in impls:
                    r_fa2 = tf["ours"] / tf.get("fa2", float("nan"))
                    r_cud = tf["ours"] / tf.get("cudnn", float("nan"))
                    cells += [f"{r_fa2:.2f}", f"{r_cud:.2f}", f"{check():.1e}"]
                line = f"| {d} | {mask} | {s} | " + " | ".join(cells) + " |"
                rows.append(line)
                print(line, flush=True)
                del fns
                torch.cuda.empty_cache()

    # The commit the timed library was built from (it embeds it), not the checkout
    # this script happens to run in: on a lent GPU machine those differ.
    from flashattn import _capi
    commit = _capi.build_commit()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("FLASHATTN_LIBRARY", "FLASHATTN_DISABLE_SM90")
                   if k in os.environ)
    cmd = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    if env:
        cmd = f"{env} {cmd}"
    out = args.out or os.path.join(HERE, "out", f"{date[:10]}-{dev.replace(' ', '_')}-{mode}.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(f"# {mode} TFLOP/s, bf16, {TOKENS} tokens, hidden {HIDDEN}\n\n")
        f.write(f"- device: {dev}\n- date: {date}\n- commit: {commit}\n- torch {torch.__version__}, "
                f"cuDNN {torch.backends.cudnn.version()}\n- command: `{cmd}`\n"
                f"- timing: triton.testing.do_bench median (warmup 100 ms, rep 500 ms)" +
                (f"; {args.rounds} rounds per shape, order varied each round (timing_order.py), median of the rounds"
                 if args.rounds > 1 else "") + "\n\n")
        f.write(header + "\n" + "|" + "---|" * (header.count("|") - 1) + "\n")
        f.write("\n".join(rows) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
