"""Run an example (``examples/train_dlrm_fae.py`` or ``train_tbsm_fae.py``) as its own process(es)
and read back its ``metrics.json``.

One process for world size 1, ``torch.distributed.run --standalone`` for more, so that a benchmark
measures the example exactly as users launch it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The example that trains each model.
EXAMPLES = {
    model: Path(__file__).resolve().parents[2] / "examples" / f"train_{model}_fae.py"
    for model in ("dlrm", "tbsm")
}
#: Lines of the example's stderr quoted when it fails.
ERROR_TAIL_LINES = 40


def data_size(args: argparse.Namespace) -> list[str]:
    """The example's option that sizes its synthetic data: ``--num-users`` for TBSM (``args.model``),
    ``--num-samples`` for DLRM."""
    if args.model == "tbsm":
        return ["--num-users", str(args.num_users)]
    return ["--num-samples", str(args.num_samples)]


def launcher(world_size: int) -> list[str]:
    """The command that starts ``world_size`` ranks of a script."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    if world_size == 1:
        return [sys.executable]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(world_size),
    ]


def run_example(
    args: Sequence[str],
    out: str | Path,
    world_size: int = 1,
    model: str = "dlrm",
    threads: int | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """Train ``model``'s example with ``args`` on ``world_size`` ranks, writing to ``out``; its metrics.
    ``threads`` caps each rank's intra-op threads (``OMP_NUM_THREADS``), for runs side by side; ``env``
    is the example's environment (by default this process's).

    Raises ``RuntimeError`` with the tail of the example's stderr when it fails.
    """
    out = Path(out)
    command = [*launcher(world_size), str(EXAMPLES[model]), *args, "--out", str(out)]
    env = dict(os.environ if env is None else env)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    run = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if run.returncode != 0:
        tail = "\n".join(run.stderr.splitlines()[-ERROR_TAIL_LINES:])
        raise RuntimeError(f"{' '.join(command)} failed with exit status {run.returncode}:\n{tail}")
    return json.loads((out / "metrics.json").read_text())
