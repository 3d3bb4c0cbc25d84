"""FAE's train pipelines: TorchRec's ``TrainPipelineSparseDist`` and ``PrefetchTrainPipelineSparseDist``
for a model with FAE's split module.

The stock pipelines start the next batch's input distribution (and, with prefetch, its cache
prefetch) for every sharded module during the current step. Here each batch's sparse features are a
``SplitFeatures`` (the router splits them: ``BatchRouter(split=fae.split)``) whose ``is_hot`` travels
with the batch, so when the next batch is hot its cold part's input distribution and prefetch are not
started, and the model does not look the cold part up: a hot step runs no collective, prefetch,
lookup or optimizer work of the cold part. Every rank decides alike, from the shared schedule that
made the batches, never from a collective. Both pipelines are TorchRec's own, run with the cold
module left out of their module list for a hot batch; nothing of their stages is rewritten.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext

from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.train.step import find_fae_module


class _SkipsColdOnHotBatches:
    """What both FAE pipelines add to TorchRec's: the cold module out of a hot batch's input
    distribution. The first batch starts every module's, hot or not (TorchRec creates a module's
    input distribution on its first batch; a hot batch's cold input is empty)."""

    _pipelined_modules: list[nn.Module]

    def _find_cold(self, model: nn.Module) -> None:
        fae = find_fae_module(model)
        if fae is None:
            raise ValueError(f"{type(self).__name__} needs a model with an FAEEmbeddingBagCollection")
        self._cold = fae.cold
        self._cold_dist_created = False

    def _is_hot(self, batch: Batch) -> bool:
        features = batch.sparse_features
        if not isinstance(features, SplitFeatures):
            raise ValueError(
                f"{type(self).__name__} needs batches whose sparse_features are SplitFeatures: route them "
                "with BatchRouter(..., split=fae.split)"
            )
        return features.is_hot

    @contextmanager
    def _without_cold(self) -> Iterator[None]:
        """TorchRec's stages, run meanwhile, see every sharded module but the cold part."""
        modules = self._pipelined_modules
        self._pipelined_modules = [module for module in modules if module is not self._cold]
        try:
            yield
        finally:
            self._pipelined_modules = modules

    def start_sparse_data_dist(self, batch: Batch | None, context: TrainPipelineContext) -> None:
        if batch is None:
            return
        if not self._is_hot(batch) or not self._cold_dist_created:
            super().start_sparse_data_dist(batch, context)
            self._cold_dist_created = True
            return
        with self._without_cold():
            super().start_sparse_data_dist(batch, context)


class FAETrainPipeline(_SkipsColdOnHotBatches, TrainPipelineSparseDist[Batch, object]):
    """``TrainPipelineSparseDist`` (same arguments) that skips the cold part on hot batches.

    Raises ``ValueError`` when the model has no ``FAEEmbeddingBagCollection`` or a batch's features
    were not split.
    """

    def __init__(self, model: nn.Module, *args, **kwargs) -> None:
        super().__init__(model, *args, **kwargs)
        self._find_cold(model)


class FAEPrefetchTrainPipeline(_SkipsColdOnHotBatches, PrefetchTrainPipelineSparseDist[Batch, object]):
    """``PrefetchTrainPipelineSparseDist`` (same arguments) that skips the cold part on hot batches.

    For cold parts on ``fused_uvm_caching`` with ``CacheParams(prefetch_pipeline=True)``
    (``FAEShardingPlanner`` plans them so by default): the cache misses of the next cold batch are
    fetched during the current step, and a hot batch prefetches nothing into the cold
    caches (not even the first one: a prefetch that no lookup follows would keep its cache rows
    locked). CUDA only, as TorchRec's prefetch pipeline.
    """

    def __init__(self, model: nn.Module, *args, **kwargs) -> None:
        super().__init__(model, *args, **kwargs)
        self._find_cold(model)

    def _prefetch(self, context: TrainPipelineContext) -> None:
        batch = self.batches[list(self.contexts).index(context)]
        if not self._is_hot(batch):
            super()._prefetch(context)
            return
        with self._without_cold():
            super()._prefetch(context)
