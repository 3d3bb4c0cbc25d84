"""The batch router: FAE's schedule turned into this rank's TorchRec ``Batch``es, hot or cold."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count

from torch import nn
from torch.profiler import record_function
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import trace
from fae_torchrec.command_line import Order
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.schedule import Step, check_warmup, initial_run, interleave, make_schedule
from fae_torchrec.train.step import find_fae_module


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
        order: ``stream`` (the default), ``shuffled``, ``phases`` or ``adaptive`` (see ``schedule``).
        seed: seed of the random orders (with the epoch).
        warmup: the stream order's share of the first epoch trained in cold steps only (see ``schedule``).
        keys: the feature names of the ``KeyedJaggedTensor``: the partition's (``partition.keys``);
            optional, and refused when they differ.
        split: makes each batch's ``sparse_features`` a ``SplitFeatures`` before the step, given the
            features, whether the step is hot and the digest of the hot set whose part ids the
            features carry (an ``FAEEmbeddingBagCollection``'s ``split``; under DMP the split module is
            still there, around its sharded parts), or a model holding that module (such as a DMP model:
            for a module built inline). None keeps the original ``KeyedJaggedTensor``, for the model to
            remap. Raises ``ValueError`` here, alike on every rank, when the split module
            was built from another hot set than the partition (the split of its first input checks it).
        cold_tier: the model's planned cold tier (``PlannedColdTier``; it needs ``split``): each epoch's
            cold steps (of ``partition``) are planned when the epoch starts, and each cold batch's cold
            ids turned into slot ids.
    """

    def __init__(
        self,
        partition: HotColdPartition,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        order: str = "stream",
        seed: int = 0,
        warmup: float = 0.0,
        keys: Sequence[str] | None = None,
        split: Callable[[KeyedJaggedTensor, bool, str | None], SplitFeatures] | nn.Module | None = None,
        cold_tier: PlannedColdTier | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range [0, {world_size})")
        check_warmup(warmup, order)
        if keys is not None and tuple(keys) != partition.keys:
            raise ValueError(
                f"keys {list(keys)} are not the partition's feature names {list(partition.keys)}"
            )
        self.partition = partition
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.order = order
        self.seed = seed
        self.warmup = warmup
        if isinstance(split, nn.Module):
            module = find_fae_module(split)
            if module is None:
                raise ValueError(f"split: the {type(split).__name__} holds no FAEEmbeddingBagCollection")
            split = module.split
        self.split = split
        if cold_tier is not None and split is None:
            raise ValueError("a planned cold tier routes split batches: give the router split= too")
        self.cold_tier = None  # set once the split is checked (on an input of no step)
        self._position: dict = {}
        self._relayout = False
        if split is not None:
            if partition.hot_set_digest is None:
                raise ValueError(
                    "the partition's inputs carry no part ids to split: route it with split=None"
                )
            first_hot = len(partition.hot) > 0  # the split of one input checks the module's hot set
            self._split_batch([(partition.hot if first_hot else partition.cold).slice(0, 1)], first_hot)
        self.cold_tier = cold_tier

    def schedule(self, epoch: int) -> list[Step]:
        return make_schedule(
            self.partition.is_hot,
            self.batch_size,
            self.world_size,
            self.order,
            self.seed,
            epoch,
            self.warmup,
        )

    def epoch(self, epoch: int, start_step: int = 0, *, plan_next: bool = False) -> Iterator[RoutedBatch]:
        """This rank's batches of ``epoch`` from step ``start_step`` on.

        To resume mid-epoch, load the router's ``state_dict`` from the checkpoint first (the adaptive
        order needs it), and the planned cold tier's, and start at its ``step``. ``plan_next``: the
        planned cold tier plans the next epoch's slots during this one (``PlannedColdTier.plan_ahead``).
        """
        steps = self.schedule(epoch)
        if self.cold_tier is not None:
            cold_done = (
                self._position.get("cold_done", 0)
                if self.order == Order.ADAPTIVE
                else sum(not step.hot for step in steps[:start_step])
            )
            cold_steps = [step for step in steps if not step.hot]
            start = cold_done if start_step else 0
            self.cold_tier.plan_epoch(self.partition, cold_steps, start=start, key=epoch)
            if plan_next:
                following = [step for step in self.schedule(epoch + 1) if not step.hot]
                self.cold_tier.plan_ahead(self.partition, following, epoch + 1)
        if self.order != "adaptive":
            for index in range(start_step, len(steps)):
                self._position = {"epoch": epoch, "step": index + 1}
                yield self._batch(epoch, index, steps[index])
            return
        hot = [step for step in steps if step.hot]
        cold = [step for step in steps if not step.hot]
        if start_step == 0:  # the run length and best loss carry over from the previous epoch
            run = min(self._position.get("run", len(hot)), initial_run(len(hot)))
            best_loss = self._position.get("best_loss", float("inf"))
            self._position = {"epoch": epoch, "step": 0, "hot_done": 0, "cold_done": 0, "anchor": (0, 0),
                              "run": run, "best_loss": best_loss}  # fmt: skip
        elif self._position.get("epoch") != epoch or self._position.get("step") != start_step:
            raise ValueError(f"load the router state of epoch {epoch}, step {start_step} before resuming")
        while self._position["step"] < len(steps):
            # the kinds laid out when the run length last changed (the anchor: hot and cold steps done
            # then), past the steps done since
            position = self._position
            hot_then, cold_then = position["anchor"]
            kinds = interleave(len(hot) - hot_then, len(cold) - cold_then, position["run"])
            self._relayout = False
            for is_hot in kinds[position["step"] - hot_then - cold_then :]:
                kind = "hot_done" if is_hot else "cold_done"
                step = (hot if is_hot else cold)[self._position[kind]]
                index = self._position["step"]
                self._position = {**self._position, kind: self._position[kind] + 1, "step": index + 1}
                yield self._batch(epoch, index, step)
                if self._relayout:
                    break

    def batches(self, epochs: int | None = None, start_epoch: int = 0) -> Iterator[Batch]:
        """This rank's batches, epoch after epoch from ``start_epoch``: ``epochs`` of them, or without end
        (None), as a TorchRec loop reads a dataset: ``it = router.batches(); for _ in range(N):
        pipeline.progress(it)``. Whether a step is hot travels with its batch (``split``)."""
        for epoch in count(start_epoch) if epochs is None else range(start_epoch, start_epoch + epochs):
            for routed in self.epoch(epoch):
                yield routed.batch

    def report_validation_loss(self, loss: float) -> None:
        """Adaptive order: a validation loss worse than the best so far halves the hot run length
        from the next step on (and in later epochs). Every rank must report the same loss (an
        all-reduced one)."""
        if self.order != "adaptive":
            return
        if loss > self._position["best_loss"]:
            done = (self._position["hot_done"], self._position["cold_done"])
            self._position = {**self._position, "run": max(1, self._position["run"] // 2), "anchor": done}
            self._relayout = True
        else:
            self._position = {**self._position, "best_loss": loss}

    def state_dict(self) -> dict:
        """Where the router is: epoch, next step, and the adaptive order's state."""
        return dict(self._position)

    def load_state_dict(self, state: dict) -> None:
        self._position = dict(state)

    def _batch(self, epoch: int, index: int, step: Step) -> RoutedBatch:
        with record_function(trace.ROUTE):
            spans = [
                self.partition.part(part).slice(start, stop) for part, start, stop in step.spans[self.rank]
            ]
            if self.split is None:
                batch = SampleBlock.concat(spans).to_batch(self.partition.keys)
            else:
                batch = self._split_batch(spans, step.hot)
            return RoutedBatch(epoch, index, step.hot, batch)

    def _split_batch(self, spans: list[SampleBlock], hot: bool) -> Batch:
        """The ``Batch`` of the part ids of ``spans`` (remapped when the partition was written: split by
        sign; the original ids are left unread), its sparse features split for the parts."""
        batch = SampleBlock.concat([span.as_part_ids() for span in spans]).to_batch(self.partition.keys)
        assert self.split is not None  # routed here only where there is a split module (_route)
        features = self.split(batch.sparse_features, hot, self.partition.hot_set_digest)
        if self.cold_tier is not None and not hot:
            features = self.cold_tier.route(features)
        return Batch(batch.dense_features, features, batch.labels)
