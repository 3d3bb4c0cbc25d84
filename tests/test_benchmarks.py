"""Smoke runs of the profile, hot-set and traffic benchmarks at tiny sizes: they run and print ratios."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


@pytest.mark.slow
def test_bench_traffic_prints_every_comparison_and_draws_the_curves(tmp_path):
    out = _run(
        "bench_traffic.py",
        "--num-samples", "200000", "--scale", "0.05", "--dims", "16", "--world-sizes", "1", "2",
        "--caps", "32MiB", "64MiB", "--sampling", "2", "--belady-sampling", "4", "--out", str(tmp_path),
    )  # fmt: skip
    lines = [line.split("|") for line in out.splitlines() if re.match(r"\s+16\s+[12]\s", line)]
    table, in_rows = [x for x in lines if len(x) == 5], [x for x in lines if len(x) == 2]
    assert table and len(in_rows) == len(table), out
    for figures in table:
        assert len(figures[1].split()) == 4 and len(figures[3].split()) == 4
    assert "rows moved per input: FAE" in out
    assert "goal traffic a/FAE >= 5: met at" in out and "goal step b > FAE: met at" in out
    for picture in ("traffic.png", "step_time.png", "hot_share.png"):
        assert (tmp_path / picture).read_bytes()[:4] == b"\x89PNG"


def test_bench_profile_and_bench_hot_set_run_small():
    profile = _run("bench_profile.py", "--num-samples", "140000", "--scale", "0.01", "--holdout", "2000",
                   "--repeat", "1")  # fmt: skip
    assert "extrapolated" in profile
    hot_set = _run("bench_hot_set.py", "--num-samples", "40000", "--scale", "0.01", "--budgets", "64KiB,1MiB")
    assert "ratio" in hot_set
