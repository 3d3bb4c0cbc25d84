"""Data as TorchRec ``Batch``es: Criteo-format (synthetic, raw TSV, TorchRec's binary npy layout), any
click log in parquet or csv that a schema describes (``ColumnarSource``, ``load_schema``), TBSM's Taobao
layout (synthetic, ``UserBehavior.csv``); and a TorchRec script's own ``Batch``es, read once into a spool
(``batches``). Every source reads in blocks of inputs (``BlockSource``, ``SampleBlock``)."""

from fae_torchrec.data.batches import BatchSource, spool_batches
from fae_torchrec.data.block import SampleBlock, rebatch
from fae_torchrec.data.columnar import ColumnarSource
from fae_torchrec.data.criteo import (
    KAGGLE_TABLE_SIZES,
    criteo_table_configs,
    scaled_table_sizes,
)
from fae_torchrec.data.criteo_npy import CriteoNpyReader, npy_paths
from fae_torchrec.data.criteo_tsv import CriteoTsvReader
from fae_torchrec.data.schema import Schema, load_schema
from fae_torchrec.data.source import BlockSource
from fae_torchrec.data.synthetic import DEFAULT_EXPONENT, SyntheticCriteo
from fae_torchrec.data.synthetic_taobao import SyntheticTaobao, taobao_like_events
from fae_torchrec.data.taobao import (
    REFERENCE_TABLE_SIZES,
    TS_LENGTH,
    Events,
    TaobaoSource,
    tbsm_feature_names,
    tbsm_samples,
    tbsm_table_configs,
)
from fae_torchrec.data.taobao_csv import TaobaoCsvReader, read_user_behavior

__all__ = [
    "DEFAULT_EXPONENT",
    "KAGGLE_TABLE_SIZES",
    "REFERENCE_TABLE_SIZES",
    "TS_LENGTH",
    "BatchSource",
    "BlockSource",
    "ColumnarSource",
    "CriteoNpyReader",
    "CriteoTsvReader",
    "Events",
    "SampleBlock",
    "Schema",
    "SyntheticCriteo",
    "SyntheticTaobao",
    "TaobaoCsvReader",
    "TaobaoSource",
    "criteo_table_configs",
    "load_schema",
    "npy_paths",
    "read_user_behavior",
    "rebatch",
    "scaled_table_sizes",
    "spool_batches",
    "taobao_like_events",
    "tbsm_feature_names",
    "tbsm_samples",
    "tbsm_table_configs",
]
