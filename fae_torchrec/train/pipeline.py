"""``FAETrainPipeline``: TorchRec's ``TrainPipelineSparseDist`` for a model with FAE's split module.

The stock pipeline starts the next batch's input distribution for every sharded module during the
current step. Here each batch's sparse features are a ``SplitFeatures`` (the router splits them:
``BatchRouter(split=fae.split)``) whose ``is_hot`` travels with the batch, so when the next batch is
hot its cold part's input distribution is not started, and the model does not look the cold part up:
a hot step runs no collective, lookup or optimizer work of the cold part. Every rank decides alike,
from the shared schedule that made the batches, never from a collective.
"""

from __future__ import annotations

from torch import nn
from torch.autograd.profiler import record_function
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext
from torchrec.distributed.train_pipeline.utils import (
    _start_data_dist,
    _wait_for_batch,
    use_context_for_postprocs,
)

from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.train.step import find_fae_module


class FAETrainPipeline(TrainPipelineSparseDist[Batch, object]):
    """``TrainPipelineSparseDist`` (same arguments) that skips the cold part on hot batches.

    The first batch starts every module's input distribution, hot or not (TorchRec creates a
    module's input distribution on its first batch; a hot batch's cold input is empty), later hot
    batches start the hot part's only. Raises ``ValueError`` when the model has no
    ``FAEEmbeddingBagCollection`` or a batch's features were not split.
    """

    def __init__(self, model: nn.Module, *args, **kwargs) -> None:
        super().__init__(model, *args, **kwargs)
        fae = find_fae_module(model)
        if fae is None:
            raise ValueError("FAETrainPipeline needs a model with an FAEEmbeddingBagCollection")
        self._cold = fae.cold
        self._cold_dist_created = False

    def start_sparse_data_dist(self, batch: Batch | None, context: TrainPipelineContext) -> None:
        if batch is None:
            return
        features = batch.sparse_features
        if not isinstance(features, SplitFeatures):
            raise ValueError(
                "FAETrainPipeline needs batches whose sparse_features are SplitFeatures: route them "
                "with BatchRouter(..., split=fae.split)"
            )
        if not features.is_hot or not self._cold_dist_created:
            super().start_sparse_data_dist(batch, context)
            self._cold_dist_created = True
            return
        modules = [module for module in self._pipelined_modules if module is not self._cold]
        with record_function(f"## start_sparse_data_dist {context.index} (hot) ##"):
            with self._stream_context(self._data_dist_stream):
                _wait_for_batch(batch, self._memcpy_stream)
                with use_context_for_postprocs(self._pipelined_postprocs, context):
                    _start_data_dist(modules, batch, context)
