"""One pipeline: ``fae-torchrec profile`` -> ``fae-torchrec plan --out`` -> the example with ``--stats`` and
``--plan`` trains on the plan it was given, and refuses a plan made for another run."""

import json
import logging
import sys

import pytest

from fae_torchrec import AccessStats, HotColdPartition
from fae_torchrec.cli import _parser, _planned_devices
from fae_torchrec.cli import main as cli_main
from fae_torchrec.defaults import DEFAULTS
from fae_torchrec.recipes import DLRM, TBSM, parse_args, run
from fae_torchrec.recipes import main as train_main
from fae_torchrec.recipes.build import kernels
from fae_torchrec.units import parse_bytes
from planner.plan_file import PlanFile
from planner.topology import local_devices

#: Tiny synthetic data, the same for every command: 3,600 training inputs, small tables, small batches.
DATA = ["--num-samples", "4000", "--scale", "0.001", "--batch-size", "64"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """``profile`` and ``plan --out`` of DATA on this machine (its CPU here): the folder and plan file."""
    folder = tmp_path_factory.mktemp("pipeline")
    stats, plan = folder / "stats.npz", folder / "plan.pt"
    cli_main(["profile", *DATA, "--sample", "0.2", "--out", str(stats)])
    cli_main(["plan", "--stats", str(stats), "--batch-size", "64", "--budget", "8KiB", "--out", str(plan)])
    return folder, PlanFile.load(plan)


def _train(folder, out: str, *args: str) -> dict:
    argv = [*DATA, "--stats", str(folder / "stats.npz"), "--plan", str(folder / "plan.pt"), "--out", out]
    return train_main(DLRM, [*argv, *args])


def test_the_commands_share_the_examples_defaults():
    """profile, plan and the examples default to one set of values (fae_torchrec.defaults)."""
    example, defaults = parse_args(DLRM, []), DEFAULTS["dlrm"]
    assert (example.batch_size, example.budget, example.optimizer, example.dim, example.sample) == (
        defaults.batch_size, defaults.budget, defaults.optimizer, defaults.dim, defaults.sample,
    )  # fmt: skip
    assert (example.num_samples, example.criteo_scale) == (defaults.inputs, defaults.scale)
    profile = _parser(["profile"]).parse_args(["profile"])
    plan = _parser(["plan"]).parse_args(["plan", "--stats", "s.npz"])
    for args in (profile, plan):
        assert (args.batch_size, args.optimizer) == (DEFAULTS["dlrm"].batch_size, DEFAULTS["dlrm"].optimizer)
    assert (profile.budget, profile.dim, profile.sample, profile.val_every) == (
        "256KiB", 16, 0.05, DEFAULTS["dlrm"].val_every,
    )  # fmt: skip
    assert (profile.num_samples, profile.criteo_scale) == (300_000, 0.02)
    tbsm = _parser(["profile", "--model", "tbsm"]).parse_args(["profile", "--model", "tbsm"])
    assert (tbsm.batch_size, tbsm.budget, tbsm.sample, tbsm.num_users, tbsm.synthetic_scale) == (
        256, "2MiB", 0.2, 20_000, 0.01,
    )  # fmt: skip
    plan_tbsm = _parser(["plan", "--model", "tbsm"]).parse_args(["plan", "--model", "tbsm", "--stats", "s"])
    assert plan_tbsm.batch_size == 256


def test_profile_plan_train_trains_on_the_plan_it_was_given(planned, tmp_path):
    folder, plan_file = planned
    made_for = plan_file.made_for
    assert (made_for["device"], made_for["world_size"], made_for["hbm_cap"]) == local_devices(), (
        "plan defaults to this machine's devices (without a GPU, its CPU as one rank)"
    )
    assert made_for["optimizer"] == "rowwise_adagrad" and made_for["batch_size"] == 64
    assert set(plan_file.plan.plan) == {"hot", "cold"}, "keyed relative to the split module"
    stats = AccessStats.load(folder / "stats.npz")
    assert stats.num_inputs == 3600, "profile counted the training inputs only (every 10th held out)"

    metrics = _train(folder, str(tmp_path / "run"))
    assert metrics["plan_file"] == str(folder / "plan.pt")
    assert metrics["stats_file"] == str(folder / "stats.npz")
    assert metrics["plan_kernels"] == dict(kernels(plan_file.plan)), "the kernels of the plan it was given"
    assert metrics["train_inputs"] == stats.num_inputs
    assert metrics["hot_steps"] > 0 and metrics["cold_steps"] > 0
    partition = HotColdPartition.open(tmp_path / "run" / "partition-fae")
    assert partition.hot_set_digest == made_for["hot_set"], "the inputs split by the plan's hot set"
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["plan_kernels"] == metrics["plan_kernels"]


@pytest.mark.parametrize(
    ("change", "args", "message"),
    [
        ({"device": "cuda"}, [], "device: made for 'cuda', this run has 'cpu'"),
        ({"world_size": 2}, [], "world_size: made for 2, this run has 1"),
        ({}, ["--dim", "8"], "dim: made for 16, this run has 8"),
        ({}, ["--optimizer", "sgd"], "optimizer: made for 'rowwise_adagrad', this run has 'sgd'"),
        ({"hot_bytes": 0}, [], "hot_set: made for"),
        ({"stats": "0" * 64}, [], "stats: made for '000"),
    ],
)
def test_a_plan_made_for_another_run_is_refused_naming_the_field(planned, tmp_path, change, args, message):
    folder, plan_file = planned
    if change:
        PlanFile(plan_file.plan, {**plan_file.made_for, **change}).save(tmp_path / "plan.pt")
        (tmp_path / "stats.npz").symlink_to(folder / "stats.npz")
        folder = tmp_path
    with pytest.raises(ValueError, match=r"^--plan .*plan.pt: made for another run, ") as refused:
        _train(folder, str(tmp_path / "run"), *args)
    assert message in str(refused.value)
    assert not (tmp_path / "run" / "partition-fae").exists(), "refused before writing the partition"


def test_statistics_of_other_data_and_a_plan_without_them_exit_2(planned, tmp_path, monkeypatch, capsys):
    folder, _ = planned
    example = ["train_dlrm_fae.py", *DATA, "--out", str(tmp_path / "run")]
    for args, message in (
        (
            ["--num-samples", "3000", "--stats", str(folder / "stats.npz")],
            "statistics of 3,600 training inputs",
        ),
        (["--scale", "0.002", "--stats", str(folder / "stats.npz")], f"--stats {folder / 'stats.npz'}: "),
        (["--plan", str(folder / "plan.pt")], "--plan needs --stats"),
        (["--stats", str(folder / "plan.pt")], f"--stats {folder / 'plan.pt'}: "),
    ):
        monkeypatch.setattr(sys, "argv", [*example, *args])
        with pytest.raises(SystemExit) as exit_info:
            run(DLRM)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_tbsm_trains_on_the_plan_it_was_given(tmp_path):
    """The same pipeline for TBSM, whose split module sits elsewhere in its model (``--model tbsm``)."""
    data, stats, plan = ["--num-users", "600"], tmp_path / "stats.npz", tmp_path / "plan.pt"
    cli_main(["profile", "--model", "tbsm", *data, "--out", str(stats)])
    cli_main(["plan", "--model", "tbsm", "--stats", str(stats), "--budget", "64KiB", "--out", str(plan)])
    plan_file = PlanFile.load(plan)
    assert plan_file.made_for["batch_size"] == DEFAULTS["tbsm"].batch_size
    metrics = train_main(
        TBSM, [*data, "--stats", str(stats), "--plan", str(plan), "--out", str(tmp_path / "run")]
    )
    assert metrics["model"] == "TBSM" and metrics["plan_file"] == str(plan)
    assert metrics["plan_kernels"] == dict(kernels(plan_file.plan))
    assert metrics["cold_steps"] > 0


GIB = 1 << 30


@pytest.mark.parametrize(
    ("local", "options", "planned"),
    [
        (("cuda", 4, 80 * GIB), [], ("cuda", 4, 80 * GIB)),  # this machine's GPUs and their memory
        (("cpu", 1, None), [], ("cpu", 1, None)),  # no GPU: its CPU as one rank
        (("cuda", 4, 80 * GIB), ["--world-size", "16"], ("cuda", 16, 80 * GIB)),
        (("cuda", 4, 80 * GIB), ["--device", "cpu"], ("cpu", 1, None)),
        (("cpu", 1, None), ["--world-size", "2"], ("cuda", 2, 16 * GIB)),  # a dry run of GPUs
        (("cpu", 1, None), ["--hbm-cap", "1GiB"], ("cuda", 1, GIB)),
        (("cpu", 1, None), ["--device", "cuda"], ("cuda", 1, 16 * GIB)),
        (("cpu", 1, None), ["--device", "cpu", "--world-size", "2"], ("cpu", 2, None)),  # 2 CPU ranks
    ],
)
def test_plan_defaults_to_this_machines_devices(local, options, planned):
    args = _parser(["plan"]).parse_args(["plan", "--stats", "s.npz", *options])
    assert _planned_devices(args, local) == planned


def test_plan_on_a_cpu_keeps_the_examples_budget(planned, tmp_path, caplog):
    """A CPU has no HBM whose time the knob could price: every budget prices alike, so ``plan`` keeps the
    examples' ``--budget`` instead of picking one on noise (it picked 0 B, no hot row, before)."""
    caplog.set_level(logging.INFO, "fae_torchrec")
    folder, _ = planned
    cli_main(["plan", "--stats", str(folder / "stats.npz"), "--out", str(tmp_path / "plan.pt")])
    made_for = PlanFile.load(tmp_path / "plan.pt").made_for
    assert 0 < made_for["hot_bytes"] <= parse_bytes(DEFAULTS["dlrm"].budget) and made_for["hot_rows"] > 0
    assert f"the hot-row budget is the examples' --budget {DEFAULTS['dlrm'].budget}" in caplog.text
    assert "the plan keeps no hot row" not in caplog.text
