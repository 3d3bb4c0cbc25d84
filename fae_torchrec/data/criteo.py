"""Criteo's layout: 13 dense and 26 categorical features, table sizes, and TorchRec table configs."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from torchrec.datasets.criteo import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    INT_FEATURE_COUNT,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.source import BlockSource

#: Inputs (lines) of Criteo Kaggle's ``train.txt``: one epoch.
KAGGLE_INPUTS = 45_840_617
#: Rows per categorical feature of Criteo Kaggle as used by DLRM and TorchRec (33,762,577 in all).
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

#: Rows per categorical feature of Criteo Terabyte (1TB Click Logs) as TorchRec's DLRM uses them
#: (``torchrec/inference/dlrm_packager.py``, ``--num_embeddings_per_feature``; 177,944,275 in all).
TERABYTE_TABLE_SIZES: tuple[int, ...] = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)  # fmt: skip
#: MLPerf's DLRM cap on the rows of a Terabyte table (``--max-ind-range 40000000``).
MLPERF_MAX_ROWS = 40_000_000
#: Table sets by name: Kaggle's, Terabyte's, and Terabyte's capped at MLPerf's 40M rows.
TABLE_SETS: dict[str, tuple[int, ...]] = {
    "kaggle": KAGGLE_TABLE_SIZES,
    "terabyte": TERABYTE_TABLE_SIZES,
    "terabyte-40m": tuple(min(s, MLPERF_MAX_ROWS) for s in TERABYTE_TABLE_SIZES),
}
#: Largest table the sizes may reach after scaling (the ids are int64).
_MAX_ROWS = 2**62

__all__ = [
    "CAT_FEATURE_COUNT",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_INT_NAMES",
    "INT_FEATURE_COUNT",
    "KAGGLE_INPUTS",
    "KAGGLE_TABLE_SIZES",
    "MLPERF_MAX_ROWS",
    "TABLE_SETS",
    "TERABYTE_TABLE_SIZES",
    "CriteoSource",
    "criteo_table_configs",
    "read_table_sizes",
    "scaled_table_sizes",
    "single_hot_block",
    "table_sizes",
]


def scaled_table_sizes(scale: float, sizes: Sequence[int] = KAGGLE_TABLE_SIZES) -> tuple[int, ...]:
    """``sizes`` times ``scale``, rounded, at least one row per table."""
    if not 0 < scale < float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    scaled = np.maximum(1.0, np.rint(np.asarray(sizes, dtype=np.float64) * scale))
    if scaled.max(initial=1.0) > _MAX_ROWS:
        raise ValueError(f"scale {scale} makes a table of {scaled.max():.3g} rows (at most {_MAX_ROWS:,})")
    return tuple(int(s) for s in scaled.astype(np.int64))


def read_table_sizes(
    path: str | os.PathLike, count: int = CAT_FEATURE_COUNT, tables: str = "C1..C26"
) -> tuple[int, ...]:
    """Table sizes from a text file: ``count`` positive integers (those of ``tables``, as the error
    names them) separated by commas, spaces or newlines (``#`` starts a comment). Raises ``ValueError``
    naming the file and the first bad entry."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read table sizes: {error}") from error
    entries = [
        (number, word)
        for number, line in enumerate(text.splitlines(), start=1)
        for word in line.split("#", 1)[0].replace(",", " ").split()
    ]
    for number, word in entries:
        if not word.isdigit() or not 0 < int(word) <= _MAX_ROWS:
            raise ValueError(f"{path}:{number}: {word!r} is not a table size (a positive integer)")
    if len(entries) != count:
        raise ValueError(f"{path}: {len(entries)} table sizes, expected {count} ({tables})")
    return tuple(int(word) for _, word in entries)


def table_sizes(tables: str, scale: float = 1.0) -> tuple[int, ...]:
    """The sizes of a named table set (``TABLE_SETS``) or of a sizes file, times ``scale``."""
    sizes = TABLE_SETS[tables] if tables in TABLE_SETS else read_table_sizes(tables)
    return scaled_table_sizes(scale, sizes)


def _check_table_sizes(table_sizes: Sequence[int]) -> None:
    if len(table_sizes) != CAT_FEATURE_COUNT:
        raise ValueError(f"expected {CAT_FEATURE_COUNT} table sizes, got {len(table_sizes)}")


def criteo_table_configs(
    table_sizes: Sequence[int] = KAGGLE_TABLE_SIZES, embedding_dim: int = 16
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per categorical feature, named as TorchRec's DLRM examples do."""
    _check_table_sizes(table_sizes)
    return [
        EmbeddingBagConfig(
            name=f"t_{feature}",
            embedding_dim=embedding_dim,
            num_embeddings=int(size),
            feature_names=[feature],
        )
        for feature, size in zip(DEFAULT_CAT_NAMES, table_sizes, strict=True)
    ]


def single_hot_block(
    dense: np.ndarray, raw_ids: np.ndarray, labels: np.ndarray, table_sizes: Sequence[int]
) -> SampleBlock:
    """A block of one id per feature from raw Criteo columns: raw categorical values (``(n, 26)``)
    become rows modulo each table's size, as TorchRec's readers hash them."""
    return SampleBlock(
        dense=np.array(dense, dtype=np.float32),
        ids=raw_ids % np.asarray(table_sizes, dtype=np.int64),
        labels=np.array(labels, dtype=np.int32).reshape(-1),
        ids_per_feature=(1,) * CAT_FEATURE_COUNT,
    )


class CriteoSource(BlockSource):
    """Base of the Criteo sources: ``Batch``es with 13 dense features, one key per categorical feature
    (``cat_0`` .. ``cat_25``) and one table per feature."""

    num_dense = INT_FEATURE_COUNT

    def __init__(self, batch_size: int, table_sizes: Sequence[int]) -> None:
        super().__init__(batch_size, DEFAULT_CAT_NAMES)
        _check_table_sizes(table_sizes)
        self.table_sizes = tuple(int(s) for s in table_sizes)

    def table_configs(self, embedding_dim: int = 16) -> list[EmbeddingBagConfig]:
        return criteo_table_configs(self.table_sizes, embedding_dim)
