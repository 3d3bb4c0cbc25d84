"""Criteo's layout: 13 dense and 26 categorical features, table sizes, and TorchRec table configs."""

from __future__ import annotations

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
    "criteo_table_configs",
    "hash_to_rows",
    "scaled_table_sizes",
    "single_hot_block",
]


def scaled_table_sizes(scale: float, sizes: Sequence[int] = KAGGLE_TABLE_SIZES) -> tuple[int, ...]:
    """``sizes`` times ``scale``, rounded, at least one row per table."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    return tuple(int(s) for s in np.maximum(1, np.rint(np.asarray(sizes) * scale)).astype(np.int64))


def criteo_table_configs(
    table_sizes: Sequence[int] = KAGGLE_TABLE_SIZES, embedding_dim: int = 16
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per categorical feature, named as TorchRec's DLRM examples do."""
    if len(table_sizes) != CAT_FEATURE_COUNT:
        raise ValueError(f"expected {CAT_FEATURE_COUNT} table sizes, got {len(table_sizes)}")
    return [
        EmbeddingBagConfig(
            name=f"t_{feature}",
            embedding_dim=embedding_dim,
            num_embeddings=int(size),
            feature_names=[feature],
        )
        for feature, size in zip(DEFAULT_CAT_NAMES, table_sizes, strict=True)
    ]


def hash_to_rows(raw: np.ndarray, table_sizes: Sequence[int]) -> np.ndarray:
    """Raw categorical values (``(n, 26)``) modulo each table's size, as TorchRec's readers do."""
    return raw % np.asarray(table_sizes, dtype=np.int64)


def single_hot_block(
    dense: np.ndarray, raw_ids: np.ndarray, labels: np.ndarray, table_sizes: Sequence[int]
) -> SampleBlock:
    """A block of one id per feature from raw Criteo columns (hashed to rows here)."""
    return SampleBlock(
        dense=np.ascontiguousarray(dense, dtype=np.float32),
        ids=hash_to_rows(raw_ids, table_sizes),
        labels=np.ascontiguousarray(labels, dtype=np.int32).reshape(-1),
        ids_per_feature=(1,) * CAT_FEATURE_COUNT,
    )
