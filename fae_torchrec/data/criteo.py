"""Criteo's layout: 13 dense and 26 categorical features, table sizes, and TorchRec table configs."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
from torchrec.datasets.criteo import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    INT_FEATURE_COUNT,
)
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.data.block import SampleBlock, check_batch_size, rebatch

#: Rows per categorical feature of Criteo Kaggle as used by DLRM and TorchRec (33,762,577 in all).
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

__all__ = [
    "CAT_FEATURE_COUNT",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_INT_NAMES",
    "INT_FEATURE_COUNT",
    "KAGGLE_TABLE_SIZES",
    "CriteoSource",
    "criteo_table_configs",
    "scaled_table_sizes",
    "single_hot_block",
]


def scaled_table_sizes(scale: float, sizes: Sequence[int] = KAGGLE_TABLE_SIZES) -> tuple[int, ...]:
    """``sizes`` times ``scale``, rounded, at least one row per table."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    return tuple(int(s) for s in np.maximum(1, np.rint(np.asarray(sizes) * scale)).astype(np.int64))


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


class CriteoSource:
    """Base of the data sources: ``raw_blocks`` as produced, re-cut into ``Batch``es of
    ``batch_size`` inputs with one key per categorical feature (``cat_0`` .. ``cat_25``)."""

    def __init__(self, batch_size: int, table_sizes: Sequence[int]) -> None:
        check_batch_size(batch_size)
        _check_table_sizes(table_sizes)
        self.batch_size = batch_size
        self.table_sizes = tuple(int(s) for s in table_sizes)

    def table_configs(self, embedding_dim: int = 16) -> list[EmbeddingBagConfig]:
        """TorchRec table configs matching the ids this source yields."""
        return criteo_table_configs(self.table_sizes, embedding_dim)

    def raw_blocks(self) -> Iterator[SampleBlock]:
        raise NotImplementedError

    def blocks(self) -> Iterator[SampleBlock]:
        """The data as blocks of ``batch_size`` inputs (the last one may be smaller)."""
        return rebatch(self.raw_blocks(), self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return (block.to_batch(DEFAULT_CAT_NAMES) for block in self.blocks())


def as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """One path or several, as a list of strings."""
    return [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else [os.fspath(p) for p in paths]
