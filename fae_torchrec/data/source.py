"""The base of every data source: blocks of inputs, re-cut into TorchRec ``Batch``es of named features."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.data.block import SampleBlock, check_batch_size, rebatch


class BlockSource:
    """``raw_blocks`` as a source produces them, re-cut into ``Batch``es of ``batch_size`` inputs whose
    ``KeyedJaggedTensor`` has one key per feature, ``feature_names`` in order (the columns of a block's
    ``ids``). A subclass gives ``raw_blocks``, ``table_configs`` and ``num_dense`` (dense features an
    input)."""

    num_dense: int

    def __init__(self, batch_size: int, feature_names: Sequence[str]) -> None:
        check_batch_size(batch_size)
        self.batch_size = batch_size
        self.feature_names = tuple(feature_names)

    def table_configs(self, embedding_dim: int = 16) -> list[EmbeddingBagConfig]:
        """TorchRec table configs matching the ids this source yields."""
        raise NotImplementedError

    def raw_blocks(self) -> Iterator[SampleBlock]:
        raise NotImplementedError

    def blocks(self) -> Iterator[SampleBlock]:
        """The data as blocks of ``batch_size`` inputs (the last one may be smaller)."""
        return rebatch(self.raw_blocks(), self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return (block.to_batch(self.feature_names) for block in self.blocks())

    def split_blocks(self, validation: bool, every: int | None, block_size: int) -> Iterator[SampleBlock]:
        """The training (or validation) inputs in blocks of at most ``block_size``: input ``i``
        (counted from 0) is held out for validation when ``i % every == every - 1``, so any data of at
        least ``every`` inputs has both. A source with its own split (such as a split by time)
        overrides this and takes ``every`` None."""
        if every is None:
            raise ValueError(f"{type(self).__name__} holds out every N-th input: give N")
        start = 0
        for block in rebatch(self.raw_blocks(), block_size):
            held_out = (start + np.arange(len(block))) % every == every - 1
            start += len(block)
            chosen = block.select(held_out if validation else ~held_out)
            if len(chosen):
                yield chosen
