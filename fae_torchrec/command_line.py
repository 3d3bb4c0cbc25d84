"""What the command lines need to build their parsers, importing neither torch nor TorchRec, so that
``--help`` answers at once: the data options every command takes (``fae_torchrec.recipes.sources`` opens
what they name), the names of the choices the commands offer (embedding optimizers, cache algorithms,
step orders, train pipelines) and the help formatter that shows every default."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from enum import StrEnum

from fae_torchrec.arguments import fraction, non_negative_int, positive_float, positive_int, share

#: FAE's profiled fraction of the training inputs, per model whose data a command line reads (DLRM's
#: Criteo layout, TBSM's Taobao layout): the ``--sample`` defaults of the examples and of ``profile``.
PROFILE_SAMPLE = {"dlrm": 0.05, "tbsm": 0.2}
#: The named Criteo table sets (``fae_torchrec.data.criteo.TABLE_SETS``) ``--tables`` takes.
TABLE_SET_NAMES = ("kaggle", "terabyte", "terabyte-40m")
#: TBSM's Taobao samples (``fae_torchrec.data.taobao``): past events a sample, training samples a user,
#: share of users (the last active) held out for validation.
TS_LENGTH = 20
POINTS_PER_USER = 10
TEST_SHARE = 0.3
#: The embedding optimizers by their command-line names (``fae_torchrec.train.optimizers``).
OPTIMIZER_NAMES = ("sgd", "adagrad", "rowwise_adagrad", "adam")
#: FBGEMM's cache replacement policies by their command-line names (``CacheAlgorithm.LRU``, ``.LFU``).
CACHE_ALGORITHM_NAMES = ("lru", "lfu")


class Order(StrEnum):
    """The orders of hot and cold steps (``fae_torchrec.train.schedule``)."""

    STREAM = "stream"
    TIME = "time"
    SHUFFLED = "shuffled"
    PHASES = "phases"
    ADAPTIVE = "adaptive"


ORDERS = tuple(Order)
#: The orders that follow the data's own order: they take a warm-up.
STREAM_ORDERS = (Order.STREAM, Order.TIME)


class Pipeline(StrEnum):
    """``StepRunner``'s kinds: TorchRec's train pipeline, its prefetch pipeline (CUDA), or a plain loop."""

    SPARSE = "sparse"
    PREFETCH = "prefetch"
    NONE = "none"


PIPELINES = tuple(Pipeline)


class ColdTier(StrEnum):
    """FAE's cold tiers: TorchRec/FBGEMM's UVM caches, or host rows in slots filled by the epoch's plan."""

    CACHING = "caching"
    PLANNED = "planned"


COLD_TIERS = tuple(ColdTier)


class Baseline(StrEnum):
    """The baselines ``--baseline`` names, each planned by its ``planner.baseline`` planner."""

    TORCHREC = "torchrec"
    SCALEUP = "scaleup"
    HBM = "hbm"


BASELINES = tuple(Baseline)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, where it has one and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return text
        if "default" in text:
            return text
        return super()._get_help_string(action) or text


def model_chooser(argv: Sequence[str] | None, default: str) -> tuple[argparse.ArgumentParser, str]:
    """A parent parser with ``--model`` (one of ``PROFILE_SAMPLE``'s) and the model ``argv`` names,
    ``default`` when none: the caller adds that model's data options (``add_data_arguments`` or
    ``add_taobao_arguments``, which share names such as ``--scale``, so one parser cannot hold both)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument(
        "--model",
        choices=sorted(PROFILE_SAMPLE),
        default=default,
        help=f"whose data: dlrm (Criteo layout) or tbsm (Taobao layout); its data options follow (default "
        f"{default})",
    )
    return chooser, chooser.parse_known_args(argv)[0].model


def add_data_arguments(parser: argparse.ArgumentParser, num_samples: int, scale: float) -> None:
    """The options of :func:`open_source`."""
    _add_data_option(
        parser,
        "synthetic (built-in, default), criteo-tsv FILE..., criteo-npy PREFIX... "
        "(PREFIX_dense.npy, PREFIX_sparse.npy, PREFIX_labels.npy), or parquet FILE... or csv FILE... "
        "with --schema",
    )
    parser.add_argument(
        "--schema",
        metavar="TOML",
        help="parquet and csv data: the label, dense and sparse columns and their tables (docs/data.md)",
    )
    parser.add_argument("--num-samples", type=positive_int, default=num_samples, help="synthetic inputs")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="synthetic data seed")
    parser.add_argument("--ids-per-feature", type=positive_int, default=1, help="synthetic multi-hot")
    parser.add_argument(
        "--label-gap",
        type=float,
        default=0.0,
        help="synthetic: logit added to inputs whose every id is among its table's 10,000 most popular "
        "rows (the inputs FAE makes hot click at another rate, as on real Criteo rows; default 0)",
    )
    parser.add_argument(
        "--days", type=positive_int, default=1, help="synthetic: days the inputs span, in order"
    )
    parser.add_argument(
        "--drift",
        type=share,
        default=0.0,
        help="synthetic: share of each table's rows its popularity rotates by a day (default 0: stationary)",
    )
    parser.add_argument(
        "--tables",
        metavar="|".join(TABLE_SET_NAMES) + "|FILE",
        help="table sizes: Criteo Kaggle's (kaggle), TorchRec's Criteo Terabyte sizes (terabyte), the "
        "same capped at MLPerf's 40M rows (terabyte-40m), or a FILE of 26 sizes; default: terabyte "
        "when every criteo-tsv/criteo-npy path is named day_N (a Terabyte day), else kaggle (not with "
        "parquet or csv, whose tables are --schema's)",
    )
    parser.add_argument(
        "--scale", type=positive_float, help=f"table sizes = the --tables sizes x scale (default {scale})"
    )
    parser.set_defaults(criteo_scale=scale)


def add_taobao_arguments(parser: argparse.ArgumentParser, num_users: int, scale: float) -> None:
    """The options of :func:`open_taobao_source`; synthetic tables are scaled by ``scale`` unless
    ``--scale`` is given."""
    _add_data_option(
        parser, "synthetic (built-in Taobao-like events, default) or taobao-csv FILE... (UserBehavior.csv)"
    )
    parser.add_argument("--num-users", type=positive_int, default=num_users, help="synthetic users")
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="synthetic events and the sample draws"
    )
    parser.add_argument(
        "--tables",
        metavar="reference|FILE",
        help="synthetic table sizes (users, items, categories, padding row not counted): the TBSM "
        "reference run's (reference, default) or a FILE of 3 sizes",
    )
    parser.add_argument(
        "--scale",
        type=positive_float,
        help=f"synthetic table sizes = --tables x scale (default {scale}; not with taobao-csv)",
    )
    parser.set_defaults(synthetic_scale=scale)
    parser.add_argument("--ts-length", type=positive_int, default=TS_LENGTH, help="past events a sample")
    parser.add_argument(
        "--points-per-user", type=positive_int, default=POINTS_PER_USER, help="training samples a user"
    )
    parser.add_argument(
        "--test-share",
        type=fraction,
        default=TEST_SHARE,
        help="share of users (the last active) held out for validation, below 1",
    )


def _add_data_option(parser: argparse.ArgumentParser, kinds_help: str) -> None:
    parser.add_argument("--data", nargs="+", default=["synthetic"], metavar="SOURCE", help=kinds_help)
