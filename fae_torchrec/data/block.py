"""Numpy rows of Criteo-format inputs, re-batched to any size and turned into TorchRec ``Batch``es."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass(frozen=True)
class SampleBlock:
    """``n`` inputs: dense features, ids and labels, input-major.

    ``ids`` has ``sum(ids_per_feature)`` columns; feature ``f`` owns ``ids_per_feature[f]`` of them,
    in feature order (one column per feature for single-hot data). ``part_ids``, when given, holds
    the same ids as FAE's parts number them (``HotSet.signed_part_ids``: what a partition stores, so
    that training needs no remap).
    """

    dense: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    ids_per_feature: tuple[int, ...]
    part_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def slice(self, start: int, stop: int) -> SampleBlock:
        return self.select(slice(start, stop))

    def select(self, inputs: np.ndarray | builtins.slice) -> SampleBlock:
        """The inputs where the boolean mask, index array or slice ``inputs`` selects them."""
        part_ids = None if self.part_ids is None else self.part_ids[inputs]
        return SampleBlock(
            self.dense[inputs], self.ids[inputs], self.labels[inputs], self.ids_per_feature, part_ids
        )

    @staticmethod
    def concat(blocks: Sequence[SampleBlock]) -> SampleBlock:
        if len(blocks) == 1:
            return blocks[0]
        part_ids = [b.part_ids for b in blocks if b.part_ids is not None]
        return SampleBlock(
            np.concatenate([b.dense for b in blocks]),
            np.concatenate([b.ids for b in blocks]),
            np.concatenate([b.labels for b in blocks]),
            blocks[0].ids_per_feature,
            np.concatenate(part_ids) if len(part_ids) == len(blocks) else None,
        )

    def as_part_ids(self) -> SampleBlock:
        """The block with its part ids in place of its ids: what a split model reads. Slices of it
        copy (or page in, from a memory-mapped partition) no original id."""
        if self.part_ids is None:
            raise ValueError("this block carries no part ids (a partition's blocks do)")
        return SampleBlock(self.dense, self.part_ids, self.labels, self.ids_per_feature)

    def without_part_ids(self) -> SampleBlock:
        """The block with its original ids only (what a partition is made from)."""
        return SampleBlock(self.dense, self.ids, self.labels, self.ids_per_feature)

    def feature_ids(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Per feature, its ids as an ``(n, ids_per_feature)`` array (input for ``FeatureIds.of``)."""
        bounds = np.concatenate([[0], np.cumsum(self.ids_per_feature)])
        return {key: self.ids[:, bounds[f] : bounds[f + 1]] for f, key in enumerate(keys)}

    def to_batch(self, keys: Sequence[str]) -> Batch:
        """A TorchRec ``Batch`` whose ``KeyedJaggedTensor`` has one key per feature, in order, its ids
        int64 (TorchRec's index type) whatever the block's are."""
        n = len(self)
        counts = np.asarray(self.ids_per_feature)
        if np.all(counts == 1):
            values = np.require(self.ids.T, dtype=np.int64, requirements=["C", "W"]).reshape(-1)
        else:
            bounds = np.concatenate([[0], np.cumsum(counts)])
            values = np.concatenate(
                [self.ids[:, bounds[f] : bounds[f + 1]].reshape(-1) for f in range(len(counts))],
                dtype=np.int64,
            )
        return Batch(
            dense_features=torch.from_numpy(np.require(self.dense, requirements=["C", "W"])),
            sparse_features=KeyedJaggedTensor(
                keys=list(keys),
                values=torch.from_numpy(values),
                lengths=torch.from_numpy(np.repeat(counts, n).astype(np.int32)),
                stride=n,
                length_per_key=(counts * n).tolist(),
            ),
            labels=torch.from_numpy(np.require(self.labels, requirements=["C", "W"])),
        )


def float32_dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as float32, the dense inputs' type, and where they are not finite there: NaN, infinite,
    or beyond float32's range (about ±3.4e38), which the cast makes infinite."""
    with np.errstate(over="ignore", invalid="ignore"):
        dense = np.asarray(values, dtype=np.float32)
    return dense, ~np.isfinite(dense)


def dense_problem(value: float) -> str:
    """What is wrong with a dense value ``float32_dense`` refused."""
    value = float(value)
    if np.isfinite(value):
        return (
            f"{value!r} is beyond float32's range (±{np.finfo(np.float32).max:.7g}), the dense inputs' type"
        )
    return f"{value!r} is not a finite number"


def check_batch_size(batch_size: int) -> None:
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def rebatch(blocks: Iterable[SampleBlock], batch_size: int) -> Iterator[SampleBlock]:
    """Cut a stream of blocks into blocks of ``batch_size`` inputs; the last one may be smaller."""
    check_batch_size(batch_size)
    pending: list[SampleBlock] = []
    held = 0
    for block in blocks:
        pending.append(block)
        held += len(block)
        if held < batch_size:
            continue
        merged = SampleBlock.concat(pending)
        full = held - held % batch_size
        for start in range(0, full, batch_size):
            yield merged.slice(start, start + batch_size)
        pending = [merged.slice(full, held)] if full < held else []
        held -= full
    if held:
        yield SampleBlock.concat(pending)
