"""Criteo-format data as TorchRec ``Batch``es: synthetic, raw TSV, and TorchRec's binary npy layout."""

from fae_torchrec.data.block import SampleBlock, rebatch
from fae_torchrec.data.criteo import (
    KAGGLE_TABLE_SIZES,
    criteo_table_configs,
    scaled_table_sizes,
)
from fae_torchrec.data.criteo_npy import CriteoNpyReader, npy_paths
from fae_torchrec.data.criteo_tsv import CriteoTsvReader
from fae_torchrec.data.synthetic import DEFAULT_EXPONENT, SyntheticCriteo

__all__ = [
    "DEFAULT_EXPONENT",
    "KAGGLE_TABLE_SIZES",
    "CriteoNpyReader",
    "CriteoTsvReader",
    "SampleBlock",
    "SyntheticCriteo",
    "criteo_table_configs",
    "npy_paths",
    "rebatch",
    "scaled_table_sizes",
]
