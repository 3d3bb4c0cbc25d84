"""FAE (Frequently Accessed Embeddings) for TorchRec.

Profile which embedding rows are hot, build the hot set for a GPU memory budget, estimate how many
training inputs are then entirely hot, split embedding tables into hot and cold parts, and train with
a router that runs entirely-hot mini-batches on the hot part only.
"""

from fae_torchrec.access_stats import AccessStats, Holdout
from fae_torchrec.checkpoint import CheckpointError, Checkpoints
from fae_torchrec.evaluation import evaluate
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
from fae_torchrec.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.partition import HotColdPartition
from fae_torchrec.profiler import AccessProfiler
from fae_torchrec.ranking import RowRanking
from fae_torchrec.router import BatchRouter, RoutedBatch
from fae_torchrec.schedule import Step, make_schedule
from fae_torchrec.state import gather_full_state_dict, load_full_state_dict
from fae_torchrec.tables import TableLayout, row_bytes
from fae_torchrec.training import train_step
from fae_torchrec.units import format_bytes, parse_bytes

__all__ = [
    "AccessProfiler",
    "AccessStats",
    "BatchRouter",
    "CheckpointError",
    "Checkpoints",
    "EmbeddingOptimizer",
    "FAEEmbeddingBagCollection",
    "FeatureIds",
    "Holdout",
    "HotColdPartition",
    "HotSet",
    "RoutedBatch",
    "RowRanking",
    "ShareCurve",
    "ShareEstimate",
    "Step",
    "TableLayout",
    "estimate_hot_share",
    "evaluate",
    "format_bytes",
    "gather_full_state_dict",
    "hot_share_curve",
    "load_full_state_dict",
    "make_schedule",
    "measure_hot_share",
    "parse_bytes",
    "part_table_name",
    "row_bytes",
    "train_step",
    "unfused_optimizer",
]
