"""Decode benchmark: GB/s of K+V read by one decode step (one query token per sequence)
against a KV cache, flashattn (contiguous and paged caches) against torch SDPA's FA2 and
cuDNN in the same run, each in its preferred layout, every call timed as a CUDA-graph replay
(kernel time, no host overhead), plus the device's copy ceiling and the host time of one
eager call.

  GB/s = bytes of K and V read (2 * batch * kv_len * heads_kv * head_dim * 2) / time

Usage (on the GPU machine):
  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/bench_decode.py \\
      [--out results.md] [--quick] [--chunked] [--page-sizes 0,64,16] [--heads 32,8] [--hdim 128]

Without options the table is as it always was (the setup of docs/inference.md's table:
32 query / 8 KV heads, d128, a contiguous cache and 64- and 16-token pages). The options
widen it: --page-sizes takes any page sizes from 1 (0 is the contiguous cache, always timed
and listed first: the FA2 / cuDNN ratios and the paged / contiguous columns are against it),
e.g. with 256- and 1-token pages and a smaller model's heads and head dim:
  ... bench/bench_decode.py --page-sizes 0,256,64,16,1 --heads 16,4 --hdim 64
A page size that does not divide a shape's kv len gets a last page partly filled. A torch
backend that has no kernel for the shape (cuDNN at some head dims) reads n/a.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
CALLS_PER_GRAPH = 20   # calls captured in one graph (the anchors' protocol)
REPLAYS = 15           # timed replays; the median is reported
SHAPES = [(1, 4096), (1, 16384), (1, 65536), (1, 262144), (16, 4096), (16, 16384),
          (64, 4096), (64, 16384), (128, 8192)]
QUICK_SHAPES = [(1, 16384), (16, 16384), (64, 4096)]
PAGE_SIZES = [0, 64, 16]  # 0: contiguous cache


def graph_time_us(fn):
    """Median time of one call of fn, replayed CALLS_PER_GRAPH times per CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS_PER_GRAPH)
    return statistics.median(times)


def ceilings_gbs():
    """(copy, read): a device-to-device copy of 1 GiB (bytes read + written per second) and a
    sum over 2 GiB (bytes read per second; decoding only reads)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = 2 * n / (graph_time_us(lambda: dst.copy_(src)) * 1e-6) / 1e9
    del src, dst
    x = torch.randn(n, dtype=DTYPE, device="cuda")
    read = 2 * n / (graph_time_us(lambda: x.sum(dtype=torch.float32)) * 1e-6) / 1e9
    return copy, read


class Decode:
    """One decode shape: a contiguous cache, the same keys paged, SDPA's (b, h, s, d) copy."""

    def __init__(self, batch, kv_len):
        # The head counts and head dim are the module's when the shape is made (main() sets
        # them from --heads / --hdim; the probes in bench/probes set them too).
        self.batch, self.kv_len = batch, kv_len
        self.heads_q, self.heads_kv, self.head_dim = HEADS_Q, HEADS_KV, HEAD_DIM
        self.q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.k = torch.randn(batch, kv_len, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.v = torch.randn(batch, kv_len, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
        self.bytes = 2 * batch * kv_len * HEADS_KV * HEAD_DIM * self.k.element_size()

    def paged(self, page):
        """(k_pages, v_pages, block_table) holding the same keys in shuffled pages (the last page
        of a sequence partly filled, with zeros, when page does not divide kv_len)."""
        blocks = -(-self.kv_len // page)
        perm = torch.randperm(self.batch * blocks, device="cuda")
        table = perm.view(self.batch, blocks).to(torch.int32)
        shape = (self.batch * blocks, page, self.heads_kv, self.head_dim)
        kp = torch.empty(shape, device="cuda", dtype=DTYPE)
        vp = torch.empty_like(kp)
        for pages, x in ((kp, self.k), (vp, self.v)):
            if blocks * page != self.kv_len:
                x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, blocks * page - self.kv_len))
            pages[perm] = x.reshape(shape)
        return kp, vp, table

    def flashattn_fn(self, page, splits=0):
        if page == 0:
            kc, vc, table = self.k, self.v, None
        else:
            kc, vc, table = self.paged(page)
        return lambda: flashattn.flash_attn_with_kvcache(self.q, kc, vc, cache_seqlens=self.lens,
                                                         block_table=table, num_splits=splits)

    def sdpa_fn(self, backend):
        qt = self.q.transpose(1, 2).contiguous()
        kt = self.k.transpose(1, 2).contiguous()
        vt = self.v.transpose(1, 2).contiguous()

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        return fn

    def max_difference(self, page):
        """flashattn against f32 attention on this shape: results are checked, not only timed.

        NOTES: one KV head at a time, so the check's temporaries stay near 2 x (batch x kv_len x
        d) f32; SDPA's math backend over the whole cache expanded K/V to every query head in f32
        (8 GiB at 1 x 256k) right before the next shape allocated its cache (docs/inference.md)."""
        out = self.flashattn_fn(page)().float()
        group = self.heads_q // self.heads_kv
        worst = 0.0
        for hk in range(self.heads_kv):
            q = self.q[:, 0, hk * group:(hk + 1) * group].float()    # (batch, group, d)
            k = self.k[:, :, hk].float()                                # (batch, kv_len, d)
            p = torch.softmax(q @ k.transpose(1, 2) * self.head_dim ** -0.5, dim=-1)
            ref = p @ self.v[:, :, hk].float()                          # (batch, group, d)
            worst = max(worst, (out[:, 0, hk * group:(hk + 1) * group] - ref).abs().max().item())
            del q, k, p, ref
        return worst


CHUNK_BATCH, CHUNK_CONTEXT = 4, 8192  # chunked prefill: sequences, keys after the chunk
CHUNK_LENGTHS = [512, 1024, 2048, 4096]
CHUNK_PAGES = [0, 64, 256]  # 0: contiguous cache


def chunked_prefill_rows():
    """Chunked prefill: a chunk of S query tokens per sequence against a cache that holds
    CHUNK_CONTEXT keys (the chunk's own last), causal (bottom-right), through
    flash_attn_with_kvcache on contiguous and paged caches, against flash_attn_func on the same
    keys (the prefill forward). TFLOP/s counted on the visible pairs."""
    b, ctx = CHUNK_BATCH, CHUNK_CONTEXT
    rows = ["", f"Chunked prefill: batch {b}, {ctx} keys per sequence (the chunk's last), causal, "
            f"{HEADS_Q}/{HEADS_KV} heads, d{HEAD_DIM}; TFLOP/s on visible pairs, CUDA-graph replays.",
            "",
            "| chunk | prefill forward | kvcache contiguous | paged 64 | paged 256 "
            "| contiguous / prefill | paged 64 / prefill | paged 256 / prefill |",
            "|---|---|---|---|---|---|---|---|"]
    print("\n".join(rows), flush=True)
    for s in CHUNK_LENGTHS:
        d = Decode(b, ctx)
        d.q = torch.randn(b, s, HEADS_Q, HEAD_DIM, device="cuda", dtype=DTYPE)
        pairs = s * (ctx - s) + s * (s + 1) // 2
        flops = 4 * b * HEADS_Q * HEAD_DIM * pairs
        prefill_us = graph_time_us(lambda: flashattn.flash_attn_func(d.q, d.k, d.v, causal=True))
        tflops = []
        for page in CHUNK_PAGES:
            kc, vc, table = (d.k, d.v, None) if page == 0 else d.paged(page)
            us = graph_time_us(lambda: flashattn.flash_attn_with_kvcache(
                d.q, kc, vc, cache_seqlens=d.lens, block_table=table, causal=True))
            tflops.append(flops / (us * 1e-6) / 1e12)
        prefill = flops / (prefill_us * 1e-6) / 1e12
        rows.append(f"| {s} | {prefill:.0f} | " + " | ".join(f"{t:.0f}" for t in tflops) + " | " +
                    " | ".join(f"{t / prefill:.2f}" for t in tflops) + " |")
        print(rows[-1], flush=True)
        del d
        torch.cuda.empty_cache()
    return rows


def gbs(nbytes, us):
    return nbytes / (us * 1e-6) / 1e9


def eager_host_us(calls=200):
    """Host time of one eager Python call at a tiny decode shape (the GPU never limits)."""
    d = Decode(1, 256)
    rows = {}
    for name, fn in (("flashattn", d.flashattn_fn(0)),
                     ("torch FA2", d.sdpa_fn(SDPBackend.FLASH_ATTENTION))):
        try:
            for _ in range(20):
                fn()
        except RuntimeError:  # torch without a kernel for this head dim: left out of the line
            if name == "flashattn":
                raise
            continue
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rows[name] = (time.perf_counter() - t) / calls * 1e6
        torch.cuda.synchronize()
    return rows


def _int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def page_columns(pages):
    """The page sizes as timed: the contiguous cache (0) first, then each other size once, in
    the order given."""
    if any(p < 0 for p in pages):
        raise ValueError(f"page sizes must be 0 (contiguous) or from 1, got {pages}")
    rest = []
    for p in pages:
        if p and p not in rest:
            rest.append(p)
    return [0] + rest


def sdpa_gbs(d, backend):
    """GB/s of torch SDPA with `backend`, or None when it has no kernel for the shape (raised
    by the warm-up calls, before any capture begins)."""
    try:
        return gbs(d.bytes, graph_time_us(d.sdpa_fn(backend)))
    except RuntimeError as e:
        print(f"# {backend.name} at batch {d.batch} x {d.kv_len}: {str(e).splitlines()[0]}",
              flush=True)
        return None


def _f(x, spec):
    return "n/a" if x is None else format(x, spec)


def _ratio(a, b):
    return None if a is None or b is None else a / b


def main(argv=None):
    global HEADS_Q, HEADS_KV, HEAD_DIM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    ap.add_argument("--chunked", action="store_true",
                    help="also chunked prefill against the cache (seqlen_q 512-4096)")
    ap.add_argument("--page-sizes", type=_int_list, default=PAGE_SIZES, metavar="P,P,...",
                    help="cache page sizes to time, 0 for the contiguous cache (always timed, "
                         "listed first), any other from 1, e.g. 0,256,64,16,1 (default: "
                         + ",".join(map(str, PAGE_SIZES)) + ")")
    ap.add_argument("--heads", type=_int_list, default=[HEADS_Q, HEADS_KV], metavar="HQ,HKV",
                    help=f"query heads and KV heads (default: {HEADS_Q},{HEADS_KV})")
    ap.add_argument("--hdim", type=int, default=HEAD_DIM,
                    help=f"head dim, e.g. 64, 128 or 256 (default: {HEAD_DIM})")
    args = ap.parse_args(argv)
    if len(args.heads) != 2 or min(args.heads) < 1 or args.heads[0] % args.heads[1]:
        ap.error(f"--heads takes HQ,HKV with HQ a multiple of HKV, got {args.heads}")
    if args.hdim < 1:
        ap.error(f"--hdim must be positive, got {args.hdim}")
    try:
        pages = page_columns(args.page_sizes)
    except ValueError as e:
        ap.error(str(e))
    HEADS_Q, HEADS_KV = args.heads
    HEAD_DIM = args.hdim
    paged = pages[1:]
    props = torch.cuda.get_device_properties(0)
    columns = (["batch", "kv len", "flashattn"] + [f"paged {p}" for p in paged] +
               ["torch FA2", "cuDNN", "vs FA2", "vs cuDNN"] +
               [f"paged {p} / contiguous" for p in paged] + ["max diff"])
    lines = [f"# Decode, {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
             f"flashattn {flashattn.library_commit()}",
             "",
             f"bf16, {HEADS_Q} query / {HEADS_KV} KV heads, head dim {HEAD_DIM}, one query token; "
             f"GB/s of K+V read, median of {REPLAYS} CUDA-graph replays of {CALLS_PER_GRAPH} calls.",
             "",
             "Ceilings: device-to-device copy {:.0f} GB/s (read + write), read-only sum {:.0f} GB/s"
             .format(*ceilings_gbs()),
             "",
             "| " + " | ".join(columns) + " |",
             "|" + "---|" * len(columns)]
    print("\n".join(lines), flush=True)
    for batch, kv_len in (QUICK_SHAPES if args.quick else SHAPES):
        d = Decode(batch, kv_len)
        ours = [gbs(d.bytes, graph_time_us(d.flashattn_fn(page))) for page in pages]
        fa2 = sdpa_gbs(d, SDPBackend.FLASH_ATTENTION)
        cudnn = sdpa_gbs(d, SDPBackend.CUDNN_ATTENTION)
        diff = max(d.max_difference(page) for page in pages)
        cells = ([str(batch), str(kv_len)] + [f"{x:.0f}" for x in ours] +
                 [_f(fa2, ".0f"), _f(cudnn, ".0f"), _f(_ratio(ours[0], fa2), ".2f"),
                  _f(_ratio(ours[0], cudnn), ".2f")] +
                 [f"{x / ours[0]:.2f}" for x in ours[1:]] + [f"{diff:.1e}"])
        row = "| " + " | ".join(cells) + " |"
        lines.append(row)
        print(row, flush=True)
        del d
        torch.cuda.empty_cache()
    if args.chunked:
        lines += chunked_prefill_rows()
    host = eager_host_us()
    tail = ["", "Host time of one eager call (batch 1, 256 keys; us): " +
            ", ".join(f"{k} {v:.1f}" for k, v in host.items())]
    lines += tail
    print("\n".join(tail), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
