"""benchmarks/bench_train.py and benchmarks/bench_gpu.py run for real, as scripts, at tiny size."""

import json
import re
import subprocess
import sys
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_train import example_args
from benchmarks.bench_train import parse_args as bench_train_args
from benchmarks.common.statistics import standard_error
from fae_torchrec import AccessStats
from tests.conftest import realdata
from tests.distributed import run_launched

ROOT = Path(__file__).resolve().parents[1]
#: Small data for the example (one input in 10 is held out for validation).
TINY = ["--num-samples", "16000", "--scale", "0.01", "--batch-size", "256"]


def _script(path: str, *args: str) -> str:
    """Run a benchmark script from the repository root; its stdout."""
    run = run_launched([sys.executable, path, *args], cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout


def _bench_train(
    tmp_path: Path, world_size: str, *extra: str, data: list[str] = TINY, repeats: int = 2
) -> str:
    """Run bench_train at tiny size, check what it prints and writes; its stdout."""
    out = _script("benchmarks/bench_train.py", *data, "--world-sizes", world_size, "--split-steps", "20",
                  "--repeats", str(repeats), "--out", str(tmp_path), "--figures", str(tmp_path),
                  *extra)  # fmt: skip
    rows = dict(re.findall(r"^(fae|torchrec) +([\d,]+) ", out, flags=re.MULTILINE))
    assert set(rows) == {"fae", "torchrec"}, out
    assert all(int(value.replace(",", "")) > 0 for value in rows.values())
    assert f"world size {world_size} (the median of {repeats} repetitions" in out
    trained = re.search(r"; ([\d,]+) training inputs, the profile's sample left out\)", out)
    stats = AccessStats.load(tmp_path / f"ws{world_size}-fae-0" / "stats.npz")
    assert trained and int(trained[1].replace(",", "")) == stats.num_inputs - stats.num_sampled, out
    ratios = re.search(
        rf"samples/s per repetition: ([\d.x, ]+); mean ([\d.]+)x \(SE ([\d.]+|nan)\), (\d) of {repeats}", out
    )
    assert ratios, out
    per_repetition = [float(value.rstrip("x")) for value in ratios[1].split(", ")]
    assert len(per_repetition) == repeats and min(per_repetition) > 0 and float(ratios[2]) > 0, out
    if repeats > 1:  # the standard error of the mean ratio, from the printed (rounded) ratios
        assert float(ratios[3]) == pytest.approx(standard_error(per_repetition), abs=0.006), out
    else:
        assert ratios[3] == "nan", out
    machinery = re.search(
        r"FAE machinery: routing ([\d.]+) ms - the baseline's ([\d.]+) ms = (-?[\d.]+) ms.*split alone takes "
        r"([\d.]+) ms per step from the partition's part ids \(([\d.]+) ms by looking",
        out,
    )
    assert machinery and all(float(machinery[i]) > 0 for i in (1, 2, 4, 5)), out
    memory = re.search(r"peak RSS \(rank 0\): FAE ([\d.]+) GiB, baseline ([\d.]+) GiB: ([\d.]+)x", out)
    assert memory and float(memory[1]) > 0 and float(memory[2]) > 0, out
    assert "FAE hot step / baseline step:" in out
    assert (tmp_path / "bench_train.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / f"ws{world_size}-fae-0" / "stats.npz").exists()
    return out


@pytest.mark.benchmark
def test_bench_train_one_rank(tmp_path):
    _bench_train(tmp_path, "1")
    written = sorted(tmp_path.glob("ws1-*-*/metrics.json"), key=lambda path: path.stat().st_mtime_ns)
    assert [path.parent.name for path in written] == [
        "ws1-fae-0", "ws1-torchrec-0", "ws1-torchrec-1", "ws1-fae-1"
    ], "the mode that runs first alternates"  # fmt: skip


@pytest.mark.benchmark
def test_bench_train_runs_tbsm(tmp_path):
    tiny = ["--model", "tbsm", "--num-users", "1000", "--scale", "0.01", "--batch-size", "256", "--budget",
            "1MiB"]  # fmt: skip
    out = _bench_train(tmp_path, "1", data=tiny, repeats=1)
    assert out.startswith("data: TBSM, 1,000 users (synthetic), scale 0.01"), out
    metrics = json.loads((tmp_path / "ws1-fae-0" / "metrics.json").read_text())
    assert metrics["model"] == "TBSM" and metrics["hot_steps"] > 0 and metrics["cold_steps"] > 0, metrics


def test_bench_train_passes_its_pipeline_to_both_modes():
    """``--pipeline none`` reaches the example (whose plain loop test_train_example.py trains), in the
    options FAE and the baseline share; by default both train on the pipeline."""
    for given, expected in (([], "sparse"), (["--pipeline", "none"], "none")):
        args = example_args(bench_train_args(given))
        assert args[args.index("--pipeline") + 1] == expected, args


@pytest.mark.benchmark
def test_bench_train_two_ranks(tmp_path):
    _bench_train(tmp_path, "2", repeats=1)


@pytest.mark.benchmark
def test_bench_gpu_runs_on_cpu(tmp_path):
    out = _script("benchmarks/bench_gpu.py", *TINY, "--num-samples", "12000", "--out", str(tmp_path))
    assert "plan like (a), TorchRec's CPU kernels" in out
    modes = ["FAE", "FAE planned", "(a) torchrec", "(b) scaleup", "(c) hbm"]
    rows = re.findall(rf"^({'|'.join(map(re.escape, modes))}) +([\d,]+) +([\d.]+)x", out, re.MULTILINE)
    assert [mode for mode, _, _ in rows] == modes, out
    assert all(int(value.replace(",", "")) > 0 for _, value, _ in rows)
    assert rows[2][2] == "1.00"
    for fae, baseline in product(modes[:2], modes[2:]):
        assert re.search(rf"ratio {fae} / {re.escape(baseline)} samples/s: [\d.]+x", out), out


def test_bench_gpu_rejects_a_bad_hbm_cap():
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_gpu.py", "--hbm-cap", "lots"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--hbm-cap: not a byte size: 'lots'" in run.stderr


@pytest.mark.benchmark
def test_bench_interleaved_trains_both_models_in_one_process_in_turns(tmp_path):
    """Both models train in stretches of --stretch steps, in one process per rank (2 ranks here; the
    tests below run one process), until one has trained all its steps; the summary counts the pairs after
    the warm-up, the last one left out."""
    out = _script("benchmarks/bench_interleaved.py", *TINY, "--world-sizes", "2", "--stretch", "2",
                  "--epochs", "1", "--out", str(tmp_path), "--figures", str(tmp_path))  # fmt: skip
    world_size = 2
    stretches = json.loads((tmp_path / f"ws{world_size}" / "stretches.json").read_text())
    fae, baseline = stretches["fae"], stretches["torchrec"]
    assert len(fae) == len(baseline) > 4
    assert all(row[4] == 2 for row in fae[:-1] + baseline[:-1]), "full stretches but the last"
    assert min(fae[-1][4], baseline[-1][4]) < 2, "the run ends when a model has trained every step"
    assert sum(row[3] for row in fae) > 0 and sum(row[3] for row in baseline) == 0  # hot steps
    assert all(row[0] > 0 and row[1] > 0 for row in fae[:-1] + baseline[:-1])
    counted = re.search(rf"^world size {world_size}: (\d+) pairs of 2-step stretches counted", out, re.M)
    assert counted and int(counted[1]) == len(fae) - 3, out  # 2 warm-up pairs and the last
    assert re.search(
        r"per pair: mean [\d.]+x \(SE [\d.]+\), median [\d.]+x, \d+ of \d+ at least 1.0x", out
    ), out
    # the end-to-end ratio: each model's inputs over its step and routing seconds, counted pairs
    rate = {mode: np.asarray(rows[2:-1]) for mode, rows in stretches.items()}
    rate = {mode: rows[:, 0].sum() / rows[:, 1:3].sum() for mode, rows in rate.items()}
    routed = re.search(rf"^world size {world_size}:(?:.*\n)*?.*with routing included ([\d.]+)x", out, re.M)
    assert routed and float(routed[1]) == pytest.approx(rate["fae"] / rate["torchrec"], abs=6e-4), out
    assert (tmp_path / "bench_interleaved.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.benchmark
def test_bench_interleaved_trains_tbsm_with_model_tbsm(tmp_path):
    """``--model tbsm`` builds TBSM's models (three tables, users as the data size), as its example does."""
    out = _script("benchmarks/bench_interleaved.py", "--model", "tbsm", "--num-users", "3000", "--scale",
                  "0.01", "--batch-size", "256", "--world-sizes", "1", "--stretch", "2", "--epochs", "1",
                  "--out", str(tmp_path), "--figures", str(tmp_path))  # fmt: skip
    assert out.startswith("data: TBSM, 3,000 users (synthetic)"), out
    for mode in ("fae", "torchrec"):
        tables = AccessStats.load(tmp_path / "ws1" / mode / "stats.npz").tables
        assert [t.name for t in tables] == ["t_user", "t_item", "t_category"], tables
    stretches = json.loads((tmp_path / "ws1" / "stretches.json").read_text())
    assert sum(row[3] for row in stretches["fae"]) > 0 and sum(row[3] for row in stretches["torchrec"]) == 0
    assert re.search(r"^world size 1: \d+ pairs of 2-step stretches counted", out, re.M), out


@pytest.mark.benchmark
def test_bench_interleaved_needs_two_pairs_to_compare(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_interleaved.py"), *TINY, "--num-samples", "8000",
         "--world-sizes", "1", "--stretch", "2", "--epochs", "1", "--warmup-pairs", "1000", "--out",
         str(tmp_path), "--figures", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert "pairs of stretches counted after --warmup-pairs 1000: need at least 2" in run.stderr


@pytest.mark.benchmark
def test_bench_accuracy_pairs_fae_with_the_baseline_by_seed(tmp_path):
    out = _script("benchmarks/bench_accuracy.py", "--seeds", "2", "--num-samples", "4000", "--order",
                  "stream", "--jobs", "2", "--out", str(tmp_path), "--figures", str(tmp_path))  # fmt: skip
    difference = r" +([+-]0\.\d{4})"
    rows = re.findall(rf"^ +(\d) +(0\.\d{{4}}) +0\.\d{{4}}{difference * 2}$", out, flags=re.M)
    assert [row[0] for row in rows] == ["0", "1"], out
    results = json.loads((tmp_path / "bench_accuracy.json").read_text())
    baseline = results["baseline final_auc"]
    for seed, printed, *differences in rows:
        assert abs(baseline[int(seed)] - float(printed)) < 1e-4
        for mode, difference in zip(("reordered baseline", "stream"), differences, strict=True):
            auc = results[f"{mode} final_auc"][int(seed)]
            assert abs(auc - baseline[int(seed)] - float(difference)) < 1e-4
    for mode in ("baseline", "reordered baseline", "stream"):  # two runs at a time: each result in its place
        for seed in (0, 1):
            metrics = json.loads((tmp_path / f"{mode.replace(' ', '-')}-{seed}" / "metrics.json").read_text())
            assert results[f"{mode} final_auc"][seed] == metrics["final_auc"]
            assert metrics["mode"] == ("fae" if mode == "stream" else "torchrec")
    assert results["reordered baseline final_auc"] != baseline, "--order-seed changes the order alone"
    for mode in ("reordered baseline", "FAE stream"):
        summary = (rf"^{mode}: \d+\.\d% hot steps\n  auc: mean difference [+-]\d\.\d{{4}} \(SE "
                   r"\d\.\d{4}\), worse at \d of 2 seeds, \d by more than 0.005\n  log_loss")  # fmt: skip
        assert re.search(summary, out, re.M), out
    assert "reordered baseline: 0.0% hot steps" in out
    assert (tmp_path / "bench_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob("*/partition-*")), "the partitions are removed after each run"


@pytest.mark.benchmark
def test_bench_accuracy_reads_real_rows_where_they_are(tmp_path):
    """One seed (the test above pairs seeds): the baseline, its reordered control and FAE, once each."""
    rows = realdata("criteo_kaggle_head10k/train_head10000.txt")
    out = _script("benchmarks/bench_accuracy.py", "--seeds", "1", "--data", "criteo-tsv", str(rows),
                  "--example-args", "--scale 0.01 --batch-size 128 --sample 0.25 --budget 64KiB",
                  "--jobs", "2", "--out", str(tmp_path), "--figures", str(tmp_path))  # fmt: skip
    assert "data: criteo-tsv train_head10000.txt, FAE order stream" in out, out
    assert re.search(
        r"^  auc: mean difference [+-]\d\.\d{4} \(SE nan\), worse at \d of 1 seeds", out, re.M
    ), out
    for mode in ("stream", "baseline"):
        metrics = json.loads((tmp_path / f"{mode}-0" / "metrics.json").read_text())
        assert metrics["train_inputs"] == 9_000, "the real rows, one in ten held out"


@pytest.mark.benchmark
def test_bench_interleaved_measures_the_planned_cold_tier_against_caching(tmp_path):
    """``--modes planned fae``: FAE with its planned cold tier over FAE with its caching tier, both on the
    same schedule (the same hot steps in the same stretches)."""
    out = _script("benchmarks/bench_interleaved.py", *TINY, "--world-sizes", "1", "--stretch", "2",
                  "--epochs", "1", "--modes", "planned", "fae", "--out", str(tmp_path), "--figures",
                  str(tmp_path))  # fmt: skip
    stretches = json.loads((tmp_path / "ws1" / "stretches.json").read_text())
    assert list(stretches) == ["planned", "fae"]
    planned, fae = (np.asarray(rows) for rows in stretches.values())
    assert planned[:, 3].sum() > 0 and np.array_equal(planned[:, 3], fae[:, 3]), "the same hot steps"
    assert re.search(r"^samples/s: planned [\d,]+, fae [\d,]+: planned / fae [\d.]+x", out, re.M), out
    assert (tmp_path / "bench_interleaved_planned_fae.png").read_bytes()[:4] == b"\x89PNG"
