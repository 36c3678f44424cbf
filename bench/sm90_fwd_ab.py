#!/usr/bin/env python3
"""A/B of several builds of libflashattn in ONE process, interleaved, with the anchors.

Each NAME=PATH loads its own copy of the library (a separate instance of the ctypes
binding), so two builds (say main and a branch, or two kernel configurations) are timed on
the same GPU state: for every shape the variants and torch SDPA's FA2 / cuDNN
run in turn, `--rounds` times (the order varies by round: timing_order.py), and the table gives
each one's median. `--backward` times each build's backward alone (out and lse from its own
forward; TFLOP/s counted as 2.5x the forward's FLOPs) and the anchors' as time(forward +
backward) - time(forward), the protocol's rule; beside it, what a training step pays: each
build's forward + backward (its forward timed too, in the same rounds) against cuDNN's, as a
ratio of times. List an A/A copy of the baseline (the same file under a second name) to see
the run's own spread. Shapes and FLOPs as bench/bench_attention.py (16k tokens, hidden 2048, bf16).

  PYTHONPATH=python python3 bench/sm90_fwd_ab.py main=a/libflashattn.so new=b/libflashattn.so \\
      --hdims 128 --seqlens 2048,16384 --masks none,causal
  (old=OLD/libflashattn.so@OLD/_capi.py for a library older than this checkout's binding)
"""
import argparse
import importlib.util
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

from timing_order import round_order

TOKENS, HIDDEN = 16384, 2048


def load_binding(name, path):
    """A private instance of flashattn._capi bound to the library at `path`. An older
    library than this checkout's binding expects can bring its own: PATH@CAPI.py."""
    path, _, src = path.partition("@")
    if not src:
        pkg = importlib.util.find_spec("flashattn").submodule_search_locations[0]  # not imported
        src = os.path.join(pkg, "_capi.py")
    os.environ["FLASHATTN_LIBRARY"] = os.path.abspath(path)
    spec = importlib.util.spec_from_file_location(f"_capi_{name}", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.library()
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libs", nargs="+", help="NAME=path/to/libflashattn.so")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--shapes", default="", help="SEQLENxBATCH,... instead of --seqlens' 16k tokens "
                    "(e.g. tile counts that are a multiple of the SM count)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=150, help="do_bench rep (ms) per timing")
    ap.add_argument("--no-anchors", action="store_true")
    ap.add_argument("--backward", action="store_true", help="time the backward pass instead")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="softcap of the builds' calls (the anchors have none: compare builds only)")
    ap.add_argument("--alibi-for", default="",
                    help="NAME,... whose calls carry ALiBi slopes (2^(-8 (h+1) / heads) per head): "
                         "the same library under two names times ALiBi's cost")
    ap.add_argument("--sinks-for", default="",
                    help="NAME,... whose calls carry attention sinks (one f32 logit per head)")
    args = ap.parse_args()
    libs = [tuple(x.split("=", 1)) for x in args.libs]
    bind = {n: load_binding(n, p) for n, p in libs}
    names = [n for n, _ in libs] + ([] if args.no_anchors else ["fa2", "cudnn"])
    first = libs[0][0]
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; commits: " +
          ", ".join(f"{n}={bind[n].build_commit()}" for n, _ in libs), flush=True)
    cols = (["hdim", "mask", "seqlen x batch"] + names + [f"{n}/{first}" for n, _ in libs[1:]] +
            ([] if args.no_anchors else [f"{n}/cuDNN" for n, _ in libs]) +
            ([f"{n} fwd+bwd / cuDNN's" for n, _ in libs] if args.backward and not args.no_anchors else []) +
            [f"max diff vs {first}"])
    hdr = "| " + " | ".join(cols) + " |"
    print(hdr + "\n|" + "---|" * (hdr.count("|") - 1), flush=True)
    for d in (int(x) for x in args.hdims.split(",")):
        for mask in args.masks.split(","):
            causal = mask == "causal"
            shapes = ([tuple(int(y) for y in x.split("x")) for x in args.shapes.split(",")] if args.shapes
                      else [(int(x), TOKENS // int(x)) for x in args.seqlens.split(",")])
            for s, b in shapes:
                h = HIDDEN // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
                           for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                outs = {n: torch.full_like(q, float("nan")) for n, _ in libs}
                slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")
                sinks = torch.randn(h, device="cuda", generator=g)
                extra = {n: dict(softcap=args.softcap,
                                 alibi_slopes=slopes if n in args.alibi_for.split(",") else None,
                                 sinks=sinks if n in args.sinks_for.split(",") else None)
                         for n, _ in libs}
                lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
                fns, fwd_fns = {}, {}
                if args.backward:
                    dout = torch.randn_like(q)
                    grads = {}
                    for n, _ in libs:
                        o, l = torch.empty_like(q), torch.empty((b, h, s), device="cuda", dtype=torch.float32)
                        bind[n].forward(q, k, v, o, l, causal=causal, **extra[n])
                        gr = tuple(torch.full_like(q, float("nan")) for _ in range(3))
                        grads[n] = gr
                        outs[n] = gr[0]  # dq is what the max-diff column compares
                        # With sinks, their gradient too (what a training step computes).
                        xb = dict(extra[n], dsinks=torch.empty(h, device="cuda")) if extra[n]["sinks"] is not None \
                            else extra[n]
                        fns[n] = (lambda m=bind[n], o=o, l=l, gr=gr, x=xb:
                                  m.backward(q, k, v, o, dout, l, *gr, causal=causal, **x))
                        fwd_fns[n] = (lambda m=bind[n], o=o, l=l, x=extra[n]:
                                      m.forward(q, k, v, o, l, causal=causal, **x))
                    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (qt, kt, vt))
                    for n, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        def fwd_bwd(be=be):
                            with sdpa_kernel(be):
                                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(
                                    dout.transpose(1, 2))
                        def fwd_only(be=be):
                            with sdpa_kernel(be), torch.no_grad():
                                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        fns[n] = (fwd_bwd, fwd_only)
                else:
                    for n, _ in libs:
                        fns[n] = (lambda m=bind[n], o=outs[n], x=extra[n]:
                                  m.forward(q, k, v, o, lse, causal=causal, **x))
                    for n, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        def sdpa(be=be):
                            with sdpa_kernel(be):
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        fns[n] = sdpa
                times = {n: [] for n in names}
                step = {n: [] for n in names}  # forward + backward (--backward)
                for r in range(args.rounds):
                    for n in round_order(names, r):
                        timing = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=args.rep,
                                                                    return_mode="median")
                        if isinstance(fns[n], tuple):  # an anchor's backward: fwd+bwd - fwd
                            both = timing(fns[n][0])
                            times[n].append(both - timing(fns[n][1]))
                            step[n].append(both)
                        else:
                            times[n].append(timing(fns[n]))
                            if n in fwd_fns:
                                step[n].append(times[n][-1] + timing(fwd_fns[n]))
                f = 4.0 * b * h * s * s * d / (2 if causal else 1) * (2.5 if args.backward else 1.0)
                tf = {n: f / (statistics.median(times[n]) * 1e-3) / 1e12 for n in names}
                diff = max((outs[n].float() - outs[first].float()).abs().max().item() for n, _ in libs)
                cells = [f"{tf[n]:.0f}" for n in names]
                cells += [f"{tf[n] / tf[first]:.3f}" for n, _ in libs[1:]]
                if not args.no_anchors:
                    cells += [f"{tf[n] / tf['cudnn']:.2f}" for n, _ in libs]
                    if args.backward:
                        cudnn_step = statistics.median(step["cudnn"])
                        cells += [f"{cudnn_step / statistics.median(step[n]):.2f}" for n, _ in libs]
                print(f"| {d} | {mask} | {s}x{b} | " + " | ".join(cells) + f" | {diff:.1e} |", flush=True)
                del fns, outs, q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
