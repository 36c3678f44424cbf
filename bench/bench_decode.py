"""Decode benchmark: GB/s of K+V read by one decode step (one query token per sequence)
against a KV cache, flashattn (contiguous and paged caches) against torch SDPA's FA2 and
cuDNN in the same run, each in its preferred layout, every call timed as a CUDA-graph replay
(kernel time, no host overhead), plus the device's copy ceiling and the host time of one
eager call.

  GB/s = bytes of K and V read (2 * batch * kv_len * heads_kv * head_dim * 2) / time

Usage (on the GPU machine):
  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 bench/bench_decode.py \\
      [--out results.md] [--quick] [--chunked]
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
        self.batch, self.kv_len = batch, kv_len
        self.q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.k = torch.randn(batch, kv_len, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.v = torch.randn(batch, kv_len, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
        self.bytes = 2 * batch * kv_len * HEADS_KV * HEAD_DIM * self.k.element_size()

    def paged(self, page):
        """(k_pages, v_pages, block_table) holding the same keys in shuffled pages."""
        blocks = self.kv_len // page
        perm = torch.randperm(self.batch * blocks, device="cuda")
        table = perm.view(self.batch, blocks).to(torch.int32)
        kp = torch.empty(self.batch * blocks, page, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
        vp = torch.empty_like(kp)
        kp[perm] = self.k.reshape(self.batch * blocks, page, HEADS_KV, HEAD_DIM)
        vp[perm] = self.v.reshape(self.batch * blocks, page, HEADS_KV, HEAD_DIM)
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
        group = HEADS_Q // HEADS_KV
        worst = 0.0
        for hk in range(HEADS_KV):
            q = self.q[:, 0, hk * group:(hk + 1) * group].float()    # (batch, group, d)
            k = self.k[:, :, hk].float()                                # (batch, kv_len, d)
            p = torch.softmax(q @ k.transpose(1, 2) * HEAD_DIM ** -0.5, dim=-1)
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
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rows[name] = (time.perf_counter() - t) / calls * 1e6
        torch.cuda.synchronize()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    ap.add_argument("--chunked", action="store_true",
                    help="also chunked prefill against the cache (seqlen_q 512-4096)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    lines = [f"# Decode, {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
             f"flashattn {flashattn.library_commit()}",
             "",
             f"bf16, {HEADS_Q} query / {HEADS_KV} KV heads, head dim {HEAD_DIM}, one query token; "
             f"GB/s of K+V read, median of {REPLAYS} CUDA-graph replays of {CALLS_PER_GRAPH} calls.",
             "",
             "Ceilings: device-to-device copy {:.0f} GB/s (read + write), read-only sum {:.0f} GB/s"
             .format(*ceilings_gbs()),
             "",
             "| batch | kv len | flashattn | paged 64 | paged 16 | torch FA2 | cuDNN | vs FA2 | vs cuDNN "
             "| paged 64 / contiguous | paged 16 / contiguous | max diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for batch, kv_len in (QUICK_SHAPES if args.quick else SHAPES):
        d = Decode(batch, kv_len)
        ours = [gbs(d.bytes, graph_time_us(d.flashattn_fn(page))) for page in PAGE_SIZES]
        fa2 = gbs(d.bytes, graph_time_us(d.sdpa_fn(SDPBackend.FLASH_ATTENTION)))
        cudnn = gbs(d.bytes, graph_time_us(d.sdpa_fn(SDPBackend.CUDNN_ATTENTION)))
        diff = max(d.max_difference(page) for page in PAGE_SIZES)
        row = (f"| {batch} | {kv_len} | {ours[0]:.0f} | {ours[1]:.0f} | {ours[2]:.0f} | {fa2:.0f} | "
               f"{cudnn:.0f} | {ours[0] / fa2:.2f} | {ours[0] / cudnn:.2f} | {ours[1] / ours[0]:.2f} | "
               f"{ours[2] / ours[0]:.2f} | {diff:.1e} |")
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
