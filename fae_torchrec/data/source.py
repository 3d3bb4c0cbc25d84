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
    input); one that knows its size before it is read sets ``num_samples`` (its raw inputs), so that
    ranks can share it out (``raw_range``), and one that can start anywhere overrides ``raw_range``."""

    num_dense: int
    #: The raw inputs the source holds, where it knows before it is read (None: not known).
    num_samples: int | None = None

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

    def raw_range(self, start: int, stop: int | None) -> Iterator[SampleBlock]:
        """The raw inputs ``start`` to ``stop`` (None: the end), in blocks: one rank's share of the data.
        This reads (and drops) the inputs before ``start``; a source that can seek overrides it."""
        position = 0
        for block in self.raw_blocks():
            first = max(start - position, 0)
            last = len(block) if stop is None else min(stop - position, len(block))
            position += len(block)
            if first < last:
                yield block.slice(first, last)
            if stop is not None and position >= stop:
                return

    def split_blocks(self, validation: bool, every: int | None, block_size: int) -> Iterator[SampleBlock]:
        """The training (or validation) inputs in blocks of at most ``block_size``: input ``i``
        (counted from 0) is held out for validation when ``i % every == every - 1``, so any data of at
        least ``every`` inputs has both. A source with its own split (such as a split by time)
        overrides :meth:`split_masks` and takes ``every`` None."""
        return self.split_range(validation, every, block_size, 0, None)

    def split_range(
        self, validation: bool, every: int | None, block_size: int, start: int, stop: int | None
    ) -> Iterator[SampleBlock]:
        """:meth:`split_blocks` of the raw inputs ``start`` to ``stop`` (None: the end): with ``start``
        a multiple of ``block_size``, its blocks are those ``split_blocks`` yields from there on."""
        for block, held_out in self.split_masks(every, block_size, start, stop):
            chosen = block.select(held_out if validation else ~held_out)
            if len(chosen):
                yield chosen

    def split_masks(
        self, every: int | None, block_size: int, start: int, stop: int | None
    ) -> Iterator[tuple[SampleBlock, np.ndarray]]:
        """The raw inputs ``start`` to ``stop`` in blocks of at most ``block_size``, each with the mask of
        its validation inputs (:meth:`split_blocks`' rule): both sides of the split in one read."""
        if every is None:
            raise ValueError(f"{type(self).__name__} holds out every N-th input: give N")
        for block in rebatch(self.raw_range(start, stop), block_size):
            yield block, (start + np.arange(len(block))) % every == every - 1
            start += len(block)

    def training_before(self, position: int, every: int | None) -> int:
        """How many training inputs come before raw input ``position`` (``every`` as in
        :meth:`split_blocks`; 0: every input trains)."""
        if every is None:
            raise ValueError(f"{type(self).__name__} holds out every N-th input: give N")
        return position - (position // every if every else 0)
