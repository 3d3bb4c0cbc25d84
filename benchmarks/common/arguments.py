"""Command-line values the benchmark scripts share."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from benchmarks.common.example_runs import EXAMPLES


def fail(message: str) -> NoReturn:
    """Stop on bad input as argparse does: ``error: message`` on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The example's options that a training benchmark gives both modes alike: the model, data size,
    tables, batch, FAE's budget and order, seed."""
    parser.add_argument("--model", choices=sorted(EXAMPLES), default="dlrm", help="the model, by its example")
    parser.add_argument("--num-samples", type=int, default=2_000_000, help="synthetic inputs (DLRM)")
    parser.add_argument("--num-users", type=int, default=50_000, help="synthetic users (TBSM)")
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's (TBSM's) x scale")
    parser.add_argument("--dim", type=int, default=16, help="embedding dimension")
    parser.add_argument("--batch-size", type=int, default=2048, help="per-rank batch size")
    parser.add_argument("--budget", default="16MiB", help="FAE's hot-row budget")
    parser.add_argument("--order", default="stream", help="FAE's hot/cold step order")
    parser.add_argument("--seed", type=int, default=0)


def training_options(args: argparse.Namespace) -> list[str]:
    """The example's options of ``add_training_options`` but the data size, for both modes alike, with
    ``--exclude-profiled``: no figure comes from the inputs that chose the hot set."""
    return [
        "--scale", str(args.scale), "--dim", str(args.dim), "--batch-size", str(args.batch_size),
        "--budget", args.budget, "--order", args.order, "--seed", str(args.seed), "--exclude-profiled",
    ]  # fmt: skip
