#!/usr/bin/env python3
"""Why does one decode shape read less in one process than in another? The same call
(bf16, 32/8 heads, d128, one query token, contiguous cache, heuristic split count, CUDA-graph
replays: bench/bench_decode.py's timing) measured under what differs between the benchmark and
the split probe:

  order   the shape first in the process, then again after the benchmark's earlier shapes
          (a 1 x 256k cache allocated, timed and freed), then the same object timed again
  churn   new tensors of the shape timed after a 1 x 256k shape and its result check, the
          benchmark's one-KV-head-at-a-time check or SDPA's math backend over the whole cache
          (K/V expanded to every query head in f32, what bench/bench_decode.py did before), and
          copies of those tensors made after them
  gap     K and V as views of one buffer with G bytes between them (0: V right behind K, as
          the allocator places two equal tensors; the cache is a power of two bytes)
  layout  the same keys heads-major in memory ((batch, heads, seqlen, d) storage seen through
          (batch, seqlen, heads, d) strides: cuDNN's preferred layout, 256-byte rows made one
          contiguous run per KV head)
  splits  forced split counts

  FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python:bench python3 bench/probes/decode_placement.py \\
      [--shapes 16x4096,1x16384] [--parts order,churn,gap,layout,splits]
"""
import argparse

import torch

import bench_decode as bd


def shape_time(d, k=None, v=None, splits=0):
    """GB/s of one contiguous-cache call of Decode d (its own K/V unless k, v given)."""
    k = d.k if k is None else k
    v = d.v if v is None else v
    fn = lambda: bd.flashattn.flash_attn_with_kvcache(d.q, k, v, cache_seqlens=d.lens, num_splits=splits)
    return bd.gbs(d.bytes, bd.graph_time_us(fn))


def gapped(d, gap):
    """K and V copied into one buffer, V starting `gap` bytes after K ends."""
    n = d.k.numel()
    extra = gap // d.k.element_size()
    buf = torch.empty(2 * n + extra, dtype=d.k.dtype, device="cuda")
    k = buf[:n].view(d.k.shape)
    v = buf[n + extra:].view(d.v.shape)
    k.copy_(d.k)
    v.copy_(d.v)
    return k, v, buf


def sdpa_math_difference(d):
    """The benchmark's former result check: SDPA's math backend in f32 over the whole cache."""
    out = d.flashattn_fn(0)()
    qt, kt, vt = (x.transpose(1, 2).float() for x in (d.q, d.k, d.v))
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)
    return (out.float() - ref).abs().max().item()


def churn(batch, kv, tag):
    checks = (("one-head check", lambda big: big.max_difference(0)), ("SDPA math check", sdpa_math_difference))
    for label, check in checks + checks:
        big = bd.Decode(1, 262144)
        shape_time(big)
        check(big)
        del big
        torch.cuda.empty_cache()
        fresh = bd.Decode(batch, kv)
        t_fresh = shape_time(fresh)
        k, v = fresh.k.clone(), fresh.v.clone()
        print(f"{tag}: after 1 x 256k + {label}: new tensors {t_fresh:.0f}, "
              f"copies made after them {shape_time(fresh, k, v):.0f}, new tensors again {shape_time(fresh):.0f}",
              flush=True)
        del fresh, k, v
        torch.cuda.empty_cache()


def heads_major(x):
    """x's values stored (batch, heads, seqlen, d), viewed (batch, seqlen, heads, d)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16x4096,1x16384,64x16384")
    ap.add_argument("--parts", default="order,churn,gap,layout,splits")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    for batch, kv in shapes:
        tag = f"b{batch} kv{kv}"
        d = bd.Decode(batch, kv)
        first = shape_time(d)
        print(f"{tag}: first in process {first:.0f}, again {shape_time(d):.0f}", flush=True)
        if "churn" in parts:
            churn(batch, kv, tag)
        if "order" in parts:
            big = bd.Decode(1, 262144)
            shape_time(big)
            del big
            torch.cuda.empty_cache()
            print(f"{tag}: after a 1 x 256k shape (same tensors) {shape_time(d):.0f}", flush=True)
            fresh = bd.Decode(batch, kv)
            print(f"{tag}: after it, new tensors {shape_time(fresh):.0f}", flush=True)
            del fresh
            torch.cuda.empty_cache()
        if "gap" in parts:
            row = []
            for gap in (0, 256, 4096, 1 << 20, (1 << 20) + 2048, 3 << 20):
                k, v, buf = gapped(d, gap)
                row.append(f"{gap}:{shape_time(d, k, v):.0f}")
                del k, v, buf
            torch.cuda.empty_cache()
            print(f"{tag}: gap between K and V (bytes:GB/s) " + " ".join(row), flush=True)
        if "layout" in parts:
            k, v = heads_major(d.k), heads_major(d.v)
            print(f"{tag}: heads-major storage {shape_time(d, k, v):.0f} "
                  f"(interleaved {shape_time(d):.0f})", flush=True)
            del k, v
            torch.cuda.empty_cache()
        if "splits" in parts:
            row = [f"{s}:{shape_time(d, splits=s):.0f}" for s in (0, 1, 2, 3, 4, 6, 8, 16, 32)]
            print(f"{tag}: splits " + " ".join(row), flush=True)
        del d
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
