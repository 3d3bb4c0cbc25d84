"""One way to name a data source on a command line: ``synthetic``, ``criteo-tsv PATH...`` or
``criteo-npy PREFIX...`` for Criteo's layout, ``parquet FILE...`` or ``csv FILE...`` with ``--schema`` for
any click log's, ``synthetic`` or ``taobao-csv FILE...`` for TBSM's Taobao layout, with the options the
command gives."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence

from fae_torchrec.data.columnar import ColumnarSource
from fae_torchrec.data.columnar_files import FORMATS
from fae_torchrec.data.criteo import (
    TABLE_SETS,
    read_table_sizes,
    scaled_table_sizes,
    table_sizes,
)
from fae_torchrec.data.criteo_npy import CriteoNpyReader
from fae_torchrec.data.criteo_tsv import CriteoTsvReader
from fae_torchrec.data.paths import file_problem
from fae_torchrec.data.schema import load_schema
from fae_torchrec.data.source import BlockSource
from fae_torchrec.data.synthetic import SyntheticCriteo
from fae_torchrec.data.synthetic_taobao import SyntheticTaobao
from fae_torchrec.data.taobao import REFERENCE_TABLE_SIZES, TABLES, TaobaoSource
from fae_torchrec.data.taobao_csv import TaobaoCsvReader
from fae_torchrec.recipes.config import RecipeConfig, required

#: What a source is opened from: a run's config, or the parsed options of a command (profile, plan).
DataOptions = RecipeConfig | argparse.Namespace
DATA_KINDS = ("synthetic", "criteo-tsv", "criteo-npy", *FORMATS)
TAOBAO_DATA_KINDS = ("synthetic", "taobao-csv")
#: A Criteo Terabyte day as Criteo names it: ``day_0`` .. ``day_23`` (an npy prefix or a TSV file).
_TERABYTE_DAY = re.compile(r"^day_\d+$")


def default_tables(data: Sequence[str]) -> str:
    """The table set for ``--data`` when ``--tables`` is not given: ``terabyte`` when every path of
    criteo-tsv or criteo-npy is named ``day_N`` (how Criteo names the Terabyte days), else ``kaggle``."""
    kind, paths = data[0], data[1:]
    names = [os.path.basename(os.path.normpath(p)) for p in paths]
    if kind != "synthetic" and names and all(_TERABYTE_DAY.match(name) for name in names):
        return "terabyte"
    return "kaggle"


def chosen_table_sizes(args: DataOptions) -> tuple[int, ...]:
    """Rows per table: ``--tables`` (or its default for ``--data``) times ``--scale``."""
    tables = args.tables or default_tables(args.data)
    try:
        return table_sizes(
            tables, required(args.criteo_scale if args.scale is None else args.scale, "--scale")
        )
    except ValueError as error:
        option = "--tables" if tables not in TABLE_SETS else "--scale"
        raise ValueError(f"{option}: {error}") from error


def open_source(
    args: DataOptions, batch_size: int, require_labels: bool = False
) -> tuple[BlockSource, int | None]:
    """The source ``args.data`` names and how many batches it has (None when unknown).

    Criteo-layout tables are ``--tables`` times ``--scale`` (:func:`chosen_table_sizes`), parquet and
    csv tables ``--schema``'s (or counted from the data); the source's ``table_configs`` match them.
    With ``require_labels`` (training, evaluation) unlabelled Criteo files are refused. Raises
    ``ValueError`` naming the problem for an unknown kind, a missing path or file, a bad schema or
    file, an option that does not apply, or bad table sizes.
    """
    kind, paths = _kind_and_paths(args.data, DATA_KINDS)
    if kind in FORMATS:
        return _columnar_source(args, kind, paths, batch_size), None
    if args.schema is not None:
        raise ValueError(
            f"--schema: only with --data {' or '.join(FORMATS)} (--data {kind} has its own layout)"
        )
    sizes = chosen_table_sizes(args)
    if kind == "synthetic":
        data = SyntheticCriteo(
            required(args.num_samples, "--num-samples"),
            batch_size,
            scale=1.0,
            seed=args.seed,
            ids_per_feature=required(args.ids_per_feature, "--ids-per-feature"),
            table_sizes=sizes,
            label_gap=required(args.label_gap, "--label-gap"),
            days=required(args.days, "--days"),
            drift=required(args.drift, "--drift"),
        )
        return data, len(data)
    if kind == "criteo-tsv":
        _check_files(kind, paths)
        return CriteoTsvReader(paths, batch_size, sizes, require_labels=require_labels), None
    try:
        reader = CriteoNpyReader(paths, batch_size, sizes, require_labels=require_labels)
    except OSError as error:
        raise ValueError(f"--data criteo-npy: {error}") from error
    return reader, -(-reader.num_samples // batch_size)


def _columnar_source(args: DataOptions, kind: str, paths: Sequence[str], batch_size: int) -> ColumnarSource:
    """``--data parquet|csv FILE...`` read as ``--schema`` says."""
    _refuse_table_options(args, f"not with --data {kind}, whose tables --schema gives (or counts)")
    if args.schema is None:
        raise ValueError(f"--data {kind}: needs --schema TOML naming its columns (docs/data.md)")
    _check_files(kind, paths)
    return ColumnarSource(kind, paths, load_schema(args.schema), batch_size)


def open_taobao_source(args: DataOptions, batch_size: int) -> TaobaoSource:
    """The TBSM Taobao source ``args.data`` names, its samples built.

    Raises ``ValueError`` naming the option for an unknown kind, a missing or extra path, a missing
    file, ``--tables`` or ``--scale`` with read data (whose tables are its distinct ids), bad table sizes
    or ``--test-share 1``.
    """
    kind, paths = _kind_and_paths(args.data, TAOBAO_DATA_KINDS)
    test_share = required(args.test_share, "--test-share")
    if test_share >= 1:
        raise ValueError(f"--test-share: must be below 1 (some users must train), got {test_share}")
    ts_length = required(args.ts_length, "--ts-length")
    points_per_user = required(args.points_per_user, "--points-per-user")
    if kind == "taobao-csv":
        _refuse_table_options(args, "synthetic data only (taobao-csv's tables are its distinct ids)")
        _check_files(kind, paths)
        return TaobaoCsvReader(paths, batch_size, ts_length, points_per_user, test_share, args.seed)
    try:
        sizes = (
            REFERENCE_TABLE_SIZES
            if args.tables in (None, "reference")
            else read_table_sizes(args.tables, len(TABLES), ", ".join(TABLES))
        )
    except ValueError as error:
        raise ValueError(f"--tables: {error}") from error
    scale = required(args.synthetic_scale if args.scale is None else args.scale, "--scale")
    try:
        sizes = scaled_table_sizes(scale, sizes)
    except ValueError as error:
        raise ValueError(f"--scale: {error}") from error
    return SyntheticTaobao(
        required(args.num_users, "--num-users"), batch_size, table_sizes=sizes, seed=args.seed,
        ts_length=ts_length, points_per_user=points_per_user, test_share=test_share,
    )  # fmt: skip


def _kind_and_paths(data: Sequence[str], kinds: Sequence[str]) -> tuple[str, list[str]]:
    """``--data``'s kind, one of ``kinds``, and its paths: none for ``synthetic``, some for the others."""
    kind, paths = data[0], list(data[1:])
    if kind not in kinds:
        raise ValueError(f"--data: unknown kind {kind!r}; choose from {', '.join(kinds)}")
    if (kind == "synthetic") != (not paths):
        raise ValueError(f"--data {kind}: " + ("takes no path" if paths else "needs a path"))
    return kind, paths


def _refuse_table_options(args: DataOptions, why: str) -> None:
    """Refuse ``--tables`` or ``--scale``, given for data whose tables they do not set, saying ``why``."""
    for option, value in (("--tables", args.tables), ("--scale", args.scale)):
        if value is not None:
            raise ValueError(f"{option}: {why}")


def _check_files(kind: str, paths: Sequence[str]) -> None:
    """Refuse a path of ``--data kind`` that is not a readable regular file, naming it and why."""
    for path in paths:
        problem = file_problem(path)
        if problem is not None:
            raise ValueError(f"--data {kind}: {problem}: {path}")
