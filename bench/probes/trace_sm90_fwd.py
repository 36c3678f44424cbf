"""Where a Hopper forward tile's cycles go: the per-tile timeline of trace.h.

Needs a library built with trace.h's stamps compiled in (src/cuda/sm90/fwd/trace.h says how).
Runs the protocol's shape (16384 tokens, hidden 2048, bf16) `--iters` times back to
back and reads the stamps of the last launch: for each CTA's tiles after its first,
per consumer warpgroup, the cycles (its SM's clock64) spent
  q_wait    tile known -> its Q landed
  first_s   Q landed -> the first key tile's S = Q K^T done (ping-pong turn included)
  loop      -> the last P V done
  epilogue  -> O and the logsumexp stored
  next      -> the next tile known (its tile-order lookup)
and compares the tile with the steady-state cost of its key tiles (loop / (key tiles - 1)),
giving the cycles a tile boundary costs.
With --steps, also the steady state of one tile per CTA (trace.h's kTraceStepTile):
per key tile of the overlapped loop and consumer warpgroup, the median cycles of
  load      loop top -> this S's K and the previous P V's V landed
  turn      -> the ping-pong turn acquired
  issue     -> S = Q K^T and P V issued, turn handed over
  s_wait    -> S completed
  softmax   -> online softmax done
  pv_wait   -> P V completed
  tail      -> the next loop top (rescale O, convert P)
and the period (loop top to loop top); then kCrossTile's fused last turn of that tile
(trace.h's TraceFused): the next tile's lookup, the V / Q / K waits, turn and issue, the last
P V's wait, the epilogue's packing, O store and logsumexp, the next S's wait and first softmax.

Usage: FLASHATTN_LIBRARY=/tmp/var/trace/libflashattn.so PYTHONPATH=python \\
       python3 bench/probes/trace_sm90_fwd.py --hdim 128 --seqlen 2048 [--causal]
"""

import argparse
import ctypes
import statistics

import numpy as np
import torch

from flashattn import _capi

TOKENS, HIDDEN = 16384, 2048
CTAS, TILES, WGS, EVENTS = 132, 32, 2, 5  # trace.h
STEPS, STEP_EVENTS = 32, 7  # trace.h's kTraceSteps, kStepEvents
STEP_PARTS = ("load", "turn", "issue", "s_wait", "softmax", "pv_wait")
KEY_TILE = {128: 128, 256: 80}  # tuning.h's kBlockN below 8192 keys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdim", type=int, choices=sorted(KEY_TILE), default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", action="store_true", help="also the per-key-tile steady state")
    args = ap.parse_args()
    assert args.seqlen < 8192, "wider key tiles and the split tail from 8192 keys: not modelled here"
    d, s = args.hdim, args.seqlen
    b, h = TOKENS // s, HIDDEN // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
    for _ in range(args.iters):
        _capi.forward(q, k, v, out, lse, causal=args.causal)
    torch.cuda.synchronize()
    lib = _capi.library()
    fn = getattr(lib, f"flashattn_sm90_fwd_trace_{d}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    stamps = np.zeros((CTAS, TILES, WGS, EVENTS), dtype=np.uint64)
    rc = fn(stamps.ctypes.data, stamps.nbytes)
    assert rc == 0, f"trace accessor failed ({rc}): built without FLASHATTN_SM90_TRACE=1?"
    t = stamps.astype(np.int64)
    key_tiles = -(-s // KEY_TILE[d])
    rows = {name: [] for name in ("q_wait", "first_s", "loop", "epilogue", "next", "tile", "per_key_tile",
                                  "boundary")}
    for cta in range(CTAS):
        for tile in range(1, TILES - 1):  # the first tile includes the CTA's start
            cur, nxt = t[cta, tile], t[cta, tile + 1]
            if cur[0, 0] == 0 or nxt[0, 0] == 0 or cur[0, 0] > nxt[0, 0]:
                continue  # not reached in the last launch (or a stale stamp from an earlier one)
            for wg in range(WGS):
                e = cur[wg]
                primed = e[1] == 0  # started by the previous tile's last turn (kCrossTile): no Q/first-S stamps
                if not primed:
                    rows["q_wait"].append(e[1] - e[0])
                    rows["first_s"].append(e[2] - e[1])
                    rows["loop"].append(e[3] - e[2])
                rows["epilogue"].append(e[4] - e[3])
                rows["next"].append(nxt[wg, 0] - e[4])
                tile_cycles = nxt[wg, 0] - e[0]
                rows["tile"].append(tile_cycles)
                if not primed and not args.causal and key_tiles > 1:
                    per = (e[3] - e[2]) / (key_tiles - 1)
                    rows["per_key_tile"].append(per)
                    rows["boundary"].append(tile_cycles - key_tiles * per)
    print(f"hdim {d} seqlen {s} batch {b} heads {h} {'causal' if args.causal else 'non-causal'}: "
          f"{len(rows['tile'])} tile samples, {key_tiles} key tiles per tile")
    print("| part | median cycles | p10 | p90 |")
    print("|---|---|---|---|")
    for name, vals in rows.items():
        if vals:
            a = np.array(vals, dtype=np.float64)
            print(f"| {name} | {statistics.median(vals):.0f} | {np.percentile(a, 10):.0f} | "
                  f"{np.percentile(a, 90):.0f} |")
    if args.steps:
        print_steps(lib, d, key_tiles, t)


def print_steps(lib, d, key_tiles, tiles):
    fn = getattr(lib, f"flashattn_sm90_fwd_steps_{d}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    st = np.zeros((CTAS, WGS, STEPS, STEP_EVENTS), dtype=np.uint64)
    assert fn(st.ctypes.data, st.nbytes) == 0
    t = st.astype(np.int64)
    n = min(key_tiles - 1, STEPS)  # loop iterations: every key tile but the first
    print(f"\nsteady state ({n} loop iterations), median over CTAs of cycles:")
    print("| wg | j | " + " | ".join(STEP_PARTS) + " | tail | period |")
    print("|---" * (len(STEP_PARTS) + 4) + "|")
    for wg in range(WGS):
        for j in range(n):
            e = t[:, wg, j, :]
            ok = e[:, 0] > 0
            parts = [np.median((e[ok, i + 1] - e[ok, i])) for i in range(len(STEP_PARTS))]
            nxt = t[:, wg, j + 1, 0] if j + 1 < n else None
            tail = period = float("nan")
            if nxt is not None:
                ok2 = ok & (nxt > 0)
                tail = np.median(nxt[ok2] - e[ok2, 6])
                period = np.median(nxt[ok2] - e[ok2, 0])
            print(f"| {wg} | {j} | " + " | ".join(f"{x:.0f}" for x in parts) + f" | {tail:.0f} | {period:.0f} |")
    # The other warpgroup's view: warpgroup 1's turn acquired vs warpgroup 0's issue of the same key tile.
    lag = [np.median(t[:, 1, j, 2] - t[:, 0, j, 3]) for j in range(n)]
    print("wg1 turn - wg0 issued, per j:", " ".join(f"{x:.0f}" for x in lag))
    lag = [np.median(t[:, 0, j + 1, 2] - t[:, 1, j, 3]) for j in range(n - 1)]
    print("wg0 next turn - wg1 issued, per j:", " ".join(f"{x:.0f}" for x in lag))
    print_fused(lib, d, tiles)


FUSED_PARTS = ("lookup", "v_wait", "q_wait", "k_wait", "turn_issue", "pv_wait", "pack", "o_store", "lse",
               "s_wait")  # trace.h's TraceFused, one part per interval


def print_fused(lib, d, tiles):
    """kCrossTile's fused last turn of the step tile (trace.h's TraceFused), then the next
    tile's first softmax up to the tile's end stamp; from the last loop step's end."""
    fn = getattr(lib, f"flashattn_sm90_fwd_fused_{d}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fu = np.zeros((CTAS, WGS, len(FUSED_PARTS) + 1), dtype=np.uint64)
    assert fn(fu.ctypes.data, fu.nbytes) == 0
    f = fu.astype(np.int64)
    print("\nfused last turn (kCrossTile), median over CTAs of cycles:")
    print("| wg | " + " | ".join(FUSED_PARTS) + " | softmax | total |")
    print("|---" * (len(FUSED_PARTS) + 3) + "|")
    for wg in range(WGS):
        ok = f[:, wg, 0] > 0
        end = tiles[ok, 3, wg, 4]  # trace.h's kTraceStepTile: its tile-end stamp
        cols = [f[ok, wg, i] for i in range(len(FUSED_PARTS) + 1)] + [end]
        vals = [np.median(cols[i + 1] - cols[i]) for i in range(len(cols) - 1)]
        print(f"| {wg} | " + " | ".join(f"{x:.0f}" for x in vals) + f" | {np.median(cols[-1] - cols[0]):.0f} |")


if __name__ == "__main__":
    main()
