"""FAE (Frequently Accessed Embeddings) for TorchRec.

Profile which embedding rows are hot, build the hot set for a GPU memory budget, estimate how many
training inputs are then entirely hot, and split embedding tables into hot and cold parts.
"""

from fae_torchrec.access_stats import AccessStats, Holdout
from fae_torchrec.fae_embedding_bag import FAEEmbeddingBagCollection, part_table_name
from fae_torchrec.feature_ids import FeatureIds
from fae_torchrec.hot_set import HotSet
from fae_torchrec.hot_share import (
    ShareCurve,
    ShareEstimate,
    estimate_hot_share,
    hot_share_curve,
    measure_hot_share,
)
from fae_torchrec.profiler import AccessProfiler
from fae_torchrec.ranking import RowRanking
from fae_torchrec.state import load_full_state_dict
from fae_torchrec.tables import TableLayout, row_bytes
from fae_torchrec.units import format_bytes, parse_bytes

__all__ = [
    "AccessProfiler",
    "AccessStats",
    "FAEEmbeddingBagCollection",
    "FeatureIds",
    "Holdout",
    "HotSet",
    "RowRanking",
    "ShareCurve",
    "ShareEstimate",
    "TableLayout",
    "estimate_hot_share",
    "format_bytes",
    "hot_share_curve",
    "load_full_state_dict",
    "measure_hot_share",
    "parse_bytes",
    "part_table_name",
    "row_bytes",
]
