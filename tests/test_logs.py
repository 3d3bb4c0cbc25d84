"""torchrec_quiet drops the TorchRec, FBGEMM and PyTorch notices checked harmless, and only those."""

import logging
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fae_torchrec.logs import CHECKED_RECORDS, CHECKED_WARNINGS, torchrec_quiet

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_dlrm_fae.py"
CACHING = "Sharding Type is data_parallel, caching params will be ignored"
HEURISTICAL = "HeuristicalStorageReservation is known to cause issues, particularly during dry run"
BROADCAST = "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead."


class _Records(logging.Handler):
    """Keeps (logger, message) of the records it handles."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name, record.getMessage()))


@pytest.fixture
def records() -> Iterator[_Records]:
    """A handler on the root logger, as ``logging.basicConfig`` sets one."""
    handler = _Records()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


def test_checked_records_are_dropped_and_others_shown(records):
    with torchrec_quiet():
        logging.getLogger("torchrec.distributed.utils").warning(CACHING)
        logging.getLogger().warning("Sharding spec not found for hot.t_cat_0_hot")
        logging.getLogger("torchrec.distributed.planner").warning("something unchecked")
        logging.getLogger("fae_torchrec.x").warning("Sharding spec not found for ours")  # not TorchRec's
        logging.getLogger("fae_torchrec.x").warning("our own notice")
    logging.getLogger("torchrec.distributed.utils").warning(CACHING)  # the filter is gone after the block
    assert records.seen == [
        ("torchrec.distributed.planner", "something unchecked"),
        ("fae_torchrec.x", "Sharding spec not found for ours"),
        ("fae_torchrec.x", "our own notice"),
        ("torchrec.distributed.utils", CACHING),
    ]
    assert not any(logging.getLogger(name).filters for name, _ in CHECKED_RECORDS)


def test_checked_warnings_are_dropped_and_others_shown():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with torchrec_quiet():
            warnings.warn(HEURISTICAL, FutureWarning, stacklevel=1)
            warnings.warn("something unchecked", UserWarning, stacklevel=1)
            # DDP's renamed argument is checked where TorchRec's DDP wrappers pass it, not elsewhere
            warnings.warn_explicit(BROADCAST, FutureWarning, "x.py", 1, "torchrec.distributed.embeddingbag")
            warnings.warn_explicit(BROADCAST, FutureWarning, "x.py", 1, "fae_torchrec.x")
        warnings.warn(HEURISTICAL, FutureWarning, stacklevel=1)  # shown again after the block
    assert [(w.category, str(w.message)) for w in shown] == [
        (UserWarning, "something unchecked"),
        (FutureWarning, BROADCAST),
        (FutureWarning, HEURISTICAL),
    ]


@pytest.mark.slow
def test_the_example_prints_its_own_lines_and_no_checked_notice(tmp_path):
    """Its lines: what it wrote (the partition and its size as written, every output at the end), each
    evaluation as it happens, how many validation inputs repeat training inputs."""
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--num-samples", "30000", "--out", str(out), "--eval-every", "20"],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    checked = [start for _, start in CHECKED_RECORDS] + [start for _, start, _ in CHECKED_WARNINGS]
    assert not [start for start in checked if start in run.stderr]
    assert not re.search(r"\w+Warning: ", run.stderr), run.stderr[-4000:]
    # log lines carry a timestamp; tqdm's progress bars, rewritten with \r, do not
    lines = [line for line in re.split(r"[\r\n]", run.stderr) if re.match(r"\d{4}-\d\d-\d\d \d\d:", line)]
    assert 0 < len(lines) <= 12, lines
    assert f"wrote the partition {out / 'partition-fae'} (" in run.stderr
    assert re.search(
        r"[\r\n]\S+ \S+ DLRM fae_torchrec.recipes: step 20: validation AUC 0\.\d{4}, log loss", run.stderr
    )
    assert "0 of 3000 validation inputs (0.0%) repeat a training input's features" in run.stderr
    written = re.search(r"outputs in (\S+): (.*)\n", run.stderr)
    assert written and written[1] == str(out), run.stderr[-2000:]
    assert re.fullmatch(r"curves\.png, metrics\.json, partition-fae/ \(\d+\.\d MiB\), stats\.npz", written[2])
    # the training bar's figures beside the loss, from the first evaluation on
    assert re.search(r"loss \d\.\d{4}, hot \d+, cold \d+, AUC 0\.\d{4}\]", run.stderr)
