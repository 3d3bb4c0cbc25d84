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

With ``lookahead=N`` a pipeline also reads up to ``N`` batches ahead and, once the cold step before
the next cold batch is done, starts that batch's cold part at once (its input distribution, and with
the prefetch pipeline its cache prefetch), so that the hot steps between hide it; TorchRec's stages
then run that batch without its cold part. ``FAEPrefetchTrainPipeline`` looks 8 batches ahead by
default, ``FAETrainPipeline`` not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext

from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.torchrec_compat import (
    PrefetchHook,
    pipelined_modules,
    queued_batches,
    queued_contexts,
    set_pipelined_modules,
    stock_prefetch,
)
from fae_torchrec.train.step import find_fae_module

if TYPE_CHECKING:  # a mixin before TorchRec's pipeline, whose methods it extends
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist as _Pipeline
else:
    _Pipeline = object


class _SkipsColdOnHotBatches(_Pipeline):
    """What both FAE pipelines add to TorchRec's: the cold module out of a hot batch's input
    distribution. The first batch starts every module's, hot or not (TorchRec creates a module's
    input distribution on its first batch; a hot batch's cold input is empty). With a look-ahead,
    the next cold batch's cold part starts once the cold step before it is done."""

    #: Queued batches (from the next to train) whose input distribution TorchRec's stages have started
    #: when a step ends: the look-ahead starts the cold part of the others itself.
    _started_at_step_end = 1

    def _find_cold(self, model: nn.Module, lookahead: int) -> None:
        fae = find_fae_module(model)
        if fae is None:
            raise ValueError(f"{type(self).__name__} needs a model with an FAEEmbeddingBagCollection")
        if lookahead < 0:
            raise ValueError(f"lookahead must be a number of batches, at least 0, got {lookahead}")
        fae.cold_input_skipped_on_hot = True  # the module's warning is for TorchRec's own pipeline
        self._cold = fae.cold
        self._cold_dist_created = False
        self._lookahead = lookahead
        #: The contexts (by index) whose batch's cold part the look-ahead started.
        self._cold_ahead: set[int] = set()

    def _is_hot(self, batch: Batch) -> bool:
        features = batch.sparse_features
        if not isinstance(features, SplitFeatures):
            raise ValueError(
                f"{type(self).__name__} needs batches whose sparse_features are SplitFeatures: route them "
                "with BatchRouter(..., split=fae.split)"
            )
        return features.is_hot

    @contextmanager
    def _modules(self, cold: bool) -> Iterator[None]:
        """TorchRec's stages, run meanwhile, see the cold part only, or every sharded module but it."""
        modules = pipelined_modules(self)
        set_pipelined_modules(self, [module for module in modules if (module is self._cold) == cold])
        try:
            yield
        finally:
            set_pipelined_modules(self, modules)

    def start_sparse_data_dist(self, batch: Batch | None, context: TrainPipelineContext) -> None:
        if batch is None:
            return
        ahead = context.index in self._cold_ahead  # its cold part went ahead
        if not ahead and (not self._is_hot(batch) or not self._cold_dist_created):
            super().start_sparse_data_dist(batch, context)
            self._cold_dist_created = True
            return
        with self._modules(cold=False):
            super().start_sparse_data_dist(batch, context)

    def progress(self, dataloader_iter: Iterator[Batch]) -> object:
        output = super().progress(dataloader_iter)
        contexts = queued_contexts(self)
        if contexts:
            self._cold_ahead = {index for index in self._cold_ahead if index >= contexts[0].index}
        if self._lookahead:
            self._look_ahead(dataloader_iter)
        return output

    def _look_ahead(self, dataloader_iter: Iterator[Batch]) -> None:
        """Once the last cold step is done (the next step is hot, and no queued cold batch's cold part has
        started), start the next cold batch's cold part, reading ahead until one is queued or
        ``lookahead`` batches are."""
        batches, contexts = queued_batches(self), queued_contexts(self)
        if not batches or not self._is_hot(batches[0]):
            return
        index = 1
        while index < len(batches) or (
            len(batches) < self._lookahead and self.enqueue_batch(dataloader_iter)
        ):
            context = contexts[index]
            if context.index in self._cold_ahead:
                return
            if not self._is_hot(batches[index]):
                self._start_cold(batches[index], context, started=index < self._started_at_step_end)
                self._cold_ahead.add(context.index)
                return
            index += 1

    def _start_cold(self, batch: Batch, context: TrainPipelineContext, started: bool) -> None:
        """Start ``batch``'s cold part now: its input distribution (unless TorchRec's stages ``started``
        it with the others), waited on so that its tensors are on their way."""
        if not started:
            with self._modules(cold=True):
                super().start_sparse_data_dist(batch, context)
            self._cold_dist_created = True
        self.wait_sparse_data_dist(context)


class FAETrainPipeline(_SkipsColdOnHotBatches, TrainPipelineSparseDist[Batch, object]):
    """``TrainPipelineSparseDist`` (same arguments) that skips the cold part on hot batches; with
    ``lookahead=N`` it starts the next cold batch's cold input distribution up to ``N`` batches ahead.

    Raises ``ValueError`` when the model has no ``FAEEmbeddingBagCollection`` or a batch's features
    were not split.
    """

    def __init__(self, model: nn.Module, *args, lookahead: int = 0, **kwargs) -> None:
        super().__init__(model, *args, **kwargs)
        self._find_cold(model, lookahead)


class FAEPrefetchTrainPipeline(
    _SkipsColdOnHotBatches, PrefetchHook, PrefetchTrainPipelineSparseDist[Batch, object]
):
    """``PrefetchTrainPipelineSparseDist`` (same arguments) that skips the cold part on hot batches.

    For cold parts on ``fused_uvm_caching`` with ``CacheParams(prefetch_pipeline=True)``
    (``FAEShardingPlanner`` plans them so by default): the cache misses of the next cold batch are
    fetched during the current step, and a hot batch prefetches nothing into the cold
    caches (not even the first one: a prefetch that no lookup follows would keep its cache rows
    locked). CUDA only, as TorchRec's prefetch pipeline.
    """

    #: After a step TorchRec's prefetch pipeline has started the next two batches' input distribution.
    _started_at_step_end = 2

    def __init__(self, model: nn.Module, *args, lookahead: int = 8, **kwargs) -> None:
        super().__init__(model, *args, **kwargs)
        self._find_cold(model, lookahead)

    def prefetch_hook(self, context: TrainPipelineContext) -> None:
        batch = queued_batches(self)[list(queued_contexts(self)).index(context)]
        if context.index in self._cold_ahead:  # the cold part is prefetched: keep what it left
            kept = dict(context.module_input_post_prefetch), dict(context.module_contexts_post_prefetch)
            with self._modules(cold=False):
                stock_prefetch(self, context)
            context.module_input_post_prefetch.update(kept[0])
            context.module_contexts_post_prefetch.update(kept[1])
            return
        if not self._is_hot(batch):
            stock_prefetch(self, context)
            return
        with self._modules(cold=False):
            stock_prefetch(self, context)

    def _start_cold(self, batch: Batch, context: TrainPipelineContext, started: bool) -> None:
        """Start ``batch``'s cold part now, its cache prefetch included."""
        super()._start_cold(batch, context, started)
        with self._modules(cold=True):
            stock_prefetch(self, context)
