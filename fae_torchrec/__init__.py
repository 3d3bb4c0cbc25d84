"""FAE (Frequently Accessed Embeddings) for TorchRec, in three stages.

1. ``fae_torchrec.stats``: profile a sample of the inputs and choose the hot rows (``AccessProfiler``,
   ``AccessStats``, ``HotSet``, hot-input share estimates).
2. ``fae_torchrec.modules``: split embedding tables into hot and cold parts
   (``FAEEmbeddingBagCollection``), which the top-level ``planner`` package places for
   ``DistributedModelParallel``.
3. ``fae_torchrec.train``: partition the data into entirely-hot and other inputs and train with a
   router that runs hot mini-batches on the hot part only.

``fae_torchrec.data`` holds the data sources; every public name is re-exported here.
"""

from fae_torchrec.modules import (
    FAEEmbeddingBagCollection,
    SplitFeatures,
    gather_full_state_dict,
    load_full_state_dict,
    load_initial_tables,
    part_table_name,
)
from fae_torchrec.stats import (
    AccessProfiler,
    AccessStats,
    FeatureIds,
    Holdout,
    HotSet,
    RowRanking,
    ShareCurve,
    ShareEstimate,
    estimate_hot_share,
    hot_share_curve,
    measure_hot_share,
)
from fae_torchrec.tables import TableLayout, row_bytes
from fae_torchrec.train import (
    BatchRouter,
    CheckpointError,
    Checkpoints,
    EmbeddingOptimizer,
    FAEPrefetchTrainPipeline,
    FAETrainPipeline,
    HotColdPartition,
    RoutedBatch,
    Step,
    evaluate,
    make_schedule,
    train_step,
    unfused_optimizer,
)
from fae_torchrec.units import format_bytes, parse_bytes

__all__ = [
    "AccessProfiler",
    "AccessStats",
    "BatchRouter",
    "CheckpointError",
    "Checkpoints",
    "EmbeddingOptimizer",
    "FAEEmbeddingBagCollection",
    "FAEPrefetchTrainPipeline",
    "FAETrainPipeline",
    "FeatureIds",
    "Holdout",
    "HotColdPartition",
    "HotSet",
    "RoutedBatch",
    "RowRanking",
    "ShareCurve",
    "ShareEstimate",
    "SplitFeatures",
    "Step",
    "TableLayout",
    "estimate_hot_share",
    "evaluate",
    "format_bytes",
    "gather_full_state_dict",
    "hot_share_curve",
    "load_full_state_dict",
    "load_initial_tables",
    "make_schedule",
    "measure_hot_share",
    "parse_bytes",
    "part_table_name",
    "row_bytes",
    "train_step",
    "unfused_optimizer",
]
