"""Stage 3, training with FAE: the data split once into hot and cold inputs (``partition``), the order
of hot and cold steps (``schedule``), each rank's batches (``router``), one step (``step``) or
TorchRec's train pipeline that skips the cold part on hot batches (``pipeline``), the
optimizers that train every parameter (``optimizers``), checkpoints (``checkpoint``) and validation
(``evaluation``); the data prepared on every rank at once (``prepare``) and the steps trained in a loop
or a pipeline up to each pause (``runner``); re-planning as popularity drifts: deciding (``replan``)
and moving rows between the parts with their optimizer state: only the rows that change part
(``row_moves``), or every row through files (``resplit``); a planned cold tier, cold rows
in host memory copied into device slots by the epoch's slot plan (``slot_plan``, ``cold_tier``)."""

from fae_torchrec.train.checkpoint import CheckpointError, Checkpoints
from fae_torchrec.train.cold_tier import PlannedColdTier, min_cold_slots
from fae_torchrec.train.evaluation import evaluate, evaluation_cold_slots, validation_batches
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS, EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.prepare import PreparedData, prepare_data, repartition
from fae_torchrec.train.replan import ReplanDecision, Replanner, ReplanPolicy
from fae_torchrec.train.resplit import UnsplitState, load_unsplit_state, release_tables, spill_unsplit_state
from fae_torchrec.train.router import BatchRouter, RoutedBatch
from fae_torchrec.train.row_moves import RowMoves, move_rows, moves_rows_in_place
from fae_torchrec.train.runner import StepRunner
from fae_torchrec.train.schedule import ORDERS, Step, make_schedule, trained_inputs
from fae_torchrec.train.slot_plan import SlotAllocation, SlotPlan, allocate_slots, plan_slots
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
    "PlannedColdTier",
    "PreparedData",
    "ReplanDecision",
    "ReplanPolicy",
    "Replanner",
    "RoutedBatch",
    "RowMoves",
    "SlotAllocation",
    "SlotPlan",
    "Step",
    "StepRunner",
    "UnsplitState",
    "allocate_slots",
    "evaluate",
    "evaluation_cold_slots",
    "load_unsplit_state",
    "make_schedule",
    "min_cold_slots",
    "move_rows",
    "moves_rows_in_place",
    "plan_slots",
    "prepare_data",
    "release_tables",
    "repartition",
    "spill_unsplit_state",
    "train_step",
    "trained_inputs",
    "unfused_optimizer",
    "validation_batches",
]
