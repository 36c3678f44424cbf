"""python -m flashattn.bench's results parsing and plotting (no GPU: a synthetic table)."""

import os
import subprocess
import sys

import pytest

from flashattn import bench

TABLE = """# forward TFLOP/s, bf16, 16384 tokens, hidden 2048

- device: NVIDIA H100 80GB HBM3
- date: 2026-11-22 10:00 UTC
- commit: abc1234

| hdim | mask | seqlen | ours TFLOP/s | fa2 TFLOP/s | cudnn TFLOP/s | ours/FA2 | ours/cuDNN | max abs diff |
|---|---|---|---|---|---|---|---|---|
| 64 | none | 512 | 100 | 200 | nan | 0.50 | nan | 1.0e-03 |
| 64 | none | 1024 | 150 | 250 | 300 | 0.60 | 0.50 | 1.0e-03 |
| 128 | causal | 512 | 90 | 180 | 170 | 0.50 | 0.53 | 2.0e-03 |
"""


def test_parse_results():
    meta, impls, data = bench.parse_results(TABLE)
    assert impls == ["ours", "fa2", "cudnn"]
    assert meta["device"] == "NVIDIA H100 80GB HBM3"
    assert sorted(data) == [(64, "none"), (128, "causal")]
    assert data[(64, "none")][1024] == {"ours": 150.0, "fa2": 250.0, "cudnn": 300.0}
    assert data[(64, "none")][512]["cudnn"] != data[(64, "none")][512]["cudnn"]  # nan


def test_parse_results_rejects_text_without_table():
    with pytest.raises(ValueError, match="no results table"):
        bench.parse_results("# nothing here\n")


def test_plot_only_cli(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "run.md"
    results.write_text(TABLE)
    r = subprocess.run([sys.executable, "-m", "flashattn.bench", "--plot-only", str(results),
                        "--plots", str(tmp_path / "png")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "png"))
    assert names == ["run-forward-hdim128-causal.png", "run-forward-hdim64-none.png"]
    for n in names:
        with open(tmp_path / "png" / n, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
