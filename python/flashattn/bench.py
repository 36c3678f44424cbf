"""python -m flashattn.bench: attention throughput against torch SDPA (FA2, cuDNN), with plots.

The timing protocol is the project's bench/bench_attention.py (found in the
current directory's bench/, the source checkout, or FLASHATTN_BENCH_SCRIPT);
this module runs it, then plots its results table: one PNG per head dim and mask, TFLOP/s
against sequence length, one bar per implementation.

  python -m flashattn.bench [--plots DIR] [bench_attention options...]
      e.g. --hdims 64,128 --seqlens 1024,4096 --masks causal --backward
  python -m flashattn.bench --plot-only RESULTS.md [--plots DIR]
      plots an existing results file (no GPU needed)

Needs PyTorch with CUDA and Triton for timing, matplotlib for the plots, and a
CUDA build of libflashattn (FLASHATTN_LIBRARY=/path/libflashattn.so if the
installed one was built without CUDA).
"""

import argparse
import importlib.util
import math
import os
import re
import sys
from typing import Dict, List, Tuple

_SOURCE_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                             "bench_attention.py")


def load_protocol():
    """The bench_attention module, from FLASHATTN_BENCH_SCRIPT, ./bench/ or the source checkout
    this package was imported from."""
    candidates = [os.environ.get("FLASHATTN_BENCH_SCRIPT"),
                  os.path.join(os.getcwd(), "bench", "bench_attention.py"), _SOURCE_BENCH]
    path = next((p for p in candidates if p and os.path.exists(p)), None)
    if path is None:
        raise SystemExit("cannot find bench/bench_attention.py: run from the flashattn repository "
                         "root or set FLASHATTN_BENCH_SCRIPT=/path/to/bench/bench_attention.py")
    spec = importlib.util.spec_from_file_location("flashattn_bench_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------
# Results tables (markdown, as bench_attention.py writes them)


def parse_results(text: str) -> Tuple[Dict[str, str], List[str], Dict[Tuple[int, str],
                                                                     Dict[int, Dict[str, float]]]]:
    """-> (metadata from '- key: value' lines, implementation names,
    {(hdim, mask): {seqlen: {impl: TFLOP/s}}}) from a results table whose header has
    'hdim', 'mask', 'seqlen' and '<impl> TFLOP/s' columns."""
    meta: Dict[str, str] = {}
    title = ""
    header: List[str] = []
    impls: List[str] = []
    data: Dict[Tuple[int, str], Dict[int, Dict[str, float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# ") and not title:
            title = line[2:].strip()
            meta["title"] = title
            continue
        m = re.match(r"^- ([\w .]+?): (.*)$", line)
        if m and not header:
            meta[m.group(1).strip()] = m.group(2).strip()
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not header:
            if "hdim" in cells and "seqlen" in cells:
                header = cells
                impls = [c[: -len(" TFLOP/s")] for c in cells if c.endswith(" TFLOP/s")]
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the |---| separator
        row = dict(zip(header, cells))
        try:
            key = (int(row["hdim"]), row["mask"])
            seqlen = int(row["seqlen"])
        except (KeyError, ValueError):
            continue
        values = {}
        for impl in impls:
            try:
                values[impl] = float(row[f"{impl} TFLOP/s"])
            except (KeyError, ValueError):
                values[impl] = math.nan
        data.setdefault(key, {})[seqlen] = values
    if not header:
        raise ValueError("no results table (a header with hdim, mask, seqlen columns) found")
    return meta, impls, data


def plot_results(text: str, outdir: str, prefix: str = "") -> List[str]:
    """One PNG per (head dim, mask): grouped bars, TFLOP/s per sequence length and
    implementation. Returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, impls, data = parse_results(text)
    os.makedirs(outdir, exist_ok=True)
    mode = "backward" if "backward" in meta.get("title", "") else "forward"
    device = meta.get("device", "")
    paths = []
    for (hdim, mask), by_seqlen in sorted(data.items()):
        seqlens = sorted(by_seqlen)
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(seqlens) + 2), 4.2))
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            xs = [j + (i - (len(impls) - 1) / 2) * width for j in range(len(seqlens))]
            ys = [by_seqlen[s].get(impl, math.nan) for s in seqlens]
            bars = ax.bar(xs, [0 if math.isnan(y) else y for y in ys], width, label=impl)
            for bar, y in zip(bars, ys):
                label = "n/a" if math.isnan(y) else f"{y:.0f}"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(seqlens)))
        ax.set_xticklabels([str(s) for s in seqlens])
        ax.set_xlabel("sequence length")
        ax.set_ylabel(f"{mode} TFLOP/s")
        ax.set_title(f"{mode}, head dim {hdim}, {'causal' if mask == 'causal' else 'no mask'}"
                     + (f" — {device}" if device else ""), fontsize=10)
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(outdir, f"{prefix}{mode}-hdim{hdim}-{mask}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m flashattn.bench", add_help=False,
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plots", default=None,
                    help="where the PNGs go (default: beside the results file, in plots/)")
    ap.add_argument("--plot-only", default=None, metavar="RESULTS.md",
                    help="plot an existing results file instead of running the benchmark")
    ap.add_argument("-h", "--help", action="store_true")
    args, rest = ap.parse_known_args(argv)
    if args.help:
        ap.print_help()
        if args.plot_only is None:
            print("\nbench_attention options (passed through):")
            try:
                protocol = load_protocol()
                sys.argv = ["bench_attention.py", "--help"]
                protocol.main()
            except SystemExit:
                pass
        return 0

    if args.plot_only:
        results = args.plot_only
    else:
        protocol = load_protocol()
        if "--out" not in rest and not any(a.startswith("--out=") for a in rest):
            import datetime
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
            mode = "backward" if "--backward" in rest else "forward"
            rest += ["--out", os.path.join(os.getcwd(), "flashattn-bench",
                                           f"{stamp}-{mode}.md")]
        results = rest[rest.index("--out") + 1] if "--out" in rest else next(
            a.split("=", 1)[1] for a in rest if a.startswith("--out="))
        sys.argv = ["bench_attention.py"] + rest
        protocol.main()

    with open(results) as f:
        text = f.read()
    outdir = args.plots or os.path.join(os.path.dirname(os.path.abspath(results)), "plots")
    prefix = os.path.splitext(os.path.basename(results))[0] + "-"
    try:
        paths = plot_results(text, outdir, prefix)
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
