"""The data a benchmark profiles as FAE does: the model whose data options a command line takes, the
data in words, and a profile of the training inputs that tells which of them it sampled."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fae_torchrec import AccessProfiler, AccessStats
from fae_torchrec.command_line import model_chooser
from fae_torchrec.data import SampleBlock
from fae_torchrec.data.source import BlockSource

#: Synthetic TBSM users by default (``bench_train.py``'s default).
NUM_USERS = 50_000


def model_parser(
    argv: list[str] | None, description: str, default: str
) -> tuple[argparse.ArgumentParser, str]:
    """A parser with ``--model`` and the model ``argv`` names (``model_chooser``): the caller adds that
    model's data options."""
    chooser, model = model_chooser(argv, default)
    return argparse.ArgumentParser(description=description, parents=[chooser]), model


def describe(args: argparse.Namespace, source: BlockSource) -> str:
    """The data of ``args`` (``--model``, ``--data`` and its size option) and ``source`` in words."""
    if args.data[0] != "synthetic":
        data = " ".join(Path(item).name for item in args.data)
    elif args.model == "tbsm":
        data = f"{args.num_users:,} synthetic users"
    else:
        data = f"{args.num_samples:,} synthetic inputs"
    rows = [config.num_embeddings for config in source.table_configs()]
    return f"{args.model.upper()}, {data}, {len(rows)} tables of {sum(rows):,} rows"


def profile_training(
    profiler: AccessProfiler, blocks: Iterable[SampleBlock], feature_names: Sequence[str]
) -> tuple[AccessStats, SampleBlock, np.ndarray]:
    """Profile the training inputs ``blocks``: the statistics, the inputs the profile did not sample (in
    order) and the mask of those it sampled."""
    unprofiled, sampled = [], []
    for block in tqdm(blocks, desc="profiling", unit="block"):
        mask = profiler.update(block.feature_ids(feature_names))
        unprofiled.append(block.select(~mask))
        sampled.append(mask)
    return profiler.stats(), SampleBlock.concat(unprofiled), np.concatenate(sampled)
