"""The batch router: FAE's schedule turned into this rank's TorchRec ``Batch``es, hot or cold."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from torchrec.datasets.utils import Batch

from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.partition import HotColdPartition
from fae_torchrec.schedule import Step, make_schedule


@dataclass(frozen=True)
class RoutedBatch:
    """This rank's batch of one step, and whether the step is hot (the cold part may be skipped)."""

    epoch: int
    step: int
    hot: bool
    batch: Batch


class BatchRouter:
    """Serves one rank its batches, step by step, from a hot/cold partition.

    Args:
        partition: the data set split into hot and cold inputs.
        batch_size: inputs per rank and step (the last cold step may be larger, see ``schedule``).
        world_size, rank: this rank's place; every rank computes the same schedule.
        order: ``phases`` or ``shuffled`` (see ``schedule``).
        seed: seed of the shuffled order (with the epoch).
        keys: the feature names of the ``KeyedJaggedTensor``.
    """

    def __init__(
        self,
        partition: HotColdPartition,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        order: str = "shuffled",
        seed: int = 0,
        keys: Sequence[str] = DEFAULT_CAT_NAMES,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range [0, {world_size})")
        self.partition = partition
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.order = order
        self.seed = seed
        self.keys = list(keys)

    def schedule(self, epoch: int) -> list[Step]:
        return make_schedule(
            len(self.partition.hot),
            len(self.partition.cold),
            self.batch_size,
            self.world_size,
            self.order,
            self.seed,
            epoch,
        )

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[RoutedBatch]:
        """This rank's batches of ``epoch`` from step ``start_step`` on (to resume mid-epoch)."""
        steps = self.schedule(epoch)
        for index in range(start_step, len(steps)):
            step = steps[index]
            block = SampleBlock.concat(
                [self.partition.part(part).slice(start, stop) for part, start, stop in step.spans[self.rank]]
            )
            yield RoutedBatch(epoch, index, step.hot, block.to_batch(self.keys))
