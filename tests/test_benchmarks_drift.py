"""Smoke runs of the drift and re-plan benchmarks at tiny sizes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.common.allocations import traced_allocations

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT, check=False, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.benchmark
def test_bench_drift_follows_the_drift_that_a_day_0_hot_set_misses(tmp_path):
    out = _run(
        "bench_drift.py", "--days", "4", "--inputs-per-day", "40000", "--profile-steps", "4", "--every", "4",
        "--half-life", "8", "--out", str(tmp_path), "--figures", str(tmp_path),
    )  # fmt: skip
    result = json.loads((tmp_path / "bench_drift.json").read_text())
    share = result["share_per_day"]
    assert set(share) == {"never", "every", "auto", "today"} and all(len(s) == 4 for s in share.values())
    assert share["never"][-1] < share["never"][0] - 0.05, share["never"]
    assert share["every"][-1] > share["never"][-1] + 0.05, share
    assert result["policies"]["every"]["replans"], "the recent hot set moved"
    steps = result["predicted_step_ms_per_day"]["never"]
    assert steps[-1] > steps[0], "fewer hot inputs, a slower predicted step"
    assert all(b > 0 for b in result["watch_bytes_per_table"])
    assert "largest gap to today's profile" in out
    assert (tmp_path / "bench_drift.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.benchmark
def test_bench_replan_times_each_phase(tmp_path):
    out = _run(
        "bench_replan.py", "--scale", "0.02", "--num-samples", "40000", "--batch-size", "512",
        "--budget", "256KiB", "--watch-steps", "10", "--out", str(tmp_path), "--trace-allocations",
    )  # fmt: skip
    result = json.loads((tmp_path / "bench_replan.json").read_text())
    assert result["path"] == "rows", "the cold part keeps every table with cold rows: only those rows move"
    for phase in ("decision", "plan", "move_rows", "partition"):
        assert result[f"{phase}_seconds"] > 0, phase
    assert result["leaving_rows"] > 0 and result["entering_rows"] > 0 and result["gathered_bytes"] > 0
    assert result["rows_moved"] > 0 and result["partition_bytes"] > 0
    assert "move, only the rows that change part" in out
    assert result["move_us_per_moved_row"] > 0 and result["training_peak_gib"] > 0
    assert result["replan_peak_gib"] > 0 and result["trained_steps"] == 10
    assert result["repartitioned_inputs"] > 36_000, "the untrained rest and the full data"
    assert "re-plan in all" in out
    held = result["allocations"]
    assert set(held["phases"]) == {"decision", "move", "re-partition"}
    assert held["phases"]["move"]["tensor_bytes"] > 0, "the move assembles the hot rows as tensors"
    assert held["phases"]["re-partition"]["python_bytes"] > 0, "the re-partition reads blocks of inputs"
    for kind in ("tensor_bytes", "python_bytes"):
        assert held["whole"][kind] >= max(p[kind] for p in held["phases"].values()), kind
    assert "allocations held at their peak" in out and "bytes per moved row" in out


def test_traced_allocations_count_what_a_block_and_each_phase_hold_at_their_peak():
    """Tensors through the profiler, numpy through tracemalloc; what a block frees of memory it did not
    allocate is not subtracted; a phase counts from what was held as it began."""
    before = [torch.zeros(1_000_000) for _ in range(2)]
    with traced_allocations() as trace:
        held = torch.zeros(250_000)  # 1 MB, held to the end
        with trace.phase("a"):
            array = np.ones(500_000)  # 4 MB of numpy
            transient = torch.zeros(500_000)  # 2 MB, freed within the phase
            del transient
            kept = torch.zeros(125_000)  # 0.5 MB
        before.pop()  # 4 MB allocated before the block: not counted
        with trace.phase("b"):
            del held  # -1 MB
            grown = torch.ones(500_000)  # +2 MB: 1 MB above where the phase began
    assert trace.whole.tensor_bytes == 1_000_000 + 2_000_000  # as the transient one lived
    assert trace.phases["a"].tensor_bytes == 2_000_000
    assert trace.phases["b"].tensor_bytes == 1_000_000
    assert 4_000_000 <= trace.phases["a"].python_bytes < 4_500_000  # the array, and Python's own
    assert trace.phases["b"].python_bytes < 500_000
    assert 4_000_000 <= trace.whole.python_bytes < 4_500_000
    assert trace.whole.total_bytes == trace.whole.tensor_bytes + trace.whole.python_bytes
    assert array.size and kept.numel() and grown.numel()


@pytest.mark.benchmark
def test_bench_decay_measures_a_first_day_hot_set_on_later_days(tmp_path):
    """Three days of events: days 0 and 1 look up the same items, day 2 new ones (a budget of the 13 rows
    day 0 uses: 10 items, 3 categories)."""
    lines = []
    for day, items in ((0, range(10)), (1, range(10)), (2, range(100, 110))):
        start = 1_511_800_000 + day * 86_400  # midday in Beijing: one day per block
        lines += [f"{u},{items[u % 10]},{u % 3},pv,{start + u}" for u in range(200)]
    path = tmp_path / "UserBehavior.csv"
    path.write_text("\n".join(lines) + "\n")
    out = _run("bench_decay.py", str(path), "--min-events", "150", "--budget", "13", "--out", str(tmp_path))
    days = json.loads((tmp_path / "bench_decay.json").read_text())["days"]
    assert [d["day"] for d in days] == [0, 1, 2]
    assert days[0]["hot"] == days[1]["hot"] == 1.0 and days[2]["hot"] == 0.0 and days[2]["category"] == 1.0
    assert "item and category hot" in out
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_decay.py"), str(path), "--min-events", "1000"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "no day has 1000 events (--min-events)" in bad.stderr
