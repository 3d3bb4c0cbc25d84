"""The model families the training recipe trains: DLRM on Criteo-layout data or any click log described by
a schema, TBSM on Taobao-layout data."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fae_torchrec.command_line import add_data_arguments, add_taobao_arguments
from fae_torchrec.defaults import DEFAULTS, add_val_every_argument

if TYPE_CHECKING:  # the models and sources import torch when a run builds them, not for --help
    from torch import nn

    from fae_torchrec.data.source import BlockSource
    from fae_torchrec.recipes.config import RecipeConfig


@dataclass(frozen=True)
class ModelFamily:
    """What differs between the models the recipe trains; everything else (profiling, partitioning,
    planning, DMP, the router, pipelines, evaluation, checkpoints, outputs) is shared.

    Attributes:
        name: the model's name in logs and plots.
        description: the command's help line.
        add_arguments: adds the data options (and any model option) to the parser.
        open_source: the data source the options name, in blocks of ``BLOCK`` inputs.
        build_model: the train module (loss, (loss, logits, labels)) around a sparse module (an
            ``EmbeddingBagCollection`` or ``FAEEmbeddingBagCollection``), for the config and the data's
            dense values per input.
        sparse_path: where the sparse module lives in the train module (``get_submodule``).
        val_every: the option that holds out every N-th input for validation, or None when the source
            splits its own (TBSM's, by time).
        named_defaults: option values a resume must match that are defaults computed from others.
        defaults: the family's defaults of the recipe's options (``fae_torchrec.defaults``' shared with
            ``profile`` and ``plan``, and its own such as ``balance``).
        warmup: the default ``--warmup`` of the stream order (other orders take none).
    """

    name: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    open_source: Callable[[RecipeConfig], BlockSource]
    build_model: Callable[[nn.Module, RecipeConfig, int], nn.Module]
    sparse_path: str
    val_every: Callable[[RecipeConfig], int | None] = lambda config: None
    named_defaults: Callable[[RecipeConfig], dict] = lambda config: {}
    defaults: dict = field(default_factory=dict)
    warmup: float = 0.0


def _dlrm_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, num_samples=DEFAULTS["dlrm"].inputs, scale=DEFAULTS["dlrm"].scale)
    add_val_every_argument(parser)


def _dlrm_source(config: RecipeConfig) -> BlockSource:
    """The labelled data ``config`` names."""
    from fae_torchrec.recipes.sources import open_source
    from fae_torchrec.train.prepare import BLOCK

    return open_source(config, batch_size=BLOCK, require_labels=True)[0]


def _dlrm_named_defaults(config: RecipeConfig) -> dict:
    from fae_torchrec.recipes.sources import default_tables

    return {"tables": config.tables or default_tables(config.data)}


def _dlrm(sparse: nn.Module, config: RecipeConfig, num_dense: int) -> nn.Module:
    """TorchRec's DLRM of ``num_dense`` dense features (13 for Criteo's layout, the schema's dense
    columns for parquet and csv); with none (a schema's ``dense = []``, as for Avazu) its dense arch is
    its first layer's bias, and PyTorch's notice that a zero-element weight takes no init is moot."""
    from torchrec.models.dlrm import DLRM as TorchRecDLRM
    from torchrec.models.dlrm import DLRMTrain

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op", UserWarning)
        return DLRMTrain(
            TorchRecDLRM(
                sparse,
                dense_in_features=num_dense,
                dense_arch_layer_sizes=[64, config.dim],
                over_arch_layer_sizes=[64, 32, 1],
            )
        )


def _tbsm(sparse: nn.Module, config: RecipeConfig, num_dense: int) -> nn.Module:
    """TBSM with the reference run's layer sizes, the bottom MLP ending in ``--dim`` (its dense input is
    each step's position, whatever ``num_dense``); TorchRec's ``DLRMTrain`` is its binary cross-entropy
    wrapper (it serves any model of dense and sparse features)."""
    from torchrec.models.dlrm import DLRMTrain

    from fae_torchrec.models import TBSM as TBSMModel
    from fae_torchrec.recipes.config import required

    ts_length = required(config.ts_length, "--ts-length")
    return DLRMTrain(TBSMModel(sparse, ts_length=ts_length, dense_arch_layer_sizes=[config.dim]))


def _tbsm_source(config: RecipeConfig) -> BlockSource:
    from fae_torchrec.recipes.sources import open_taobao_source
    from fae_torchrec.train.prepare import BLOCK

    return open_taobao_source(config, batch_size=BLOCK)


DLRM = ModelFamily(
    name="DLRM",
    description="Train TorchRec's DLRM with FAE on DistributedModelParallel, or a baseline with --baseline.",
    add_arguments=_dlrm_arguments,
    open_source=_dlrm_source,
    build_model=_dlrm,
    sparse_path="model.sparse_arch.embedding_bag_collection",
    val_every=lambda config: config.val_every,
    named_defaults=_dlrm_named_defaults,
    defaults=DEFAULTS["dlrm"].options(),
)

TBSM = ModelFamily(
    name="TBSM",
    description="Train TBSM (the time-based sequence model) with FAE on DistributedModelParallel, or a "
    "baseline.",
    add_arguments=lambda parser: add_taobao_arguments(
        parser, num_users=DEFAULTS["tbsm"].inputs, scale=DEFAULTS["tbsm"].scale
    ),
    open_source=_tbsm_source,
    build_model=_tbsm,
    sparse_path="model.embedding_bag_collection",
    # label balance and warm-up: without them FAE's hot steps, 60% positive against 40% for the other
    # inputs, cost TBSM accuracy, and can keep it at a constant prediction (BENCHMARKS.md, section 6)
    defaults={**DEFAULTS["tbsm"].options(), "balance": 0.5},
    warmup=0.1,
)

#: The families by the name ``--model`` options give them.
FAMILIES = {"dlrm": DLRM, "tbsm": TBSM}
