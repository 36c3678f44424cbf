"""CUDA: block-sparse forward and forward + backward (on an H100 the Hopper forward and the
sm80 backward; FLASHATTN_DISABLE_SM90=1 for sm80 alone) against the dense call on the same
path (Hopper forward and backward on an H100) and against FlexAttention
(torch.compile(flex_attention)) with the same BlockMask, in one process. The dense sm80
call is printed beside it.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \\
        python3 bench/probes/block_sparse_cuda.py [--seqlen 8192] [--heads 16] [--dim 128]

bf16, batch 1, blocks 128 x 128 (--block 64: 64 x 64, which cut the Hopper kernels' tiles). Masks: random lists per head at densities 1, 0.5, 0.1
(every listed block "full", so FlexAttention evaluates no mask_mod either) and
create_block_mask's causal mask (flashattn: causal=True, the same lists). flashattn gets
the lists as host tensors (a copy made once, as a caller keeping its mask would: a GPU
BlockMask would be copied to the host on every call). Times: per call, --repeats calls
back to back between two CUDA events (median of three batches, after --warmup calls);
the backward is fwd+bwd minus fwd; "host ms" is the time the host spends in one
forward call (the library's list handling and launch, Python included). TFLOP/s are counted on the visited blocks (4 * pairs * d forward, 2.5 times that
backward), the dense call's on every pair. A second table gives the same calls' kernel
time (the CUDA profiler's summed kernel and copy durations per call, host gaps left out).
"""

import argparse
import os
import statistics
import time

import torch
from torch.nn.attention import flex_attention as flex

import flashattn

BLOCK = 128


def random_lists(gen, heads, n_blocks, density):
    """(kv_num_blocks, kv_indices) of shape (1, heads, n, n): each pair with probability density."""
    listed = torch.rand((1, heads, n_blocks, n_blocks), generator=gen) < density
    num = listed.sum(-1).to(torch.int32)
    # listed blocks first, ascending: sort by (not listed, index)
    order = torch.argsort((~listed).to(torch.int32) * n_blocks + torch.arange(n_blocks), dim=-1)
    return num, order.to(torch.int32)


def flex_mask_from_full(num, idx, n):
    zeros = torch.zeros_like(num)
    return flex.BlockMask.from_kv_blocks(zeros.cuda(), idx.cuda(), num.cuda(), idx.cuda(), BLOCK_SIZE=BLOCK,
                                         seq_lengths=(n, n))


def host_mask(bm):
    """A flashattn.BlockMask over host copies of a FlexAttention BlockMask's lists."""
    full_num = None if bm.full_kv_num_blocks is None else bm.full_kv_num_blocks.cpu()
    full_idx = None if bm.full_kv_indices is None else bm.full_kv_indices.cpu()
    return flashattn.BlockMask(bm.kv_num_blocks.cpu(), bm.kv_indices.cpu(), full_num, full_idx, BLOCK_SIZE=BLOCK)


def visited_pairs(bm, heads):
    """(query, key) pairs of the listed blocks (partial and full) over all heads (lists
    with H = 1 are shared by every head)."""
    blocks = bm.kv_num_blocks.sum().item()
    if bm.full_kv_num_blocks is not None:
        blocks += bm.full_kv_num_blocks.sum().item()
    return blocks * BLOCK * BLOCK * (heads if bm.kv_num_blocks.shape[1] == 1 else 1)


def time_ms(fn, warmup, repeats):
    """Per-call time of `repeats` calls issued back to back (the host's work for a call
    overlaps the GPU's for the one before), median of three such batches."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    batches = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        batches.append(start.elapsed_time(end) / repeats)
    return statistics.median(batches)


def kernel_ms(fn, warmup, repeats):
    """GPU time per call with the host's gaps left out: the summed durations of the kernels
    (and copies) `repeats` calls ran, from the CUDA profiler (CUPTI), per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / repeats / 1e3


def host_ms(fn, repeats):
    """Median time the host spends in one call (the GPU idle before it: synchronized)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def fwd_and_fb(call, inputs, dout, warmup, repeats, timer=time_ms):
    """The forward's time and the forward + backward's, by `timer` (time_ms or kernel_ms)."""
    def fwd():
        with torch.no_grad():
            call(*inputs)

    def fb():
        out = call(*inputs)
        out.backward(dout)

    return timer(fwd, warmup, repeats), timer(fb, warmup, repeats)


def try_flex(times):
    """FlexAttention's (forward, forward + backward) times, or NaN where torch.compile cannot
    build it for these blocks (printing why)."""
    try:
        return times()
    except Exception as e:  # noqa: BLE001 (inductor's lowering errors have no common base)
        print(f"FlexAttention not built for these blocks: {str(e).strip().splitlines()[-1][:200]}", flush=True)
        return float("nan"), float("nan")


def main():
    global BLOCK
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--block", type=int, default=BLOCK, help="square block size of the masks")
    args = ap.parse_args()
    BLOCK = args.block
    n, h, d = args.seqlen, args.heads, args.dim
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    qf, kf, vf = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    doutf = dout.transpose(1, 2).contiguous()
    flex_compiled = torch.compile(flex.flex_attention)
    # Blocks under 128: FlexAttention's tiles must divide them (its defaults are 128 x 64 forward).
    flex_tiles = None if BLOCK >= 128 else {name: BLOCK for name in ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1",
                                                                     "BLOCK_M2", "BLOCK_N2")}
    n_blocks = n // BLOCK

    masks = []
    for density in (1.0, 0.5, 0.1):
        num, idx = random_lists(gen, h, n_blocks, density)
        masks.append((f"random {density}", False, flex_mask_from_full(num, idx, n)))
    causal = flex.create_block_mask(lambda b, hh, i, j: i >= j, None, None, n, n, device="cuda", BLOCK_SIZE=BLOCK)
    masks.append(("causal", True, causal))

    all_pairs = h * n * n
    tf = lambda pairs, ms, factor: factor * 4 * pairs * d / ms / 1e9  # noqa: E731
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, batch 1, {h} heads, seqlen {n}, d {d}, "
          f"blocks {BLOCK}x{BLOCK}; {args.repeats} calls back to back")
    sm80_only = os.environ.get("FLASHATTN_DISABLE_SM90", "") not in ("", "0")
    for label in (["sm80"] if sm80_only else ["default path", "sm80"]):
        os.environ["FLASHATTN_DISABLE_SM90"] = "1" if label == "sm80" else "0"
        f, fb = fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c), (q, k, v), dout,
                           args.warmup, args.repeats)
        with torch.no_grad():
            host = host_ms(lambda: flashattn.flash_attn_func(q, k, v), args.repeats)
        cf, cfb = fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True), (q, k, v),
                             dout, args.warmup, args.repeats)
        print(f"dense {label}: fwd {f:.3f} ms ({tf(all_pairs, f, 1):.0f} TFLOP/s), "
              f"bwd {fb - f:.3f} ms ({tf(all_pairs, fb - f, 2.5):.0f} TFLOP/s), host {host:.3f} ms per fwd call; "
              f"causal: fwd {cf:.3f} ms, bwd {cfb - cf:.3f} ms")
        if label == "default path" or sm80_only:
            dense_f, dense_fb = f, fb  # the ratios' dense call
            dense_kf, dense_kfb = fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c), (q, k, v),
                                             dout, args.warmup, args.repeats, kernel_ms)
            print(f"dense {label} kernel time: fwd {dense_kf:.3f} ms, bwd {dense_kfb - dense_kf:.3f} ms")
    os.environ["FLASHATTN_DISABLE_SM90"] = "1" if sm80_only else "0"
    print("mask | visited | flashattn fwd ms (TFLOP/s, vs dense) | bwd ms (TFLOP/s, vs dense) | "
          "flex fwd ms | flex bwd ms | speedup fwd / bwd | flashattn host ms per fwd call")
    kernel_rows = []
    for name, is_causal, bm in masks:
        pairs = visited_pairs(bm, h)
        hm = host_mask(bm)
        fa_f, fa_fb = fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=is_causal, block_mask=hm),
                                 (q, k, v), dout, args.warmup, args.repeats)
        fl_f, fl_fb = try_flex(lambda: fwd_and_fb(
            lambda a, b, c: flex_compiled(a, b, c, block_mask=bm, kernel_options=flex_tiles), (qf, kf, vf), doutf,
            args.warmup, args.repeats))
        fa_b, fl_b = fa_fb - fa_f, fl_fb - fl_f
        with torch.no_grad():
            fa_host = host_ms(lambda: flashattn.flash_attn_func(q, k, v, causal=is_causal, block_mask=hm),
                              args.repeats)
        ff, fb = tf(pairs, fa_f, 1), tf(pairs, fa_b, 2.5)
        print(f"{name} | {pairs / all_pairs:.3f} | {fa_f:.3f} ({ff:.0f}, {ff / tf(all_pairs, dense_f, 1):.2f}) | "
              f"{fa_b:.3f} ({fb:.0f}, {fb / tf(all_pairs, dense_fb - dense_f, 2.5):.2f}) | {fl_f:.3f} | {fl_b:.3f} | "
              f"{fl_f / fa_f:.2f} / {fl_b / fa_b:.2f} | {fa_host:.3f}", flush=True)
        ka_f, ka_fb = fwd_and_fb(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=is_causal, block_mask=hm),
                                 (q, k, v), dout, args.warmup, args.repeats, kernel_ms)
        kl_f, kl_fb = try_flex(lambda: fwd_and_fb(
            lambda a, b, c: flex_compiled(a, b, c, block_mask=bm, kernel_options=flex_tiles), (qf, kf, vf), doutf,
            args.warmup, args.repeats, kernel_ms))
        kernel_rows.append((name, pairs, ka_f, ka_fb - ka_f, kl_f, kl_fb - kl_f))
    print("kernel time (CUDA profiler, host gaps left out): mask | flashattn fwd ms (TFLOP/s, vs dense) | "
          "bwd ms (TFLOP/s, vs dense) | flex fwd / bwd ms | speedup fwd / bwd")
    for name, pairs, ka_f, ka_b, kl_f, kl_b in kernel_rows:
        ff, fb = tf(pairs, ka_f, 1), tf(pairs, ka_b, 2.5)
        print(f"{name} | {ka_f:.3f} ({ff:.0f}, {ff / tf(all_pairs, dense_kf, 1):.2f}) | "
              f"{ka_b:.3f} ({fb:.0f}, {fb / tf(all_pairs, dense_kfb - dense_kf, 2.5):.2f}) | "
              f"{kl_f:.3f} / {kl_b:.3f} | {kl_f / ka_f:.2f} / {kl_b / ka_b:.2f}", flush=True)


if __name__ == "__main__":
    main()
