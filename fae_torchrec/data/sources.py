"""One way to name a data source on a command line: ``synthetic``, ``criteo-tsv PATH...`` or
``criteo-npy PREFIX...``, with the options the command gives."""

from __future__ import annotations

import argparse
import os

from fae_torchrec.data.criteo import CriteoSource, scaled_table_sizes
from fae_torchrec.data.criteo_npy import CriteoNpyReader
from fae_torchrec.data.criteo_tsv import CriteoTsvReader
from fae_torchrec.data.synthetic import SyntheticCriteo

DATA_KINDS = ("synthetic", "criteo-tsv", "criteo-npy")


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
    parser.add_argument("--num-samples", type=int, default=num_samples, help="synthetic inputs")
    parser.add_argument("--seed", type=int, default=0, help="synthetic data seed")
    parser.add_argument("--ids-per-feature", type=int, default=1, help="synthetic multi-hot")
    parser.add_argument("--scale", type=float, default=scale, help="table sizes = Criteo Kaggle's x scale")


def open_source(args: argparse.Namespace, batch_size: int) -> tuple[CriteoSource, int | None]:
    """The source ``args.data`` names and how many batches it has (None when unknown).

    Raises ``ValueError`` naming the problem for an unknown kind, a missing path or file.
    """
    kind, paths = args.data[0], args.data[1:]
    if kind not in DATA_KINDS:
        raise ValueError(f"--data: unknown kind {kind!r}; choose from {', '.join(DATA_KINDS)}")
    if (kind == "synthetic") != (not paths):
        raise ValueError(f"--data {kind}: " + ("takes no path" if paths else "needs a path"))
    sizes = scaled_table_sizes(args.scale)
    if kind == "synthetic":
        data = SyntheticCriteo(
            args.num_samples,
            batch_size,
            scale=args.scale,
            seed=args.seed,
            ids_per_feature=args.ids_per_feature,
        )
        return data, len(data)
    if kind == "criteo-tsv":
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise ValueError(f"--data criteo-tsv: no such file: {missing[0]}")
        return CriteoTsvReader(paths, batch_size, sizes), None
    reader = CriteoNpyReader(paths, batch_size, sizes)
    return reader, -(-reader.num_samples // batch_size)
