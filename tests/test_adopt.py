"""docs/adopt.md: two TorchRec scripts (a plain one with an explicit planner and a DataLoader, and one of
TorchRec's golden trainer's shape) and their FAE versions all train, and the page shows both diffs,
which stay small."""

import ast
import difflib
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fae_torchrec import BatchRouter, HotColdPartition
from tests.distributed import run_ranks

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "examples" / "adopt"


def _code(name: str) -> list[str]:
    """The script's lines below its module docstring."""
    text = (SCRIPTS / name).read_text()
    return text.splitlines(keepends=True)[ast.parse(text).body[0].end_lineno :]


def _train(name: str, cwd: Path) -> tuple[int, float]:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / name)], cwd=cwd, capture_output=True, text=True, check=True
    )
    found = re.search(r"^(\d+) steps, mean loss of the last 20: ([\d.]+)$", done.stdout, re.M)
    assert found, done.stdout + done.stderr[-2000:]
    return int(found[1]), float(found[2])


#: Each TorchRec script and its FAE version.
PAIRS = [("train_torchrec.py", "train_fae.py"), ("golden_torchrec.py", "golden_fae.py")]


@pytest.mark.parametrize(("torchrec", "fae"), PAIRS)
def test_the_fae_script_differs_from_the_torchrec_one_by_a_few_lines_as_the_page_shows(torchrec, fae):
    diff = list(difflib.unified_diff(_code(torchrec), _code(fae), torchrec, fae, n=1))
    changed = [line for line in diff[2:] if line[0] in "+-"]
    added, removed = sum(line[0] == "+" for line in changed), sum(line[0] == "-" for line in changed)
    assert added + removed <= 15, (added, removed)
    page = (ROOT / "docs" / "adopt.md").read_text()
    shown = f"{added} lines added or changed, {removed} removed:\n\n```diff\n" + "".join(diff) + "```"
    assert shown in page, f"docs/adopt.md shows the diff of {fae} as it is"


@pytest.mark.slow
def test_both_scripts_train(tmp_path):
    steps, loss = _train("train_torchrec.py", tmp_path)
    fae_steps, fae_loss = _train("train_fae.py", tmp_path)
    assert steps > 100 and math.isfinite(loss) and loss < 0.6
    assert abs(fae_steps - steps) <= 2, "the same inputs, the partition's last batches of each part cut"
    assert math.isfinite(fae_loss) and abs(fae_loss - loss) < 0.05
    is_hot = np.load(tmp_path / "partition" / "is_hot.npy")
    assert 0 < is_hot.mean() < 1, "hot and cold inputs both trained"


def test_the_golden_shaped_script_and_its_fae_version_train_on_two_ranks(tmp_path):
    """Each rank's endless random dataset, DMP's own planner with a quantized-comms sharder, a fixed
    number of iterations: both train, and the FAE version's steps are hot and cold."""
    losses = {}
    for name in ("golden_torchrec.py", "golden_fae.py"):
        ranks = run_ranks([sys.executable, str(SCRIPTS / name)], 2, timeout=300, cwd=tmp_path)
        for rank in ranks:
            assert rank.returncode == 0, rank.stderr[-4000:]
        run = ranks[0]
        found = re.search(
            r"^(\d+) steps on 2 ranks; mean loss: first 20 ([\d.]+), last 20 ([\d.]+)$", run.stdout, re.M
        )
        assert found, run.stdout + run.stderr[-2000:]
        losses[name] = [float(found[2]), float(found[3])]
        assert all(math.isfinite(loss) for loss in losses[name]) and losses[name][1] < losses[name][0]
    # the FAE version's first 100 steps: the router's schedule, epoch after epoch
    router = BatchRouter(HotColdPartition.open(tmp_path / "partition"), 32, world_size=2)
    steps = [step.hot for epoch in range(4) for step in router.schedule(epoch)][:100]
    assert len(steps) == 100 and 0 < sum(steps) < 100, "hot and cold steps both trained"
