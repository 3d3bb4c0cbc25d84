"""``SplitFeatures``: a batch's sparse features already split into FAE's hot and cold parts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class SplitFeatures(Pipelineable):
    """The inputs of an ``FAEEmbeddingBagCollection``'s two parts for one batch, made before the step
    (``FAEEmbeddingBagCollection.split``) so that the step does no remapping.

    ``hot`` holds each bag's hot ids as ids of the hot part and ``cold`` its cold ids as ids of the
    cold part (each over the features of the tables with rows in that part, in table order; None when
    no table has rows in the part). ``is_hot`` says that every id of the batch is hot: the cold input
    then holds no id and the cold part is not looked up at all. It travels with the batch, so a
    pipeline that prepares the next batch during this step knows whether that batch needs the cold
    part. It is a TorchRec ``Pipelineable``, the ``sparse_features`` of a ``Batch``.
    """

    hot: KeyedJaggedTensor | None
    cold: KeyedJaggedTensor | None
    is_hot: bool

    def to(self, device: torch.device, non_blocking: bool = False) -> SplitFeatures:
        return SplitFeatures(
            *(
                None if kjt is None else kjt.to(device, non_blocking=non_blocking)
                for kjt in (self.hot, self.cold)
            ),
            self.is_hot,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        for kjt in (self.hot, self.cold):
            if kjt is not None:
                kjt.record_stream(stream)

    def pin_memory(self) -> SplitFeatures:
        return SplitFeatures(
            *(None if kjt is None else kjt.pin_memory() for kjt in (self.hot, self.cold)), self.is_hot
        )
