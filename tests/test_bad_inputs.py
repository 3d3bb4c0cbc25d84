"""Bad input to ``fae-torchrec`` and the training recipe (``examples/train_dlrm_fae.py``): exit status 2
and a message naming the option or file; damaged statistics files are refused by ``AccessStats.load``."""

import argparse
import os
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import CacheAlgorithm, CacheParams

from fae_torchrec import AccessStats
from fae_torchrec.cli import main
from fae_torchrec.data import npy_paths
from fae_torchrec.recipes import DLRM, parse_args
from fae_torchrec.recipes import main as train_main
from fae_torchrec.recipes.build import prepare
from fae_torchrec.recipes.options import check_resume_position
from fae_torchrec.units import parse_bytes
from planner import FAEShardingPlanner
from planner.topology import make_topology
from tests.conftest import exits_2
from tests.distributed import run_on_ranks


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    """A small statistics file with a holdout (20,000 synthetic inputs, tables at 0.001 x Kaggle)."""
    out = tmp_path_factory.mktemp("stats") / "stats.npz"
    main(["profile", "--num-samples", "20000", "--scale", "0.001", "--holdout", "2000", "--out", str(out)])
    return out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "1e400"], "argument --budget: byte size too large: '1e400'"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
        (["--num-samples", "0"], "argument --num-samples: must be a positive integer, got 0"),
        (["--num-samples", "ten"], "argument --num-samples: not an integer: 'ten'"),
        (["--num-samples", "1.0001k"], "argument --num-samples: not an integer: '1.0001k'"),
        (["--holdout", "2.5"], "argument --holdout: not an integer: '2.5'"),
        (["--dim", "-4"], "argument --dim: must be a positive integer, got -4"),
        (["--sample", "1.5"], "argument --sample: must be in (0, 1], got 1.5"),
        (["--sample", "nan"], "argument --sample: not a finite number: 'nan'"),
        (["--holdout", "-1"], "argument --holdout: must be a non-negative integer, got -1"),
        (["--scale", "0"], "argument --scale: must be a positive number, got 0"),
        (["--scale", "inf"], "argument --scale: not a finite number: 'inf'"),
        (["--scale", "1e300"], "--scale: scale 1e+300 makes a table of"),
        (["--ids-per-feature", "0"], "argument --ids-per-feature: must be a positive integer, got 0"),
        (["--seed", "-1"], "argument --seed: must be a non-negative integer, got -1"),
        (["--sample-seed", "-1"], "argument --sample-seed: must be a non-negative integer, got -1"),
        (["--tables", "/nonexistent/sizes.txt"], "--tables: /nonexistent/sizes.txt: cannot read table sizes"),
        (["--data", "criteo-tsv", "/"], "--data criteo-tsv: a directory, not a regular file: /"),
        (
            ["--data", "criteo-npy", "/nonexistent/day_0"],
            "--data criteo-npy: /nonexistent/day_0_dense.npy: missing",
        ),
    ],
)
def test_bad_profile_options_name_the_option(tmp_path, capsys, caplog, args, message):
    out = tmp_path / "s.npz"
    assert message in exits_2(["profile", "--num-samples", "10", "--out", str(out), *args], capsys, caplog)
    assert not out.exists()


def test_counts_take_k_and_m_suffixes(tmp_path, capsys):
    """``--num-samples 1.5k`` and ``--holdout 0.5K`` are 1,500 and 500 inputs, as the benchmarks take them."""
    out = tmp_path / "s.npz"
    main(["profile", "--num-samples", "1.5k", "--holdout", "0.5K", "--scale", "0.001", "--out", str(out)])
    stats = AccessStats.load(out)
    assert stats.num_inputs == 1350 and len(stats.holdout) == 500, "1,500 less every 10th (--val-every)"


def test_profile_out_that_is_a_directory_or_under_a_file(tmp_path, capsys, caplog):
    reported = exits_2(["profile", "--num-samples", "10", "--out", str(tmp_path)], capsys, caplog)
    assert f"--out {tmp_path}: is a directory" in reported
    afile = tmp_path / "file"
    afile.write_text("x")
    reported = exits_2(["profile", "--num-samples", "10", "--out", str(afile / "s.npz")], capsys, caplog)
    assert f"{afile} is a file, not a directory" in reported


def _not_a_readable_file(path: Path, kind: str) -> None:
    """Make ``path`` a FIFO, a symbolic-link loop, a link to nothing or an unreadable file (``kind``)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.with_name("other"))
        path.with_name("other").symlink_to(path)
    elif kind == "dangling":
        path.symlink_to(path.with_name("absent"))
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path.write_text("x")
        path.chmod(0)


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("fifo", "a FIFO (named pipe), not a regular file"),
        ("loop", "a symbolic-link loop"),
        ("dangling", "a symbolic link to a missing file"),
        ("unreadable", "permission denied"),
    ],
)
def test_a_data_or_schema_path_that_is_not_a_readable_file_is_named_with_why(
    tmp_path, capsys, caplog, kind, cause
):
    """Refused before it is opened (a FIFO would block the reader forever), for each ``--data`` kind
    that reads files and for ``--schema``."""
    path = tmp_path / "data"
    _not_a_readable_file(path, kind)
    out = ["--out", str(tmp_path / "s.npz")]
    for data in ("criteo-tsv", "parquet", "csv"):
        argv = [
            "profile",
            "--data",
            data,
            str(path),
            *(["--schema", "S"] if data != "criteo-tsv" else []),
            *out,
        ]
        assert f"--data {data}: {cause}: {path}" in exits_2(argv, capsys, caplog)
    csv = tmp_path / "data.csv"
    csv.write_text("click,a\n1,x\n")
    argv = ["profile", "--data", "csv", str(csv), "--schema", str(path), *out]
    assert f"--schema {path}: {cause}" in exits_2(argv, capsys, caplog)


@pytest.mark.parametrize(
    ("dtype", "value", "problem"),
    [
        (np.float64, 1e300, "1e+300 is beyond float32's range"),
        (np.float64, 3.5e38, "3.5e+38 is beyond float32's range"),
        (np.float32, np.nan, "nan is not a finite number"),
    ],
)
def test_a_criteo_npy_dense_value_that_is_not_a_finite_float32_is_named(
    tmp_path, capsys, caplog, dtype, value, problem
):
    prefix = tmp_path / "day_0"
    dense = np.ones((4, 13), dtype=dtype)
    dense[2, 4] = value
    for path, array in zip(
        npy_paths(prefix), (dense, np.zeros((4, 26), np.int64), np.zeros((4, 1), np.int32)), strict=True
    ):
        np.save(path, array)
    argv = ["profile", "--data", "criteo-npy", str(prefix), "--out", str(tmp_path / "s.npz")]
    assert f"{prefix}_dense.npy: row 2, column 4 (I5): {problem}" in exits_2(argv, capsys, caplog)


#: Where nothing can be created, even by root: a directory and a path below it (the reason, such as
#: /proc's "No such file or directory", is the system's).
UNWRITABLE = pytest.mark.parametrize(
    ("directory", "below"), [("/proc", "/proc/fae-run"), ("/sys", "/sys/fae/run")]
)


def _damaged_tsv(tmp_path: Path) -> Path:
    """A Criteo TSV whose first line is refused when it is read."""
    path = tmp_path / "damaged.txt"
    path.write_text("not a criteo line\n")
    return path


@UNWRITABLE
def test_profile_out_that_cannot_be_written_is_refused_before_the_data_is_read(
    tmp_path, capsys, caplog, directory, below
):
    """The damaged data would be refused when read: the --out error comes first."""
    if not Path(directory).is_dir():
        pytest.skip(f"{directory} is not mounted here")
    out = f"{below}/s.npz"
    data = ["--data", "criteo-tsv", str(_damaged_tsv(tmp_path))]
    reported = exits_2(["profile", *data, "--out", out], capsys, caplog)
    assert f"--out {out}: cannot create anything in {directory} (" in reported
    assert "damaged.txt" not in reported


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "0"], "argument --world-size: must be a positive integer, got 0"),
        (["--world-size", "-2"], "argument --world-size: must be a positive integer, got -2"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
        (["--dim", "0"], "argument --dim: must be a positive integer, got 0"),
        (["--candidates", "0"], "argument --candidates: must be a positive integer, got 0"),
        (["--processes", "0"], "argument --processes: must be a positive integer, got 0"),
        (["--budget", "1e400"], "argument --budget: byte size too large: '1e400'"),
        (["--hbm-cap", "1e400"], "argument --hbm-cap: byte size too large: '1e400'"),
        (["--hbm-cap", "lots"], "argument --hbm-cap: not a byte size: 'lots'"),
        (["--hbm-cap", "1KiB"], "topology too small: TorchRec's reservations (15% of device memory"),
        (
            ["--cache-algorithm", "lfu", "--prefetch-pipeline"],
            "--cache-algorithm lfu --prefetch-pipeline: FBGEMM pipelines the prefetches of LRU caches only",
        ),
    ],
)
def test_bad_plan_options_name_the_option(stats_file, capsys, caplog, args, message):
    assert message in exits_2(
        ["plan", "--stats", str(stats_file), "--world-size", "2", *args], capsys, caplog
    )


@pytest.mark.parametrize("world_size", ["129", "100000"])
def test_plan_refuses_more_gpus_than_a_host_numbers_before_reading_the_statistics(
    tmp_path, capsys, caplog, world_size
):
    """Without ``--local-world-size`` TorchRec's topology puts every GPU on one host, numbered up to 127:
    from 129 GPUs its plan fails (after minutes; at 100,000 planning ran past 10 minutes and 3 GB), so
    ``plan`` refuses at once; so it does hosts that the ranks do not fill evenly."""
    absent = ["plan", "--stats", str(tmp_path / "absent.npz"), "--world-size", world_size]
    reported = exits_2(absent, capsys, caplog)
    assert f"--world-size {world_size}: at most 128 CUDA devices on a host, got {world_size}" in reported
    assert make_topology(128).world_size == 128, "the largest is planned"
    uneven = exits_2([*absent, "--local-world-size", "7"], capsys, caplog)
    assert (
        f"--world-size {world_size} --local-world-size 7: {world_size} ranks do not fill hosts of 7" in uneven
    )
    hosts = make_topology(256, local_world_size=8)
    assert (hosts.world_size, hosts.local_world_size) == (256, 8), "256 GPUs on 32 hosts are numbered"


def test_the_planner_refuses_pipelined_caches_that_fbgemm_cannot_pipeline(stats_file):
    """FBGEMM's TBE asserts that only LRU caches are pipelined: the planner says so before planning,
    for its own ``cache_params`` and for a table whose constraints ask for LFU caches under them."""
    stats, topology = AccessStats.load(stats_file), Topology(world_size=1, compute_device="cuda")
    lfu = CacheParams(algorithm=CacheAlgorithm.LFU)
    with pytest.raises(ValueError, match=r"^cache_params: LFU caches with prefetch_pipeline=True; FBGEMM"):
        FAEShardingPlanner(topology, stats, cache_params=replace(lfu, prefetch_pipeline=True))
    with pytest.raises(
        ValueError, match=r"^table t_cat_2 \(its constraints over the planner's cache_params\)"
    ):
        FAEShardingPlanner(topology, stats, constraints={"t_cat_2": ParameterConstraints(cache_params=lfu)})
    plain = CacheParams(prefetch_pipeline=False)
    FAEShardingPlanner(
        topology, stats, cache_params=plain, constraints={"t_cat_2": ParameterConstraints(cache_params=lfu)}
    )


def test_plan_refuses_statistics_without_holdout(tmp_path, capsys, caplog):
    out = tmp_path / "all.npz"
    main(["profile", "--num-samples", "5000", "--scale", "0.001", "--sample", "1", "--out", str(out)])
    assert len(AccessStats.load(out).holdout) == 0
    reported = exits_2(["plan", "--stats", str(out), "--world-size", "2"], capsys, caplog)
    assert f"--stats {out}: the statistics have no holdout inputs" in reported
    assert "profile with a sample fraction below 1 and a holdout" in reported
    with pytest.raises(ValueError, match="no holdout inputs"):  # any user of the planner
        FAEShardingPlanner(Topology(world_size=1, compute_device="cpu"), AccessStats.load(out))


def _damaged(stats_file: Path, tmp_path: Path, kind: str) -> Path:
    """A copy of ``stats_file`` damaged as ``kind`` says."""
    path = tmp_path / f"{kind}.npz"
    raw = stats_file.read_bytes()
    arrays = dict(np.load(stats_file))
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
        return path
    if kind == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
        return path
    if kind == "corrupt-member":  # a valid zip directory, a member's compressed bytes overwritten
        with zipfile.ZipFile(stats_file) as archive:
            info = archive.getinfo("counts_2.npy")
        start = info.header_offset + 30 + len(info.filename) + 8
        path.write_bytes(raw[:start] + b"\xff" * 16 + raw[start + 16 :])
        return path
    if kind == "negative-counts":
        arrays["counts_3"] = arrays["counts_3"].copy()
        arrays["counts_3"][0] = -1
    elif kind == "no-sample":
        arrays["num_sampled"] = np.int64(0)
    elif kind == "counts-shape":
        arrays["counts_2"] = arrays["counts_2"][:3]
    elif kind == "rows-order":
        arrays["rows_2"] = arrays["rows_2"][::-1]
    elif kind == "rows-range":
        arrays["rows_2"] = arrays["rows_2"].copy()
        arrays["rows_2"][-1] = 10**12
    elif kind == "holdout-shape":
        arrays["holdout_owners"] = arrays["holdout_owners"][:-1]
    elif kind == "holdout-row":
        arrays["holdout_rows"] = arrays["holdout_rows"].copy()
        arrays["holdout_rows"][0] = 10**12
    elif kind == "missing-member":
        del arrays["counts_25"]
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", "not a statistics file written by `fae-torchrec profile`, or damaged"),
        ("garbage", "not an npz (zip) file"),
        ("corrupt-member", "not a statistics file written by `fae-torchrec profile`, or damaged"),
        ("negative-counts", "damaged: table t_cat_3 has a count of -1"),
        ("no-sample", "damaged: 0 sampled of 18000 inputs"),
        ("counts-shape", "seen rows but 3 counts"),
        ("rows-order", "damaged: table t_cat_2's seen rows are not ascending ids of its"),
        ("rows-range", "damaged: table t_cat_2's seen rows are not ascending ids of its"),
        ("holdout-shape", "holdout rows but"),
        ("holdout-row", "damaged: holdout rows outside"),
        ("missing-member", "no 'counts_25'"),
    ],
)
def test_damaged_statistics_are_refused_naming_the_file(stats_file, tmp_path, capsys, caplog, kind, message):
    path = _damaged(stats_file, tmp_path, kind)
    with pytest.raises(ValueError, match="^" + str(path)) as error:
        AccessStats.load(path)
    assert message in str(error.value)
    assert message in exits_2(["plan", "--stats", str(path)], capsys, caplog)


def test_stats_that_are_a_directory_or_another_kind_of_file(tmp_path, capsys, caplog):
    assert f"{tmp_path}: is a directory" in exits_2(["plan", "--stats", str(tmp_path)], capsys, caplog)
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(3))
    assert f"{npy}: not a statistics file" in exits_2(["plan", "--stats", str(npy)], capsys, caplog)


def test_byte_sizes_beyond_int64_are_refused():
    assert parse_bytes("8TiB") == 8 << 40
    for text in ("1e400", "1e19", "9000000TiB"):
        with pytest.raises(ValueError, match="byte size too large"):
            parse_bytes(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "1e400"], "argument --budget: byte size too large: '1e400'"),
        (["--hbm-cap", "1e400"], "argument --hbm-cap: byte size too large: '1e400'"),
        (["--val-every", "0"], "argument --val-every: must be at least 2"),
        (["--val-every", "1"], "1 would hold out every input, leaving none to train on"),
        (["--epochs", "0"], "argument --epochs: must be a positive integer, got 0"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
        (["--dim", "0"], "argument --dim: must be a positive integer, got 0"),
        (["--num-samples", "-5"], "argument --num-samples: must be a positive integer, got -5"),
        (["--sample", "0"], "argument --sample: must be in (0, 1], got 0"),
        (["--lr", "inf"], "argument --lr: not a finite number: 'inf'"),
        (["--lr", "0"], "argument --lr: must be a positive number, got 0"),
        (["--dense-lr", "-0.1"], "argument --dense-lr: must be a positive number, got -0.1"),
        (["--eval-every", "-1"], "argument --eval-every: must be a non-negative integer, got -1"),
        (["--checkpoint-every", "-1"], "argument --checkpoint-every: must be a non-negative integer"),
        (["--scale", "nan"], "argument --scale: not a finite number: 'nan'"),
        (["--ids-per-feature", "0"], "argument --ids-per-feature: must be a positive integer, got 0"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--warmup", "1.5"], "argument --warmup: must be in [0, 1], got 1.5"),
        (["--balance", "-0.5"], "argument --balance: must be in [0, 1], got -0.5"),
        (
            ["--order", "phases", "--warmup", "0.1"],
            "a warm-up is part of the stream and time orders, not of the 'phases' order",
        ),
        (["--checkpoint-dir", "ck"], "--checkpoint-dir needs --checkpoint-every"),
    ],
)
def test_bad_example_options_name_the_option(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(DLRM, args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--out", "--checkpoint-dir"])
@UNWRITABLE
def test_example_out_or_checkpoint_dir_that_cannot_be_written_is_refused_before_the_data_is_read(
    tmp_path, capsys, option, directory, below
):
    if not Path(directory).is_dir():
        pytest.skip(f"{directory} is not mounted here")
    data = ["--data", "criteo-tsv", str(_damaged_tsv(tmp_path)), "--checkpoint-every", "5"]
    with pytest.raises(SystemExit) as exit_info:
        train_main(DLRM, [*data, option, below])
    assert exit_info.value.code == 2
    reported = capsys.readouterr().err
    assert f"{option} {below}: cannot create anything in {directory} (" in reported
    assert "damaged.txt" not in reported


def _batch_larger_than_the_data(rank: int, world_size: int, out: str) -> None:
    """2,700 training inputs fill a step of 2,000 on one rank, not on two; fewer with --exclude-profiled."""
    data = ["--num-samples", "3000", "--scale", "0.001", "--batch-size", "2000", "--out", out]
    with pytest.raises(ValueError) as refused:
        prepare(parse_args(DLRM, data), DLRM)
    assert str(refused.value) == (
        "--batch-size 2000 per rank on 2 ranks (4,000 in all) is larger than the training data: --data "
        "synthetic has 2,700 training inputs, 1,350 per rank"
    )
    with pytest.raises(ValueError) as refused:
        prepare(parse_args(DLRM, [*data, "--exclude-profiled"]), DLRM)
    found = re.fullmatch(
        r"--batch-size 2000 per rank on 2 ranks \(4,000 in all\) is larger than the training data: --data "
        r"synthetic has ([\d,]+) training inputs not profiled \(--exclude-profiled\), [\d,]+ per rank",
        str(refused.value),
    )
    assert found and 0 < int(found[1].replace(",", "")) < 2700, str(refused.value)
    dist.barrier()  # rank 0 removes the folder the refused pass made (its validation shares) as it returns
    assert not any(Path(out).glob("partition-*")), "refused before the partition is written"


def test_a_batch_larger_than_the_training_data_is_refused_on_every_rank(tmp_path):
    run_on_ranks(_batch_larger_than_the_data, 2, tmp_path, str(tmp_path / "out"))


def test_a_resume_past_the_last_epoch_names_epochs():
    """A checkpoint of epoch 1 (the second) cannot be resumed with --epochs 1; at the last step of the last
    epoch it can (nothing is left to train)."""
    check = check_resume_position
    args = argparse.Namespace(epochs=1, checkpoint_dir="ck")
    with pytest.raises(
        ValueError, match=r"^--epochs 1: the checkpoint in --checkpoint-dir ck is at epoch 1, step 5"
    ):
        check(args, 1, 5, 43)
    check(args, 0, 43, 43)
    check(argparse.Namespace(epochs=2, checkpoint_dir="ck"), 1, 5, 43)


def test_example_out_or_checkpoint_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "file"
    afile.write_text("x")
    for option in ("--out", "--checkpoint-dir"):
        for value in (afile, afile / "below"):
            with pytest.raises(SystemExit) as exit_info:
                parse_args(DLRM, [option, str(value)])
            assert exit_info.value.code == 2
            assert f"{option} {value}: {afile} is a file, not a directory" in capsys.readouterr().err
    assert parse_args(DLRM, ["--out", str(tmp_path / "new" / "dir")]).out == str(tmp_path / "new" / "dir")
