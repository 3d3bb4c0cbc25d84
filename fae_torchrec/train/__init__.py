"""Stage 3, training with FAE: the data split once into hot and cold inputs (``partition``), the order
of hot and cold steps (``schedule``), each rank's batches (``router``), one step (``step``) or
TorchRec's train pipeline that skips the cold part on hot batches (``pipeline``), the
optimizers that train every parameter (``optimizers``), checkpoints (``checkpoint``) and validation
(``evaluation``)."""

from fae_torchrec.train.checkpoint import CheckpointError, Checkpoints
from fae_torchrec.train.evaluation import evaluate
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.router import BatchRouter, RoutedBatch
from fae_torchrec.train.schedule import ORDERS, Step, make_schedule
from fae_torchrec.train.step import train_step

__all__ = [
    "ORDERS",
    "BatchRouter",
    "CheckpointError",
    "Checkpoints",
    "EmbeddingOptimizer",
    "FAEPrefetchTrainPipeline",
    "FAETrainPipeline",
    "HotColdPartition",
    "RoutedBatch",
    "Step",
    "evaluate",
    "make_schedule",
    "train_step",
    "unfused_optimizer",
]
