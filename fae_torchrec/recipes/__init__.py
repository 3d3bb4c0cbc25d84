"""The training recipe the examples run: a model family (``family``: DLRM, TBSM) trained with FAE or a
TorchRec baseline as one ``RecipeConfig`` says (``config``; from the command line, ``options``), built in
TorchRec's order (``build``: data, planner, DMP, optimizers, router) and trained with evaluations,
checkpoints and outputs (``loop``). A trainer of its own calls it without a command line::

    from fae_torchrec.recipes import DLRM, recipe_config, train

    metrics = train(DLRM, recipe_config(DLRM, num_samples=20_000, budget="64KiB", out="runs/mine"))

The command line is parsed before torch is imported, so that ``--help`` and a bad option answer at once;
``build``'s and ``loop``'s names are imported where first used."""

import importlib

from fae_torchrec.recipes.config import RecipeConfig
from fae_torchrec.recipes.family import DLRM, FAMILIES, TBSM, ModelFamily
from fae_torchrec.recipes.options import parse_args, recipe_config

__all__ = [
    "DLRM",
    "FAMILIES",
    "TBSM",
    "ModelFamily",
    "RecipeConfig",
    "Training",
    "build_training",
    "init_distributed",
    "main",
    "parse_args",
    "recipe_config",
    "run",
    "train",
]


def main(family: ModelFamily, argv: list[str] | None = None) -> dict:
    """Train ``family`` as the command line ``argv`` says (``sys.argv`` when None); the run's metrics."""
    args = parse_args(family, argv)  # --help and bad options exit here, before torch loads
    from fae_torchrec.recipes.loop import train

    return train(family, args)


def run(family: ModelFamily) -> None:
    """The command: train ``family``; a bad option, file or plan exits with status 2 and says why."""
    args = parse_args(family)
    from fae_torchrec.recipes.loop import run_parsed

    run_parsed(family, args)


def __getattr__(name: str):
    """``build``'s names and ``loop``'s ``train``, imported (with torch) when first used."""
    if name in ("Training", "build_training", "init_distributed"):
        return getattr(importlib.import_module("fae_torchrec.recipes.build"), name)
    if name == "train":
        return importlib.import_module("fae_torchrec.recipes.loop").train
    raise AttributeError(f"module 'fae_torchrec.recipes' has no attribute {name!r}")
