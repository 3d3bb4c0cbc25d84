"""Stage 3, training with FAE: the data split once into hot and cold inputs (``partition``), the order
of hot and cold steps (``schedule``), each rank's batches (``router``), one step (``step``) or
TorchRec's train pipeline that skips the cold part on hot batches (``pipeline``), the
optimizers that train every parameter (``optimizers``), checkpoints (``checkpoint``) and validation
(``evaluation``); the data prepared on every rank at once (``prepare``) and the steps trained in a loop
or a pipeline up to each pause (``runner``)."""

from fae_torchrec.train.checkpoint import CheckpointError, Checkpoints
from fae_torchrec.train.evaluation import evaluate, validation_batches
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS, EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.prepare import PreparedData, prepare_data
from fae_torchrec.train.router import BatchRouter, RoutedBatch
from fae_torchrec.train.runner import StepRunner
from fae_torchrec.train.schedule import ORDERS, Step, make_schedule
from fae_torchrec.train.step import train_step

__all__ = [
    "EMBEDDING_OPTIMIZERS",
    "ORDERS",
    "BatchRouter",
    "CheckpointError",
    "Checkpoints",
    "EmbeddingOptimizer",
    "FAEPrefetchTrainPipeline",
    "FAETrainPipeline",
    "HotColdPartition",
    "PreparedData",
    "RoutedBatch",
    "Step",
    "StepRunner",
    "evaluate",
    "make_schedule",
    "prepare_data",
    "train_step",
    "unfused_optimizer",
    "validation_batches",
]
