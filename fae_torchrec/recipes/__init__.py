"""The training recipe the examples run: a model family (``family``: DLRM, TBSM) trained with FAE or a
TorchRec baseline from the command line (``options``), built in TorchRec's order (``build``: data,
planner, DMP, optimizers, router) and trained with evaluations, checkpoints and outputs (``loop``)."""

from fae_torchrec.recipes.build import Training, build_training, init_distributed
from fae_torchrec.recipes.family import DLRM, FAMILIES, TBSM, ModelFamily
from fae_torchrec.recipes.loop import main, run
from fae_torchrec.recipes.options import parse_args

__all__ = [
    "DLRM",
    "FAMILIES",
    "TBSM",
    "ModelFamily",
    "Training",
    "build_training",
    "init_distributed",
    "main",
    "parse_args",
    "run",
]
