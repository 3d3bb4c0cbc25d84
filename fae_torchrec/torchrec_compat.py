"""Every private TorchRec, torch.distributed and torch.fx name the library uses, in one place.

Each accessor says what it reaches and which public API is missing; ``tests/test_torchrec_compat.py``
exercises each one against the installed TorchRec and fails, naming the accessor, if TorchRec renames
it or changes its meaning. Nothing else in ``fae_torchrec`` or ``planner`` touches these names.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed._shard import sharded_tensor as _sharded_tensor
from torch.fx import _symbolic_trace
from torchrec.distributed.planner import shard_estimators as _shard_estimators
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist
from torchrec.distributed.train_pipeline import runtime_forwards as _runtime_forwards

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import Enumerator, ShardingOption, Topology
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext

#: The class of a ``DistributedModelParallel`` state entry sharded across ranks (its ``local_shards()``
#: with ``.tensor`` and ``.metadata.shard_offsets``): TorchRec's state dicts hold them, and PyTorch offers
#: them only from the private ``torch.distributed._shard``.
ShardedTensor = _sharded_tensor.ShardedTensor


def optimizer_multiplier(optimizer_class: type[torch.optim.Optimizer] | None, shape: torch.Size) -> float:
    """Optimizer state per weight as TorchRec's storage estimates count it (``_get_optimizer_multipler``):
    no public function says it, and a hot-set budget must agree with TorchRec's estimates."""
    return _shard_estimators._get_optimizer_multipler(optimizer_class, shape)


def is_fx_symbolic_tracing() -> bool:
    """Whether ``torch.fx`` is tracing symbolically now (TorchRec's train pipelines trace the model to find
    its sharded modules); ``torch.fx`` offers the query only from the private ``_symbolic_trace``."""
    return _symbolic_trace.is_fx_symbolic_tracing()


def is_pipelined(module: nn.Module) -> bool:
    """Whether a TorchRec train pipeline has taken over ``module``'s forward (its ``PipelinedForward``
    and kin derive from ``BaseForward`` of ``train_pipeline.runtime_forwards``, which the package does
    not export)."""
    return isinstance(module.forward, _runtime_forwards.BaseForward)


def best_plan(planner: EmbeddingShardingPlanner) -> list[ShardingOption]:
    """The sharding options of the planner's last ``plan`` (``_best_plan``): ``plan`` returns the
    ``ShardingPlan`` only, without the shards' storage and perf estimates FAE's reports read."""
    return planner._best_plan


def planner_topology(planner: EmbeddingShardingPlanner) -> Topology:
    """The topology the planner plans for (``_topology``): TorchRec has no public accessor."""
    return planner._topology


def planner_enumerator(planner: EmbeddingShardingPlanner) -> Enumerator:
    """The enumerator the planner prices options with (``_enumerator``), to price other layouts alike:
    TorchRec has no public accessor."""
    return planner._enumerator


if TYPE_CHECKING:  # a mixin before TorchRec's enumerator, whose private filters it extends
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator as _Enumerator
else:
    _Enumerator = object


class EnumeratorFilterHooks(_Enumerator):
    """Mixin before ``EmbeddingEnumerator``: what its private per-table filters (``_filter_sharding_types``,
    ``_filter_compute_kernels``, called by ``enumerate``) keep passes through ``kept_sharding_types`` and
    ``kept_compute_kernels``; TorchRec has no public hook to order (or change) them."""

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        kept = super()._filter_sharding_types(name, allowed_sharding_types, sharder_key)
        return self.kept_sharding_types(kept, allowed_sharding_types)

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        kept = super()._filter_compute_kernels(name, allowed_compute_kernels, sharding_type)
        return self.kept_compute_kernels(kept, allowed_compute_kernels)

    def kept_sharding_types(self, kept: list[str], allowed: list[str]) -> list[str]:
        """The sharding types TorchRec kept of the sharder's ``allowed`` ones (as they are, by default)."""
        return kept

    def kept_compute_kernels(self, kept: list[str], allowed: list[str]) -> list[str]:
        """The compute kernels TorchRec kept of the sharder's ``allowed`` ones (as they are, by default)."""
        return kept


def pipelined_modules(pipeline: TrainPipelineSparseDist) -> list[nn.Module]:
    """The sharded modules whose input distribution (and prefetch) the pipeline's stages start
    (``_pipelined_modules``): TorchRec has no public way to start them for some modules only."""
    return pipeline._pipelined_modules


def set_pipelined_modules(pipeline: TrainPipelineSparseDist, modules: list[nn.Module]) -> None:
    """Make the pipeline's stages start ``modules`` only (see :func:`pipelined_modules`)."""
    pipeline._pipelined_modules = modules


def queued_batches(pipeline: TrainPipelineSparseDist) -> deque[Any]:
    """The batches the pipeline has read and not yet trained, the next to train first (``batches``, an
    undocumented attribute): TorchRec has no public way to look ahead at them."""
    return pipeline.batches


def queued_contexts(pipeline: TrainPipelineSparseDist) -> deque[Any]:
    """The ``TrainPipelineContext`` of each of :func:`queued_batches` (``contexts``, an undocumented
    attribute, in the same order; ``context.index`` numbers the batches read)."""
    return pipeline.contexts


def stock_prefetch(pipeline: PrefetchTrainPipelineSparseDist, context: PrefetchTrainPipelineContext) -> None:
    """TorchRec's own cache prefetch of a queued batch (``PrefetchTrainPipelineSparseDist._prefetch``):
    the pipeline has no public method to prefetch a batch, nor one for some of its modules only."""
    PrefetchTrainPipelineSparseDist._prefetch(pipeline, context)


class PrefetchHook:
    """Mixin before ``PrefetchTrainPipelineSparseDist``: its private per-batch cache prefetch (``_prefetch``,
    called by ``fill_pipeline`` and ``progress``) calls ``prefetch_hook``; TorchRec has no public hook."""

    def _prefetch(self, context: PrefetchTrainPipelineContext) -> None:
        self.prefetch_hook(context)

    def prefetch_hook(self, context: PrefetchTrainPipelineContext) -> None:
        """Prefetch the batch of ``context`` (TorchRec's own prefetch, by default)."""
        stock_prefetch(self, context)
