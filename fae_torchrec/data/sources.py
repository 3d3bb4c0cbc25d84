"""One way to name a data source on a command line: ``synthetic``, ``criteo-tsv PATH...`` or
``criteo-npy PREFIX...``, with the options the command gives."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence

from fae_torchrec.arguments import non_negative_int, positive_float, positive_int
from fae_torchrec.data.criteo import TABLE_SETS, CriteoSource, table_sizes
from fae_torchrec.data.criteo_npy import CriteoNpyReader
from fae_torchrec.data.criteo_tsv import CriteoTsvReader
from fae_torchrec.data.synthetic import SyntheticCriteo

DATA_KINDS = ("synthetic", "criteo-tsv", "criteo-npy")
#: A Criteo Terabyte day as Criteo names it: ``day_0`` .. ``day_23`` (an npy prefix or a TSV file).
_TERABYTE_DAY = re.compile(r"^day_\d+$")


def add_data_arguments(parser: argparse.ArgumentParser, num_samples: int, scale: float) -> None:
    """The options of :func:`open_source`."""
    parser.add_argument(
        "--data",
        nargs="+",
        default=["synthetic"],
        metavar="SOURCE",
        help="synthetic (built-in, default), criteo-tsv FILE..., or criteo-npy PREFIX... "
        "(PREFIX_dense.npy, PREFIX_sparse.npy, PREFIX_labels.npy)",
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
        "--tables",
        metavar="|".join(TABLE_SETS) + "|FILE",
        help="table sizes: Criteo Kaggle's (kaggle), TorchRec's Criteo Terabyte sizes (terabyte), the "
        "same capped at MLPerf's 40M rows (terabyte-40m), or a FILE of 26 sizes; default: terabyte "
        "when every criteo-tsv/criteo-npy path is named day_N (a Terabyte day), else kaggle",
    )
    parser.add_argument(
        "--scale", type=positive_float, default=scale, help="table sizes = the --tables sizes x scale"
    )


def default_tables(data: Sequence[str]) -> str:
    """The table set for ``--data`` when ``--tables`` is not given: ``terabyte`` when every path of
    criteo-tsv or criteo-npy is named ``day_N`` (how Criteo names the Terabyte days), else ``kaggle``."""
    kind, paths = data[0], data[1:]
    names = [os.path.basename(os.path.normpath(p)) for p in paths]
    if kind != "synthetic" and names and all(_TERABYTE_DAY.match(name) for name in names):
        return "terabyte"
    return "kaggle"


def chosen_table_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    """Rows per table: ``--tables`` (or its default for ``--data``) times ``--scale``."""
    tables = args.tables or default_tables(args.data)
    try:
        return table_sizes(tables, args.scale)
    except ValueError as error:
        option = "--tables" if tables not in TABLE_SETS else "--scale"
        raise ValueError(f"{option}: {error}") from error


def open_source(
    args: argparse.Namespace, batch_size: int, require_labels: bool = False
) -> tuple[CriteoSource, int | None]:
    """The source ``args.data`` names and how many batches it has (None when unknown).

    Tables are ``--tables`` times ``--scale`` (:func:`chosen_table_sizes`); the source's
    ``table_configs`` match them. With ``require_labels`` (training, evaluation) unlabelled Criteo
    files are refused. Raises ``ValueError`` naming the problem for an unknown kind, a missing path or
    file, or bad table sizes.
    """
    kind, paths = args.data[0], args.data[1:]
    if kind not in DATA_KINDS:
        raise ValueError(f"--data: unknown kind {kind!r}; choose from {', '.join(DATA_KINDS)}")
    if (kind == "synthetic") != (not paths):
        raise ValueError(f"--data {kind}: " + ("takes no path" if paths else "needs a path"))
    sizes = chosen_table_sizes(args)
    if kind == "synthetic":
        data = SyntheticCriteo(
            args.num_samples,
            batch_size,
            scale=1.0,
            seed=args.seed,
            ids_per_feature=args.ids_per_feature,
            table_sizes=sizes,
            label_gap=args.label_gap,
        )
        return data, len(data)
    if kind == "criteo-tsv":
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            what = "a directory, not a file" if os.path.isdir(missing[0]) else "no such file"
            raise ValueError(f"--data criteo-tsv: {what}: {missing[0]}")
        return CriteoTsvReader(paths, batch_size, sizes, require_labels=require_labels), None
    try:
        reader = CriteoNpyReader(paths, batch_size, sizes, require_labels=require_labels)
    except OSError as error:
        raise ValueError(f"--data criteo-npy: {error}") from error
    return reader, -(-reader.num_samples // batch_size)
