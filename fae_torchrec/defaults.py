"""One set of defaults for ``fae-torchrec profile``, ``fae-torchrec plan`` and the training examples, so that
the statistics ``profile`` writes, the plan ``plan`` makes from them and the run that trains on both are of
the same data, tables and optimizer unless an option says otherwise.

They are the examples' defaults: a built-in synthetic data set and tables small enough to train on a CPU in
minutes (``--scale`` 0.02 of Criteo Kaggle's rows for DLRM). A run on real data gives every command the
same ``--scale`` (1.0 for the full tables) and ``--budget``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from fae_torchrec.arguments import int_at_least
from fae_torchrec.command_line import PROFILE_SAMPLE


@dataclass(frozen=True)
class Defaults:
    """A model family's defaults for every command.

    Attributes:
        inputs: synthetic inputs (DLRM's ``--num-samples``) or users (TBSM's ``--num-users``).
        scale: table sizes times this (``--scale``).
        batch_size: per-rank batch size (``--batch-size``), what the planner plans for.
        budget: hot-row budget (``--budget``), rows counted with their ``optimizer`` state.
        optimizer: embedding optimizer (``--optimizer``).
        dim: embedding dimension (``--dim``).
        sample: profiled fraction of the training inputs (``--sample``), FAE's for the model.
        val_every: every N-th input held out for validation (DLRM's ``--val-every``; TBSM holds out its
            last users instead), also left out of the profile.
    """

    inputs: int
    scale: float
    batch_size: int
    budget: str
    optimizer: str
    dim: int
    sample: float
    val_every: int | None = None

    def options(self) -> dict:
        """The defaults of the options every command shares, by their ``argparse`` names."""
        chosen = asdict(self)
        return {key: chosen[key] for key in ("batch_size", "budget", "optimizer", "dim", "sample")}


#: The defaults of each model family by its ``--model`` name.
DEFAULTS = {
    "dlrm": Defaults(
        inputs=300_000,
        scale=0.02,
        batch_size=512,
        budget="256KiB",
        optimizer="rowwise_adagrad",
        dim=16,
        sample=PROFILE_SAMPLE["dlrm"],
        val_every=10,
    ),
    "tbsm": Defaults(
        inputs=20_000,
        scale=0.01,
        batch_size=256,
        budget="2MiB",
        optimizer="rowwise_adagrad",
        dim=16,
        sample=PROFILE_SAMPLE["tbsm"],
    ),
}


def add_val_every_argument(parser: argparse.ArgumentParser) -> None:
    """DLRM's ``--val-every``: the inputs the example holds out for validation, which ``profile`` leaves
    out too, so that its statistics count the inputs the example trains on."""
    parser.add_argument(
        "--val-every",
        type=int_at_least(2, " (1 would hold out every input, leaving none to train on)"),
        default=DEFAULTS["dlrm"].val_every,
        help="hold out every N-th input (N >= 2) for validation, not profiled",
    )
