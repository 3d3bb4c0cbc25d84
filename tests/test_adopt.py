"""docs/adopt.md: the plain TorchRec script and its FAE version both train, and the page shows their diff,
which stays small."""

import ast
import difflib
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def test_the_fae_script_differs_from_the_torchrec_one_by_a_few_lines_as_the_page_shows():
    diff = list(
        difflib.unified_diff(
            _code("train_torchrec.py"), _code("train_fae.py"), "train_torchrec.py", "train_fae.py", n=1
        )
    )
    changed = [line for line in diff[2:] if line[0] in "+-"]
    added, removed = sum(line[0] == "+" for line in changed), sum(line[0] == "-" for line in changed)
    assert added <= 15 and removed <= 15, (added, removed)
    page = (ROOT / "docs" / "adopt.md").read_text()
    assert "```diff\n" + "".join(diff) + "```" in page, "docs/adopt.md shows the scripts' diff as it is"
    assert f"{added} lines added or changed, {removed} removed" in page


@pytest.mark.slow
def test_both_scripts_train(tmp_path):
    steps, loss = _train("train_torchrec.py", tmp_path)
    fae_steps, fae_loss = _train("train_fae.py", tmp_path)
    assert steps > 100 and math.isfinite(loss) and loss < 0.6
    assert abs(fae_steps - steps) <= 2, "the same inputs, the partition's last batches of each part cut"
    assert math.isfinite(fae_loss) and abs(fae_loss - loss) < 0.05
    is_hot = np.load(tmp_path / "partition" / "is_hot.npy")
    assert 0 < is_hot.mean() < 1, "hot and cold inputs both trained"
