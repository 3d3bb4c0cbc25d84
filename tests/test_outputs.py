"""What a run shows and writes at a glance: help with defaults and without torch, profile's legend, the
warning of a budget that makes every input hot, validation inputs that repeat training inputs, and
curves.png against another run (``--compare``)."""

import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

from fae_torchrec.cli import PROFILE_LEGEND
from fae_torchrec.cli import main as cli_main
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.recipes import DLRM, parse_args
from fae_torchrec.recipes.build import prepare
from fae_torchrec.recipes.curves import plot_curves
from fae_torchrec.train.evaluation import repeated_inputs
from fae_torchrec.train.partition import HotColdPartition
from planner.fae_planner import default_reservation
from tests.columnar_data import avazu_like, write_parquet, write_schema

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_dlrm_fae.py"
EVERYTHING_HOT = "every input is hot (the hot set holds every row, or the hot-input share is 100%)"


def _help(*command: str) -> str:
    done = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True, check=True)
    return " ".join(done.stdout.split())  # argparse wraps lines where it likes


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["-m", "fae_torchrec.cli", "profile"], ["synthetic inputs (default: 300000)", "(default: 256KiB)"]),
        (["-m", "fae_torchrec.cli", "plan"], ["budgets the knob tries (default: 6)", "(default: lru)"]),
        ([str(EXAMPLE)], ["passes over the training inputs (default: 1)", "(default: rowwise_adagrad)"]),
    ],
)
def test_help_shows_the_defaults_without_markup(command, shown):
    printed = _help(*command)
    assert all(text in printed for text in shown), printed
    assert "``" not in printed and "``" not in _help("-m", "fae_torchrec.cli")


def test_the_parsers_are_built_without_torch():
    """What keeps --help quick: every command's --help imports neither torch nor numpy."""
    code = (
        "import contextlib, io, sys\n"
        "from fae_torchrec.cli import main\n"
        "from fae_torchrec.recipes import DLRM, TBSM, parse_args\n"
        "calls = [lambda: main(['profile', '--help']), lambda: main(['plan', '--help']),\n"
        "         lambda: main(['profile', '--model', 'tbsm', '--help']),\n"
        "         lambda: parse_args(DLRM, ['--help']), lambda: parse_args(TBSM, ['--help'])]\n"
        "for call in calls:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        call()\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stderr


def test_profile_says_what_its_shares_count_and_warns_when_every_input_is_hot(tmp_path, capsys, caplog):
    data = ["--num-samples", "4000", "--scale", "0.0001", "--out", str(tmp_path / "stats.npz")]
    cli_main(["profile", *data, "--budget", "8KiB"])
    printed = capsys.readouterr().out
    assert "hot accesses" in printed and PROFILE_LEGEND in printed
    assert EVERYTHING_HOT not in caplog.text
    cli_main(["profile", *data, "--budget", "1GiB"])
    assert EVERYTHING_HOT in caplog.text and "choose a budget below the tables' 225.1 KiB" in caplog.text


def test_the_recipe_warns_when_every_input_is_hot(tmp_path, caplog):
    caplog.set_level(logging.INFO, "fae_torchrec.recipes")
    data = ["--num-samples", "3000", "--scale", "0.0001", "--batch-size", "256", "--out", str(tmp_path)]
    prepare(parse_args(DLRM, [*data, "--budget", "1GiB"]), DLRM)
    assert EVERYTHING_HOT in caplog.text and "choose a budget below the hot set's 225.1 KiB" in caplog.text
    assert f"wrote the partition {tmp_path / 'partition-fae'} (" in caplog.text
    assert "0 of 300 validation inputs (0.0%) repeat a training input's features" in caplog.text


def _block(ids: np.ndarray, dense: np.ndarray) -> SampleBlock:
    return SampleBlock(
        dense.astype(np.float32), ids, np.zeros(len(ids), dtype=np.float32), (1,) * ids.shape[1]
    )


def test_repeated_inputs_count_the_validation_inputs_whose_features_a_training_input_has():
    rng = np.random.default_rng(0)
    ids, dense = rng.integers(0, 1000, (500, 3)), rng.random((500, 2))
    training = _block(ids, dense)
    is_hot = rng.random(500) < 0.3
    partition = HotColdPartition(training.select(is_hot), training.select(~is_hot), is_hot, ("a", "b", "c"))
    # rows 0..9 of the training inputs (hot and cold), twice each; 5 new ids; 5 of a changed dense value
    changed = dense[20:25].copy()
    changed[:, 1] += 0.5
    validation = _block(
        np.concatenate([ids[:10], ids[:10], rng.integers(1000, 2000, (5, 3)), ids[20:25]]),
        np.concatenate([dense[:10], dense[:10], dense[:5], changed]),
    )
    assert repeated_inputs(validation, partition, chunk=64) == 20
    assert repeated_inputs(validation.slice(20, 30), partition) == 0


def test_inputs_that_differ_in_two_signs_are_not_repeats():
    """A hash that sums its words would let the sign bits of two dense columns cancel."""
    dense = np.ones((1, 4), np.float32)
    flipped = dense * np.array([1, -1, 1, -1], np.float32)
    ids = np.zeros((1, 3), np.int64)
    training = _block(ids, dense)
    partition = HotColdPartition(training, training.slice(0, 0), np.ones(1, bool), ("a", "b", "c"))
    assert repeated_inputs(_block(ids, flipped), partition) == 0
    assert repeated_inputs(_block(ids, dense), partition) == 1


def test_the_parsers_table_sets_are_criteos():
    from fae_torchrec.command_line import TABLE_SET_NAMES
    from fae_torchrec.data.criteo import TABLE_SETS

    assert TABLE_SET_NAMES == tuple(TABLE_SETS)


def _metrics(mode: str, steps: int, hot_every: int) -> dict:
    history = {
        "step": list(range(1, steps + 1)),
        "loss": list(np.linspace(0.7, 0.4, steps)),
        "hot": [step % hot_every == 0 for step in range(steps)],
        "eval_step": [steps // 2, steps],
        "auc": [0.7, 0.75],
        "log_loss": [0.5, 0.45],
    }
    return {"model": "DLRM", "mode": mode, "world_size": 1, "history": history}


def test_curves_draw_hot_and_cold_steps_beside_a_compared_run(tmp_path):
    plot_curves(_metrics("fae", 200, 3), tmp_path / "curves.png", _metrics("torchrec", 200, 10**9))
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("content", "why"),
    [("{not json", "cannot read"), ('{"history": {"step": []}}', "no history loss, eval_step, auc")],
)
def test_compare_refuses_a_file_that_is_not_a_run_naming_the_option_and_file(tmp_path, content, why):
    bad = tmp_path / "metrics.json"
    bad.write_text(content)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "out"), "--compare", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--compare {tmp_path}: " in done.stderr and str(bad) in done.stderr and why in done.stderr
    assert not (tmp_path / "out").exists(), "refused before the run"


def test_compare_takes_a_runs_folder_or_its_metrics(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(_metrics("torchrec", 10, 2)))
    for given in (tmp_path, tmp_path / "metrics.json"):
        assert parse_args(DLRM, ["--out", str(tmp_path / "out"), "--compare", str(given)]).compare == str(
            given
        )


def test_fae_planner_builds_torchrecs_default_reservation_without_its_warning():
    """TorchRec warns on every HeuristicalStorageReservation it is given; FAE's planner keeps it on
    purpose (what TorchRec's default planner reserves), so the warning would name planner/fae_planner.py
    on every plan."""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        reservation = default_reservation()
    assert isinstance(reservation, HeuristicalStorageReservation) and not shown


def test_the_recipe_warns_when_validation_inputs_repeat_training_inputs(tmp_path, caplog):
    """The public "Avazu sample" case: 499 rows repeated 6 times (AUC 0.99 there); every held-out input
    has a copy among the training inputs."""
    caplog.set_level(logging.INFO, "fae_torchrec.recipes")
    table = avazu_like(499)
    data = write_parquet(pa.concat_tables([table] * 6), tmp_path / "repeated.parquet")
    schema = write_schema(tmp_path / "schema.toml")
    args = ["--data", "parquet", str(data), "--schema", str(schema), "--batch-size", "64"]
    prepare(parse_args(DLRM, [*args, "--out", str(tmp_path / "out")]), DLRM)
    repeated = [r for r in caplog.records if "repeat a training input's features" in r.getMessage()]
    assert len(repeated) == 1 and repeated[0].levelno == logging.WARNING
    assert repeated[0].getMessage().startswith("299 of 299 validation inputs (100.0%) repeat")
