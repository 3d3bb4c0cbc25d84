"""Smoke runs of the profile, hot-set, traffic and planning benchmarks at tiny sizes: they print ratios."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_cli, bench_published, bench_traffic
from benchmarks.bench_hot_share import budget_ladder
from benchmarks.common.calibration import Calibration, Estimate
from benchmarks.common.id_stream import taobao_stream
from benchmarks.common.plan_traffic import cache_groups
from benchmarks.common.statistics import standard_error
from fae_torchrec.data.synthetic_taobao import SyntheticTaobao

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


def _rows(out: str, start: str, end: str, dim: int) -> list[list[str]]:
    """The rows of the grid's points at ``dim`` between the lines beginning ``start`` and ``end``, split
    at ``|``."""
    section = out.split(f"\n{start}", 1)[1].split(f"\n{end}", 1)[0]
    return [line.split("|") for line in section.splitlines() if re.match(rf"\s*{dim}\s+[12]\s", line)]


def _check_traffic_and_steps(
    out: str, dim: int, figures: Path, model: str, world_sizes: tuple[int, ...]
) -> list[list[str]]:
    """Check bench_traffic's traffic and step rows of its points at ``dim`` (one per world size of
    ``world_sizes``), its decisions, sweeps and figures; return the convergence rows (split at ``|``)."""
    traffic = _rows(out, "traffic: GiB moved", "step models", dim)
    steps = _rows(out, "step models", "FAE pp against", dim)
    assert len(traffic) == len(world_sizes) and len(steps) == 3 * len(traffic), out
    for row in traffic:
        for fae in row[1:4]:  # FAE pp, FAE, FAE hot: hot budget, estimated and measured hot-input shares
            estimated, measured = (float(x.rstrip("%")) for x in fae.split()[-2:])
            assert 0 <= estimated <= 100 and abs(estimated - measured) < 5, (
                "hot-input share: estimate and replay"
            )
        if not row[2].split()[0].startswith("0:"):
            assert row[2].split()[:-2] == row[3].split()[:-2], "FAE hot: the hot budget FAE's knob chose"
        fae_pp, fae, fae_hot, least, least_pp, belady = (float(x) for x in row[4].split())
        assert min(fae_pp, fae, fae_hot, least, least_pp) > 0
        assert belady <= min(least, least_pp), "Belady on equal terms moves least"
    assert float(traffic[0][4].split()[-1]) > 0, "Belady's cache cannot hold every row of the stream"
    assert float(traffic[0][2].split()[-2].rstrip("%")) > 0, "without the prefetch pipeline hot rows pay"
    grid = out.split("\nTorchRec's configurations", 1)[1].split("\nstep models", 1)[0]
    assert re.search(r"^default pp tw-all +\|", grid, re.M) and re.search(r"^scale-up LFU +\|", grid, re.M)
    for row in steps:  # TorchRec's best is named: one of its configurations
        assert re.search(r"\d (default|scale-up)( pp)?( tw-uvm| tw-all)?( LFU)? +\d", row[1]), row
    for name in ("FAE pp", "FAE hot", "FAE la", "FAE"):
        for model_name in ("perf", "Gen4", "Gen5"):
            assert re.search(
                rf"^{name} against TorchRec's best \({model_name}\): win +\d+, level +\d+, lose +\d+",
                out,
                re.M,
            )
    table = _rows(out, "decision:", "sweep:", dim)
    assert len(table) == 4 * len(world_sizes), table  # FAE pp, FAE hot, FAE la and FAE at each point
    assert all(len(r) == (5 if model == "dlrm" else 4) for r in table), table
    for cell in (c.strip() for r in table for c in r[1:]):  # a win is FAE's only with hot rows
        assert re.fullmatch(r"\d\.\d\d (win|level|lose) (layout|offload)", cell) or re.fullmatch(
            r"\d\.\d\d (level|lose) (default|scale-up|no hot rows).*", cell
        ), cell
    assert re.search(r"^ +0\.10 \( *3\.15 GB/s\) \| FAE pp: win", out, re.M), "a tenth of PCIe Gen4"
    assert re.search(r"^ +100 us \| FAE pp Gen4: win", out, re.M), "100 us of cache machinery a step"
    assert len(_rows(out, "break-even:", "whole step:", dim)) == len(world_sizes)
    for cells in re.findall(r"^  Gen[45] +\d+ +[12] .*\|((?: +(?:-|\d+\.\d\d)){5})$", out, re.M):
        assert any(c != "-" for c in cells.split()), "a ceiling only where TorchRec's best is transfer-bound"
    assert "\nceiling: TorchRec's best step / (c)'s" in out
    dense = "whole step: the dense part added to every plan's step" if model == "dlrm" else "not priced"
    assert dense in out
    for picture in ("traffic.png", "step_time.png", "hot_share.png"):
        assert (figures / picture).read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((figures / "traffic_points.json").read_text())
    assert saved["model"] == model
    assert [(p["dim"], p["world_size"]) for p in saved["points"]] == [(dim, w) for w in world_sizes]
    for point in saved["points"]:
        assert set(point["fae"]) == {"FAE pp", "FAE", "FAE hot"}
        assert max(n for name, n in point["caches"].items() if not name.startswith("FAE")) >= 1
    again = _run("bench_traffic.py", "--points", str(figures / "traffic_points.json"))
    printed = out[out.index("traffic: GiB moved") : out.index("\nconvergence:") + 1]
    assert again == printed, "the saved points print the same tables again"
    return _rows(out, "convergence:", "doubling", dim)


@pytest.mark.benchmark
def test_bench_traffic_prints_every_comparison_and_draws_the_curves(tmp_path):
    """DLRM's layout at one point, 1 GPU (the TBSM test below plans two: 1 and 2 GPUs)."""
    out = _run(
        "bench_traffic.py",
        "--num-samples", "100k", "--warmup", "50k", "--epoch", "200k", "--scale", "0.1", "--dims", "128",
        "--world-sizes", "1", "--caps", "128MiB", "--sampling", "2", "--belady-sampling", "4",
        "--convergence-lengths", "50k", "200k", "--convergence-points", "128:1:128MiB",
        "--knob-candidates", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.count("disjoint (checked)") == 1, "the profile reads other inputs than the replay"
    sampled = re.search(r"profile: ([\d,]+) sampled inputs \([\d.]+% of an epoch of 200,000\)", out)
    assert sampled and abs(int(sampled[1].replace(",", "")) - 10_000) < 1_000, (
        "5% of the epoch, not of the replay"
    )
    convergence = _check_traffic_and_steps(out, 128, tmp_path, "dlrm", (1,))
    assert [r[0].split()[4] for r in convergence] == ["50,000", "100,000", "200,000"]
    assert len({tuple(r[0].split()[5:]) for r in convergence}) == 1, "the same hot budgets at every length"
    assert "doubling the default 100,000 inputs to 200,000" in out


@pytest.mark.benchmark
def test_bench_traffic_replays_tbsm_inputs_the_profile_did_not_read(tmp_path):
    out = _run(
        "bench_traffic.py", "--model", "tbsm", "--num-users", "10000", "--scale", "0.05", "--holdout", "4k",
        "--warmup", "5k", "--num-samples", "10k", "--world-sizes", "1", "2", "--caps", "3MiB",
        "--batch-size", "64", "--convergence-lengths", "5k", "20k", "--convergence-points", "16:1:3MiB",
        "--knob-candidates", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.count("disjoint (checked)") == 1, "the profile reads other inputs than the replay"
    profile = re.search(
        r"^25,000 inputs replayed .+ profile: ([\d,]+) sampled inputs \([\d.]+% of the ([\d,]+) training "
        r"inputs\) and a holdout of 4,000",
        out,
        flags=re.M,
    )
    assert profile, out
    sampled, trained = (int(x.replace(",", "")) for x in profile.groups())
    assert abs(sampled / trained - 0.2) < 0.01, "FAE's TBSM profile: 20% of the training inputs"
    convergence = _check_traffic_and_steps(out, 16, tmp_path, "tbsm", (1, 2))
    assert [r[0].split()[4] for r in convergence] == ["5,000", "10,000", "20,000"]
    assert "doubling the default 10,000 inputs to 20,000" in out


def test_taobao_stream_replays_in_training_order_what_the_profile_left():
    source = SyntheticTaobao(2000, scale=0.01)
    stream = taobao_stream(source, 5000, holdout_size=1000)
    replayed, profiled = stream.replayed, stream.profiled
    assert len(replayed) == stream.num_inputs == len(stream.worst_rank) == 5000
    assert np.all(np.diff(replayed) > 0) and np.all(np.diff(profiled) > 0), "in training order"
    assert (
        len(profiled)
        == stream.stats.num_sampled + len(stream.stats.holdout)
        == stream.stats.num_sampled + 1000
    )
    assert not np.isin(replayed, profiled).any() and not stream.profile_overlaps()
    before = np.union1d(replayed, profiled[profiled < replayed[-1]])
    assert np.array_equal(before, np.arange(replayed[-1] + 1)), "the first inputs the profile left"
    assert profiled[-1] < source.num_train
    assert np.array_equal(stream.ids[stream.inputs == 0], source.train.ids[replayed[0]]), "every id kept"
    with pytest.raises(ValueError, match="inputs to replay"):
        taobao_stream(source, source.num_train, holdout_size=1000)


@pytest.mark.benchmark
def test_bench_profile_and_bench_hot_set_run_small():
    profile = _run("bench_profile.py", "--num-samples", "140000", "--scale", "0.01", "--holdout", "2000",
                   "--repeat", "1")  # fmt: skip
    per_million = {  # seconds per million inputs, by pass
        name: float(value)
        for name, value in re.findall(r"^(\w[\w ]*?) +[\d.]+ +[\d,]+ +[\d,]+ +([\d.]+)$", profile, re.M)
    }
    assert set(per_million) == {"generate", "fae profile", "naive full count", "classify", "partition"}
    assert all(value > 0 for value in per_million.values()), profile
    ratio = float(re.search(r"^ratio naive full count / fae profile: ([\d.]+)x$", profile, re.M)[1])
    assert ratio == pytest.approx(per_million["naive full count"] / per_million["fae profile"], abs=0.01)
    share = float(re.search(r"^hot-input share at \S+: ([\d.]+)%$", profile, re.M)[1])
    assert 0 < share <= 100
    hot_set = _run("bench_hot_set.py", "--num-samples", "40000", "--scale", "0.01", "--budgets", "64KiB,1MiB")
    rows = re.findall(r"^ +([\d.]+ [KM]iB) +([\d,]+) +([\d.]+)% +([\d.]+)% +([\d.]+) ", hot_set, re.M)
    assert [row[0] for row in rows] == ["64.0 KiB", "1.0 MiB"], hot_set
    (small, *small_shares), (large, *large_shares) = (
        (int(row[1].replace(",", "")), *map(float, row[2:])) for row in rows
    )
    assert 0 < small < large and small_shares[0] < large_shares[0], (
        "a larger budget, more rows and inputs hot"
    )
    for sample, everything, ratio in (small_shares, large_shares):
        assert 0 < sample <= 100 and 0 < everything <= 100
        assert ratio == pytest.approx(sample / everything, abs=2e-3)
        assert ratio <= 1.01, "the sample's hot set is no better than the one chosen from every input"


@pytest.mark.benchmark
def test_bench_columnar_measures_the_peak_memory_of_profiling_each_file(tmp_path):
    out = _run("bench_columnar.py", "--quick", "--work", str(tmp_path))
    assert "measured here: the peak resident memory (ru_maxrss) of each child process" in out, out
    imported = float(re.search(r"only imports fae_torchrec\.cli: ([\d.]+) MiB", out)[1])
    rows = re.findall(r"^ +([\d,]+) +([\d.]+) +([\d.]+) +(-?[\d.]+) +[\d.]+$", out, re.M)
    assert [int(r[0].replace(",", "")) for r in rows] == [10_000, 20_000], out
    for _, file_mib, peak, above_import in rows:
        assert float(file_mib) > 0 and float(peak) > imported > 0
        assert float(above_import) == pytest.approx(float(peak) - imported, abs=0.11)
    assert re.search(
        r"^ratio of peaks, 20,000 rows / 10,000 \(2x the rows, [\d.]+x the bytes\): [\d.]+x", out, re.M
    )
    sweep = re.findall(r"^ +([\d,]+) +([\d,]+) +([\d.]+) +(-?[\d.]+) +[\d.]+$", out, re.M)
    assert [(c, n) for c, n, *_ in sweep] == [("1,024", "10,000"), ("1,024", "20,000")]
    assert all(float(peak) > imported for _, _, peak, _ in sweep)
    assert (tmp_path / "rows_20000.parquet").stat().st_size > (tmp_path / "rows_10000.parquet").stat().st_size


@pytest.mark.benchmark
def test_bench_planning_times_both_planners_side_by_side():
    out = _run("bench_planning.py", "--world-sizes", "2", "4", "--scale", "0.01", "--num-samples", "100k",
               "--candidates", "1")  # fmt: skip
    rows = [line.split("|") for line in out.splitlines() if re.match(r"\s+[24] \|", line)]
    assert [int(r[0]) for r in rows] == [2, 4], out
    for _, fae, torchrec, ratio in rows:
        wall, _, runs, in_runs = (float(x) for x in fae.split())
        assert runs >= 2, "the knob runs TorchRec's planner for none and one budget at least"
        assert 0 < in_runs <= wall and float(torchrec.split()[0]) > 0 and ratio.strip().endswith("x")


@pytest.mark.benchmark
def test_bench_schedule_compares_each_order_with_the_baseline(tmp_path):
    out = _run("bench_schedule.py", "--num-samples", "30000", "--label-gap", "-1", "--seeds", "4",
               "--figures", str(tmp_path))  # fmt: skip
    hot, others = map(float, re.search(r"click rate (0\.\d+), others (0\.\d+)", out).groups())
    assert hot < others - 0.05, "the planted gap: hot inputs click less"
    found = re.search(r"([\d.]+)% entirely hot \(([\d.]+)% of the ([\d,]+) the profile did not sample", out)
    share, unprofiled_share, unprofiled = float(found[1]), float(found[2]), int(found[3].replace(",", ""))
    assert 0.9 * 30_000 < unprofiled < 30_000, "the 5% sample left out"
    assert abs(unprofiled_share - share) < 5, "at a 5% sample the shares are close"
    rows = {
        name: [float(value.rstrip("%")) for value in values.split()]
        for name, values in re.findall(r"^ *(baseline|stream|shuffled|phases) +(.+)$", out, flags=re.M)
    }
    assert set(rows) == {"baseline", "stream", "shuffled", "phases"}, out
    assert rows["baseline"][:3] == [0.0, 0.0, 0.0] and rows["stream"][0] == rows["shuffled"][0] > 10
    assert rows["stream"][2] <= 2 < rows["shuffled"][2] < rows["phases"][2], "longest hot run, max over seeds"
    assert rows["stream"][3] < 1.5 * rows["baseline"][3] < rows["phases"][3], (
        "windows stray as the baseline's"
    )
    assert (tmp_path / "bench_schedule.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.benchmark
@pytest.mark.parametrize(
    "data",
    [
        ["--num-users", "2000", "--scale", "0.01"],
        ["--model", "dlrm", "--num-samples", "20000", "--scale", "0.001"],
    ],
    ids=["tbsm", "dlrm"],
)
def test_bench_hot_share_estimates_and_measures_the_share_per_budget(tmp_path, data):
    out = _run("bench_hot_share.py", *data, "--budgets", "1GiB", "16KiB", "64KiB", "256KiB",
               "--out", str(tmp_path), "--figures", str(tmp_path))  # fmt: skip
    results = json.loads((tmp_path / "bench_hot_share.json").read_text())
    assert (tmp_path / "bench_hot_share.png").read_bytes()[:4] == b"\x89PNG"
    assert results["budget"] == [2**14, 2**16, 2**18, 2**30], "budgets in ascending order"
    tbsm = "dlrm" not in data
    assert ("target_step" in results) == tbsm, "the target step alone: TBSM only"
    measured = ["unprofiled", "validation", *(["target_step"] if tbsm else [])]
    for key in ["estimated", "low", "high", "row_share", *measured]:
        assert all(0.0 <= share <= 1.0 for share in results[key]), (key, results[key])
    for key in ["hot_rows", "estimated", *measured]:
        assert results[key] == sorted(results[key]), f"{key} grows with the budget"
    assert results["hot_rows"][-1] == results["total_rows"], "1 GiB holds the whole model"
    assert all(results[key][-1] == 1.0 for key in ["estimated", *measured]), "every input hot"
    low, estimated, high = (np.array(results[key]) for key in ("low", "estimated", "high"))
    assert np.all((low <= estimated) & (estimated <= high))
    assert 0.0 < results["unprofiled"][1] < 1.0, "64 KiB makes some unprofiled inputs hot, not all"
    assert 0 < results["num_unprofiled"] and 0 < results["num_validation"]
    rows = re.findall(r"^ +([\d.]+ [KMG]iB\*?) +([\d,]+) +[\d.]+% +[\d.]+% \[", out, flags=re.M)
    assert [row[0] for row in rows] == ["16.0 KiB", "64.0 KiB", "256.0 KiB", "1.0 GiB*"], out
    assert [int(row[1].replace(",", "")) for row in rows] == results["hot_rows"]


def test_bench_hot_share_ladder_doubles_up_to_the_whole_model():
    mib = 2**20
    assert budget_ladder(5 * mib).tolist() == [mib, 2 * mib, 4 * mib, 5 * mib]
    assert budget_ladder(4 * mib).tolist() == [mib, 2 * mib, 4 * mib]
    assert budget_ladder(mib // 2).tolist() == [mib // 2]


def test_standard_error_of_a_mean():
    assert standard_error([1.0, 3.0]) == pytest.approx(1.0)  # sample deviation sqrt(2), over sqrt(2)
    assert standard_error(np.full(5, 0.7)) == 0.0
    assert np.isnan(standard_error([2.0]))


def test_bench_traffic_needs_a_knob_candidate(capsys):
    with pytest.raises(SystemExit) as exited:
        bench_traffic.parse_args(["--knob-candidates", "0"])
    assert exited.value.code == 2
    assert "argument --knob-candidates: must be a positive integer, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["bench_hot_share.py", "bench_traffic.py"])
def test_bad_data_exits_with_status_2_and_says_why(script):
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--model", "tbsm", "--data", "nosuchkind"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "error: --data: unknown kind 'nosuchkind'; choose from synthetic, taobao-csv"
    )


#: Runs each ``script [args...]`` (joined by ``;``) as its own ``__main__``, which must exit 0.
_RUN_ALL = """
import os, runpy, shlex, sys
for call in sys.argv[1].split(";"):
    script, *args = shlex.split(call)
    sys.argv, sys.path[0] = [script, *args], os.path.dirname(script)  # as `python script` has them
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        assert done.code in (0, None), (call, done.code)
    else:
        raise AssertionError(f"{call}: did not exit")
"""


def test_every_script_prints_its_help():
    """``--help`` of every benchmark and example, and of each model where a script has ``--model`` (an
    unescaped ``%`` in a help text made ``bench_traffic.py --help`` crash)."""
    calls = []
    for script in sorted([*ROOT.glob("benchmarks/bench_*.py"), *ROOT.glob("examples/*.py")]):
        text = script.read_text()
        takes_model = any(mark in text for mark in ('"--model"', "model_parser", "add_training_options"))
        models = [["--model", "dlrm"], ["--model", "tbsm"]] if takes_model else [[]]
        calls += [" ".join([str(script), *model, "--help"]) for model in models]
    done = subprocess.run(
        [sys.executable, "-c", _RUN_ALL, ";".join(calls)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("usage:") == len(calls)


@pytest.mark.benchmark
def test_bench_busy_runs_the_example_alone_and_beside_a_busy_process(tmp_path):
    options = ["--num-samples", "3000", "--rounds", "1", "--busy", "1", "--settings", "after"]
    out = _run("bench_busy.py", *options, "--out", str(tmp_path))
    speed = r"\d+ \[ *\d+, +\d+\]"  # median [lowest, highest]
    assert re.search(rf"^after +{speed} +{speed} +[\d.]+$", out, re.M), out
    result = json.loads((tmp_path / "bench_busy.json").read_text())
    assert set(result["median"]) == {"after/idle", "after/busy"} and min(result["median"].values()) > 0


@pytest.mark.benchmark
def test_bench_calibrate_needs_a_gpu_and_bench_traffic_takes_its_figures(tmp_path):
    """Without CUDA the calibration says why it cannot run; its figures, as it writes them, price the
    saved TBSM points (committed with BENCHMARKS.md) beside the stated assumptions, and a damaged file is
    refused naming it."""
    refused = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_calibrate.py"), "--out", str(tmp_path / "c.json")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "none is visible here" in refused.stderr
    assert not (tmp_path / "c.json").exists()
    calibration = tmp_path / "calibration.json"
    figures = {64: Estimate(6.3, 6.0, 6.5), 512: Estimate(12.0, 11.0, 13.0)}  # GB/s by row bytes
    machinery = {64: Estimate(20.0, 18.0, 22.0), 512: Estimate(-5.0, -7.0, -3.0)}  # us
    Calibration("a GPU", figures, machinery, dict.fromkeys(figures, Estimate(0.5, 0.4, 0.6)),
                dict.fromkeys(figures, Estimate(0.1, 0.05, 0.2))).save(calibration)  # fmt: skip
    points = str(ROOT / "benchmarks" / "figures" / "tbsm" / "traffic_points.json")
    out = _run("bench_traffic.py", "--points", points, "--calibration", str(calibration))
    assert re.search(r"^FAE pp +\| +perf \| +Gen4 \| +Gen5 \| +calibrated$", out, re.M), out
    assert (
        "   64 B rows: effective host-device bandwidth 6.3 [6, 6.5] GB/s, cache machinery 20 [18, 22] us"
        in out
    )
    assert (
        "  512 B rows: effective host-device bandwidth 12 [11, 13] GB/s, cache machinery -5 [-7, -3] us"
        in out
    )
    assert "collectives: not measured (world size 1)" in out
    for name in ("FAE pp", "FAE hot", "FAE la", "FAE"):
        assert re.search(rf"^  {name} against TorchRec's best \(calibrated\): win +\d+, level", out, re.M)
    calibration.write_text('{"device": "a GPU"}')
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_traffic.py"), "--points", points,
         "--calibration", str(calibration)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and f"--calibration {calibration}: not a calibration" in bad.stderr
    calibration.write_text('{"device": "a GPU", "effective_gbps": 6.3, "machinery_us": 20.0}')
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(calibration))}: effective_gbps is the older format"
    ):
        Calibration.load(calibration)  # refused as the file above is, by its own name


def test_uniform_uvm_closed_form_matches_the_replay_of_uniform_ids():
    """The closed form of a ``fused_uvm`` table's bytes for uniform ids (expected distinct rows, and the
    expected length of TorchRec's benchmark lengths) agrees with replaying such ids through the plan's
    shards; every byte is the lookup kernels' own (``Traffic.direct``)."""
    rows, batch, batches = 20_000, 256, 40
    run = bench_published.RUNS["sdd_fused_uvm"]
    tables = bench_published.prefetch_emo_tables(rows)
    groups = cache_groups(bench_published.plan_run(run, tables, batch).plan)
    assert [s.row_end - s.row_start for s in groups.shards] == [10_000, 10_000]
    global_batch = batch * bench_published.RANKS
    replayed = bench_published.replayed_traffic(groups, rows, global_batch, batches, sampling=1, seed=0)
    per_row = {bench_published.LARGE: global_batch * bench_published.mean_length() / rows}
    closed = bench_published.uniform_uvm_traffic(groups, {bench_published.LARGE: 4}, per_row, training=True)
    for replay_bytes, closed_bytes in (
        (replayed.bytes_in, closed.bytes_in),
        (replayed.bytes_out, closed.bytes_out),
    ):
        assert np.allclose(replay_bytes / batches, closed_bytes, rtol=0.02), (
            replay_bytes / batches,
            closed_bytes,
        )
    assert replayed.direct.bytes == replayed.bytes and closed.direct.bytes == closed.bytes
    forward = bench_published.uniform_uvm_traffic(groups, {bench_published.LARGE: 4}, per_row, training=False)
    assert forward.bytes_out.sum() == 0 and np.allclose(
        forward.bytes_in, 512 * 4 * per_row[bench_published.LARGE] * 10_000
    )


def test_mean_length_is_the_mean_of_torchrec_benchmark_lengths():
    drawn = bench_published.lengths(np.random.default_rng(0), 1_000_000)
    assert abs(drawn.mean() - bench_published.mean_length()) < 0.01
    assert abs(bench_published.mean_length() - 29.5) < 0.05, "truncation takes half an id off N(30, 3)"


def test_traffic_split_keeps_the_kernels_bytes_in_series_on_the_prefetch_pipeline():
    """On the prefetch pipeline the prefetched bytes overlap the step, the kernels' own do not; on the
    sparse pipeline every byte is in series; the fitted bandwidth reproduces the step it was fitted to."""
    gbps = 31.5
    p = bench_published.Prediction(perf=0.0, layout=100.0, link=3.15e9, direct=1.26e9, pipelined=True)
    assert p.traffic(gbps) == 100.0  # 100 ms of transfers hidden by 100 ms of compute
    assert p.traffic(gbps, split=True) == pytest.approx(140.0)  # 40 ms of the kernels' own bytes
    assert replace(p, pipelined=False).traffic(gbps, split=True) == pytest.approx(200.0)
    fitted = bench_published.fitted_gbps(p, dense=10.0, target=180.0, split=True)
    assert p.traffic(fitted, dense=10.0, split=True) == pytest.approx(180.0)
    assert bench_published.fitted_gbps(p, dense=10.0, target=105.0, split=True) is None


@pytest.mark.benchmark
def test_bench_published_prints_every_comparison_and_refuses_bad_options(tmp_path):
    out = _run(
        "bench_published.py", "--large-rows", "200000", "--batch-size", "512", "--batches", "4",
        "--sampling", "1", "--out", str(tmp_path / "published.json"),
    )  # fmt: skip
    for variant, reference in bench_published.COMPARISONS:
        row = re.search(rf"^{re.escape(variant + ' / ' + reference)} .*$", out, re.M)
        assert row, (variant, reference, out)
        assert row[0].split()[-3:][2] in ("yes", "no")
    saved = json.loads((tmp_path / "published.json").read_text())
    assert [(c["variant"], c["reference"]) for c in saved["comparisons"]] == list(bench_published.COMPARISONS)
    assert saved["comparisons"][0]["published"]["ratio"] == pytest.approx(3743.76 / 2855.41)
    assert all(set(c["fitted"]) >= {"dense_ms", "gbps", "traffic_extra_ms"} for c in saved["comparisons"])
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_published.py"), "--large-rows", "3",
         "--out", str(tmp_path / "bad.json")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "--large-rows must be at least 2 x --sampling (32), got 3" in bad.stderr
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.benchmark
def test_bench_traffic_prices_the_bandwidths_fitted_to_torchrecs_published_runs(tmp_path):
    """``--published``: the decision table gets a column at the lowest and at the highest effective
    bandwidth fitted to TorchRec's published training runs (the eval run on another config left out),
    with a tally each; a file that is not bench_published.py's exits with status 2 naming it."""
    points = str(ROOT / "benchmarks" / "figures" / "tbsm" / "traffic_points.json")
    published = tmp_path / "published.json"
    runs = {"a": {"pipeline": "sparse"}, "b": {"pipeline": "prefetch"}, "e": {"pipeline": "eval"}}
    fitted = [("a", 40.0), ("b", 8.0), ("b", None), ("e", 55.0)]
    comparisons = [{"variant": v, "fitted": {} if g is None else {"gbps": g}} for v, g in fitted]
    published.write_text(json.dumps({"runs": runs, "comparisons": comparisons}))
    out = _run("bench_traffic.py", "--points", points, "--published", str(published))
    header = re.search(r"^FAE pp +\|.*\| +published fit 8\.0 GB/s \| +published fit 40\.0 GB/s$", out, re.M)
    assert header and "55.0" not in header[0], out
    for title in ("published fit 8.0 GB/s", "published fit 40.0 GB/s"):
        assert re.search(rf"^  FAE pp against TorchRec's best \({title}\): win +\d+, level", out, re.M)
    published.write_text('{"runs": {}}')
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_traffic.py"), "--points", points, "--published",
         str(published)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert (
        bad.returncode == 2
        and f"--published {published}: not a file written by bench_published" in bad.stderr
    )


@pytest.mark.benchmark
def test_bench_cli_times_every_help_in_fresh_processes():
    out = _run("bench_cli.py", "--runs", "1")
    rows = re.findall(r"^(.+?) +(\d+\.\d\d) +(\d+\.\d\d)$", out, re.M)
    assert [name for name, _, _ in rows] == list(bench_cli.COMMANDS), out
    assert all(float(median) >= float(least) > 0 for _, median, least in rows), out


@pytest.mark.benchmark
def test_bench_slot_plan_prices_the_planned_slots_against_caches_and_by_the_step_model():
    out = _run(
        "bench_slot_plan.py", "--num-samples", "20k", "--warmup", "10k", "--epoch", "100k", "--scale", "0.05",
        "--points", "16:2:3MiB", "--batch-size", "256", "--sampling", "1", "--windows", "4",
        "--aheads", "0", "1", "--host-ms", "0.5", "--knob-candidates", "1",
    )  # fmt: skip
    # every step cold, the tables' floors (a step's rows each) ask more than the device memory holds
    unfit = re.findall(r"\| tier, no hot: ([\d,]+) slots, more than d's ([\d,]+) rows$", out, re.M)
    assert len(unfit) == 2 and all(int(a.replace(",", "")) > int(b.replace(",", "")) for a, b in unfit), out
    lines = [line.split("|") for line in out.splitlines() if re.match(r"\s*16\s+2\s", line)]
    rows = [r for r in lines if len(r) == 5]
    assert [tuple(r[1].split()[-4:-1]) for r in rows] == [
        ("planned", "0", "epoch"), ("planned", "0", "4"), ("hot", "0", "epoch"), ("hot", "0", "4"),
        ("tier", "0", "epoch"), ("tier", "0", "4"), ("tier", "1", "epoch"), ("tier", "1", "4"),
    ], out  # fmt: skip
    for row in rows:
        planned, start, belady, fae, torchrec = (float(x) for x in row[2].split())
        over_d, over_torchrec, over_whole = (float(x) for x in row[3].split())
        assert planned > 0 and start >= 0 and belady > 0 and fae > 0 and torchrec > 0, row
        assert abs(over_d - planned / belady) < 0.01 and over_whole >= 1.0, row
        assert abs(over_torchrec - planned / torchrec) < 0.01, row
        seconds, memory = (float(x) for x in row[4].split()[:2])
        assert seconds > 0 and memory > 0, row
    no_hot = [float(r[3].split()[0]) for r in rows[2:4]]
    # every row in slots on d's steps: d bounds them from below in its own memory (--compare belady);
    # bench_traffic's d takes its memory from its last FAE plan, 1% apart here
    assert min(no_hot) >= 0.98, out
    assert no_hot[1] >= no_hot[0], "a window of 4 steps moves no fewer than the whole stream's plan"
    tier_slots = int(rows[4][1].split()[-1].replace(",", ""))
    assert 0 < tier_slots <= int(rows[0][1].split()[-1].replace(",", "")), "within d's memory"
    # the step model: per ahead, PCIe generation, part of the step and host ms, TorchRec's best / the
    # tier's at each bandwidth
    steps = {tuple(r[1].split()[-2:] + r[2].split()): r[3].split() for r in lines if len(r) == 4}
    assert set(steps) == set(
        product(("tier",), "01", ("Gen4", "Gen5"), ("sparse", "whole"), ("0.50", "0.00", "ceil"))
    ), out
    ratios = {key: [float(c.rstrip("*")) for c in cells] for key, cells in steps.items()}
    for (_, ahead, gen, part, host), cells in ratios.items():
        assert len(cells) == 5 and all(c > 0 for c in cells), (ahead, gen, part, host)
        hidden = ratios["tier", ahead, gen, part, "0.00"]
        if host == "0.50":  # the host's work slows the tier
            assert all(c < h for c, h in zip(cells, hidden, strict=True)), (ahead, gen, part)
        if host == "ceil":  # nothing moved: no slower than the copies hidden
            assert all(c >= h - 0.01 for c, h in zip(cells, hidden, strict=True)), (ahead, gen, part)
    for gen, part in product(("Gen4", "Gen5"), ("sparse", "whole")):  # copies ahead overlap the steps
        before, one = (ratios["tier", ahead, gen, part, "0.00"] for ahead in "01")
        assert all(o >= b for o, b in zip(one, before, strict=True)) and one[-1] > before[-1], (gen, part)


@pytest.mark.benchmark
def test_bench_copy_engine_trains_the_resident_model_through_the_slots():
    """``bench_copy_engine.py`` on CPU (the tier's copy engine and slot plan, loaded without TorchRec):
    every planned mode trains the rows that the resident mode trains, and counts its copies; bad options
    exit with status 2."""
    from benchmarks import bench_copy_engine

    small = ["--rows", "50k", "--steps", "12", "--warmup", "4", "--hot-rows", "2k", "--dense-ms", "0"]
    results = bench_copy_engine.main([*small, "--aheads", "0", "2"])
    assert set(results) == {"resident", "planned 0", "planned 2"}
    for name in ("planned 0", "planned 2"):
        assert results[name]["max_diff"] < 1e-5, name
        assert results[name]["mib"] > 0 and results[name]["in_ms"] > 0
    for wrong in (["--hot-rows", "50k"], ["--copies", "mapped"]):  # mapped copies need CUDA
        with pytest.raises(SystemExit) as bad:
            bench_copy_engine.main([*small, *wrong])
        assert bad.value.code == 2, wrong


@pytest.mark.benchmark
def test_bench_checkpoint_prices_saving_and_resuming_against_the_tables(tmp_path):
    """``bench_checkpoint.py`` runs the example without checkpoints, saving them and resuming, and prints
    what each adds to the peak as a share of the tables with their optimizer state."""
    out = _run(
        "bench_checkpoint.py", "--scale", "0.01", "--num-samples", "10k", "--batch-size", "256",
        "--checkpoint-every", "5", "--out", str(tmp_path),
    )  # fmt: skip
    shares = re.findall(
        r"^  (saving|resuming \(a load\)): [\d.]+, [-+][\d.]+ GiB, ([-+][\d.]+)% of", out, re.M
    )
    assert [what for what, _ in shares] == ["saving", "resuming (a load)"], out
    # no second copy of the tables (a whole-state pickle added +197%); tiny tables leave RSS noise
    assert all(float(share) < 50 for _, share in shares), out
    assert sorted(p.name for p in (tmp_path / "ws1" / "checkpoints").iterdir()) != [], "the saves were made"


@pytest.mark.benchmark
def test_bench_prepare_times_one_and_two_ranks_on_the_same_inputs():
    """``bench_prepare.py`` runs the offline pass at 1 and 2 ranks on the same npy files and finds the
    two ranks' statistics and partition identical to one's; ratios, the machine's busy cores and the
    Terabyte estimate printed."""
    out = _run(
        "bench_prepare.py", "--num-samples", "60000", "--scale", "0.005", "--ranks", "8", "--repeat", "1"
    )
    rows = re.findall(r"^ +([12]) +([\d.]+) +([\d.]+) +([\d.]+)x +([\d.]+) +(\w+)  \[[\d.]+\]$", out, re.M)
    assert [row[0] for row in rows] == ["1", "2"] and all(row[5] == "yes" for row in rows), out
    cores = os.cpu_count() or 1
    assert all(0 < float(row[4]) <= cores + 0.5 for row in rows), "the machine's busy cores, measured"
    one, two = (float(row[2]) for row in rows)  # seconds per million inputs, printed to 3 decimals
    # the ratio printed to 2 decimals, from unrounded seconds: within its own rounding and that of both
    rounding = 0.005 + one / two * (0.0005 / one + 0.0005 / two)
    assert float(rows[1][3]) == pytest.approx(one / two, rel=0.02, abs=rounding)
    assert re.search(r"^estimate for Criteo Terabyte .* 1 rank \d+ min, 8 ranks \d+ min$", out, re.M), out
