"""The order implementations are timed in, per round, for the benchmarks that time several in turn.

The H100 runs at its 700 W power cap on most attention shapes, so a kernel's clock depends on
what ran just before it. A plain rotation keeps who-follows-whom fixed (with ours, fa2, cudnn:
ours after cuDNN, cuDNN after FA2, in every round but one), and an A/A run showed that it
matters: the same library timed right after cuDNN measured 1.4-2.0% slower than its copy timed
after another build of ours (docs/performance.md). Rotating by r // 2 and
reversing odd rounds makes each implementation follow both of its neighbours in the cycle equally
often over each 2 * len(names) rounds: for three (ours, fa2, cudnn), every ordered pair twice in
six rounds; for more, the neighbours only.
"""


def round_order(names, r):
    """The order of round r (0-based) over `names`."""
    k = (r // 2) % len(names)
    order = list(names[k:]) + list(names[:k])
    return order[::-1] if r % 2 else order
