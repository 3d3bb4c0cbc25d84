import logging
import re
import subprocess
import sys

import pytest

from fae_torchrec import AccessStats
from fae_torchrec.cli import main
from fae_torchrec.data.synthetic_taobao import SyntheticTaobao
from fae_torchrec.data.taobao import tbsm_feature_names
from tests.conftest import realdata, taobao_slice


def test_profile_synthetic_prints_table_and_writes_stats_and_pictures(tmp_path, capsys):
    out = tmp_path / "run" / "stats.npz"
    main(["profile", "--num-samples", "40000", "--scale", "0.01", "--sample", "0.1",
          "--budget", "64KiB", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "t_cat_25" in printed and "total" in printed
    assert "estimated hot-input share:" in printed and "95% CI" in printed
    stats = AccessStats.load(out)
    assert stats.num_inputs == 36_000, "the training inputs: every 10th is held out, as the example does"
    assert len(stats.tables) == 26
    for png in ("stats_access_cdf.png", "stats_hot_share.png"):
        assert (tmp_path / "run" / png).read_bytes()[:4] == b"\x89PNG"


def test_profile_real_criteo_tsv(tmp_path, capsys):
    path = realdata("criteo_kaggle_head10k/train_head10000.txt")
    out = tmp_path / "stats.npz"
    main(["profile", "--data", "criteo-tsv", str(path), "--sample", "0.5", "--holdout", "2000",
          "--budget", "1MiB", "--out", str(out)])  # fmt: skip
    stats = AccessStats.load(out)
    assert stats.num_inputs == 9_000, "the training inputs (--val-every 10)"
    assert 4000 < stats.num_sampled < 5000
    assert sum(int(c.sum()) for c in stats.seen_counts) == 26 * stats.num_sampled
    assert len(stats.seen_rows[8]) <= 3, "C9 takes 3 values in this sample"
    assert "estimated hot-input share" in capsys.readouterr().out


def test_profile_tbsm_counts_the_training_windows_and_plans_them(tmp_path, capsys):
    """``--model tbsm`` profiles Taobao-layout data as train_tbsm_fae.py does (training windows only,
    20% of them by default), and ``plan`` plans its three tables from the file."""
    out = tmp_path / "stats.npz"
    main(["profile", "--model", "tbsm", "--num-users", "3000", "--scale", "0.01", "--budget", "16KiB",
          "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert all(f"\nt_{table} " in printed for table in ("user", "item", "category")), printed
    assert "estimated hot-input share:" in printed
    stats = AccessStats.load(out)
    source = SyntheticTaobao(3000, scale=0.01)
    assert stats.num_inputs == source.num_train and 0.17 < stats.num_sampled / stats.num_inputs < 0.23
    assert [config.feature_names for config in stats.tables] == [
        [name for name in tbsm_feature_names() if name.startswith(table)]
        for table in ("user", "item", "category")
    ]
    torchrec_level, root_filters = logging.getLogger("torchrec").level, list(logging.getLogger().filters)
    main(["plan", "--stats", str(out), "--world-size", "2", "--hbm-cap", "6MiB", "--batch-size", "256",
          "--candidates", "2", "--processes", "2", "--cache-algorithm", "lfu"])  # fmt: skip
    planned = capsys.readouterr().out
    took = re.search(r"FAE planning took [\d.]+ s in (\d+) process\(es\), (\d+) runs of TorchRec's", planned)
    assert took and took[1] == "2" and int(took[2]) >= 3, planned  # no hot rows and two budgets at least
    hot_rows = re.findall(r"^t_(?:user|item|category) +([\d,]+) ", planned, re.M)
    assert len(hot_rows) == 3 and any(rows != "0" for rows in hot_rows), "a plan with hot rows"
    load_factors = [float(lf) for lf in re.findall(r"fused_uvm_caching lf=([\d.]+)", planned)]
    assert load_factors and all(0 < lf <= 1 for lf in load_factors), "cold parts in UVM caches"
    step = float(re.search(r"^predicted step ([\d.]+) ms", planned, re.M)[1])
    # TorchRec's configurations of the same cache algorithm and pipeline (LFU: without it), each planned
    configs = r"^TorchRec ((?:default|scale-up)(?: tw-uvm| tw-all)? LFU): predicted step ([\d.]+) ms"
    steps = dict(re.findall(configs, planned, re.M))
    assert "default LFU" in steps and len(steps) + planned.count("LFU: none fits") == 6, planned
    best = re.search(
        r"^predicted step ratio, TorchRec's best \((.+)\) / FAE: ([\d.]+)x \(FAE's hot rows\)$", planned, re.M
    )
    assert best and best[1] == min(steps, key=lambda name: float(steps[name])), planned
    assert float(best[2]) == pytest.approx(float(steps[best[1]]) / step, rel=0.03) and float(best[2]) >= 1
    # the command silenced TorchRec's warnings while it ran, not in the process that called it
    assert logging.getLogger("torchrec").level == torchrec_level
    assert logging.getLogger().filters == root_filters


def test_profile_tbsm_reads_the_real_taobao_slice(tmp_path):
    out = tmp_path / "stats.npz"
    main(["profile", "--model", "tbsm", "--data", "taobao-csv", str(taobao_slice()), "--out", str(out)])
    stats = AccessStats.load(out)
    assert stats.num_inputs == 26_630, "the training windows of the slice (test_taobao.py)"
    assert [config.num_embeddings for config in stats.tables] == [66_455, 84_794, 3_914]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "tbsm", "--num-samples", "10"], "unrecognized arguments: --num-samples 10"),
        (["--model", "tbsm", "--data", "criteo-tsv", "x"], "unknown kind 'criteo-tsv'"),
        (["--model", "wdl"], "argument --model: invalid choice: 'wdl'"),
    ],
)
def test_bad_model_options_are_reported(tmp_path, capsys, caplog, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--num-users", "10", "--out", str(tmp_path / "s.npz"), *args])
    assert exit_info.value.code == 2
    assert message in caplog.text + capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget=-1MiB"], "not a byte size: '-1MiB'"),
        (["--budget", "lots"], "not a byte size: 'lots'"),
        (["--sample", "0"], "argument --sample: must be in (0, 1], got 0"),
        (["--data", "criteo-tsv", "/nonexistent.txt"], "no such file: /nonexistent.txt"),
        (["--data", "criteo-tsv"], "criteo-tsv: needs a path"),
        (["--data", "synthetic", "x"], "synthetic: takes no path"),
        (["--data", "orc", "x"], "unknown kind 'orc'"),
    ],
)
def test_bad_arguments_are_reported(tmp_path, caplog, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--num-samples", "10", "--out", str(tmp_path / "s.npz"), *args])
    assert exit_info.value.code == 2
    assert message in caplog.text + capsys.readouterr().err


def test_empty_tsv_is_an_error(tmp_path, caplog):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--data", "criteo-tsv", str(empty), "--out", str(tmp_path / "s.npz")])
    assert exit_info.value.code == 2
    assert "no input was sampled: 0 inputs seen" in caplog.text


def test_profile_without_holdout_writes_no_share_picture(tmp_path, capsys):
    out = tmp_path / "counts.bin"
    main(["profile", "--num-samples", "20000", "--scale", "0.001", "--holdout", "0",
          "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "n/a (no holdout inputs" in printed
    assert f"wrote {out}, {tmp_path / 'counts'}_access_cdf.png\n" in printed
    assert not (tmp_path / "counts_hot_share.png").exists()
    assert AccessStats.load(out).num_inputs == 18_000, "saved at exactly the given path"


#: Runs the CLI in a fresh process and prints how much its peak RSS grew after the imports (KiB).
_PEAK_GROWTH = """
import resource, sys
from fae_torchrec.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
main(sys.argv[1:])
print("peak growth KiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _peak_growth_mib(args: list[str]) -> tuple[float, str]:
    """The CLI's peak RSS growth in MiB, and what it wrote to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_GROWTH, *args], capture_output=True, text=True, check=True
    )
    return int(done.stdout.rsplit("peak growth KiB", 1)[1]) / 1024, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB and paged counts: Linux")
def test_profile_and_plan_memory_grows_with_the_inputs_not_the_tables(tmp_path):
    """1,000 inputs at Criteo Kaggle's table sizes (33.8M rows: 258 MiB per int64 array over every
    row) take far less than one such array beyond the imports (it was 3 in `profile`, 2 in `plan`).
    `plan` shows none of the warnings TorchRec's planner repeats on each of its runs (164 lines of
    them hid the plan), and the knob's progress."""
    out = tmp_path / "stats.npz"
    profiled, _ = _peak_growth_mib(["profile", "--num-samples", "1000", "--out", str(out)])
    planned, stderr = _peak_growth_mib(
        ["plan", "--stats", str(out), "--world-size", "2", "--hbm-cap", "1GiB", "--candidates", "1"]
    )
    assert profiled < 128 and planned < 128, (profiled, planned)
    assert "WARNING" not in stderr and "Warning" not in stderr, stderr
    assert "hot budget 0 B: predicted step" in stderr, "the knob's progress, budget by budget"
