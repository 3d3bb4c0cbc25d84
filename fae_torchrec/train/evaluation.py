"""Validation of a TorchRec ``DLRMTrain``-like model: AUC and log loss, over all ranks."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch

from fae_torchrec.data.block import SampleBlock
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.train.cold_tier import min_cold_slots
from fae_torchrec.train.partition import HotColdPartition, with_part_ids
from fae_torchrec.train.router import BatchRouter


def evaluate(model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
    """AUC and mean log loss of ``model`` on ``batches`` (this rank's share; every rank must call
    it with the same number of batches, and the figures cover all ranks)."""
    # on the collective's device: NCCL reduces CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
    predictions, targets = [], []
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for batch in batches:
            _, (_, logits, labels) = model(batch)
            logits, labels = logits.to(device).float(), labels.to(device).float()
            predictions.append(torch.sigmoid(logits))
            targets.append(labels)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            loss_sum[0] += loss.double()
            loss_sum[1] += len(labels)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(loss_sum)
    auc = roc_auc(_gathered(torch.cat(predictions)), _gathered(torch.cat(targets)))
    return {"auc": auc, "log_loss": float(loss_sum[0] / loss_sum[1])}


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` against 0/1 ``labels``: the chance that a random
    positive scores above a random negative, ties counting half (the Mann-Whitney statistic from average
    ranks, equal to the exact ROC curve's trapezoids); NaN where one class is absent. One sort, no
    thresholds, and none of torchmetrics' half second of imports in every process."""
    order = torch.argsort(scores)
    _, group, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    average_rank = (torch.cumsum(counts, 0) - (counts - 1) / 2).double()  # 1-based, over ties
    positive = labels[order].bool()
    positives = int(positive.sum())
    negatives = len(labels) - positives
    if not positives or not negatives:
        return float("nan")
    wins = average_rank[group][positive].sum() - positives * (positives + 1) / 2
    return float(wins / (positives * negatives))


def validation_batches(
    validation: SampleBlock, keys: tuple[str, ...], batch_size: int, world_size: int, rank: int
) -> list[Batch]:
    """This rank's batches of the ``validation`` inputs (features ``keys``), the same number on every rank
    (as :func:`evaluate` needs), cut by :class:`BatchRouter` as training batches are."""
    return [routed.batch for routed in _router(validation, keys, batch_size, world_size, rank).epoch(0)]


def evaluation_cold_slots(
    validation: SampleBlock, keys: tuple[str, ...], hot_set: HotSet, batch_size: int, world_size: int
) -> dict[str, int]:
    """Per table with cold rows of ``hot_set``, the most distinct cold rows that one evaluation step
    (the :func:`validation_batches` of every rank) looks up: the fewest slots a planned cold tier
    evaluates with (``PlannedColdTier.evaluating``)."""
    router = _router(with_part_ids(validation, hot_set, keys), keys, batch_size, world_size, 0)
    return min_cold_slots(router.partition, router.schedule(0), hot_set)


def _router(
    validation: SampleBlock, keys: tuple[str, ...], batch_size: int, world_size: int, rank: int
) -> BatchRouter:
    """The router of the ``validation`` inputs, all in cold steps, in their order."""
    everything_cold = HotColdPartition(
        validation.slice(0, 0), validation, np.zeros(len(validation), dtype=bool), keys
    )
    return BatchRouter(everything_cold, batch_size, world_size, rank, order="phases")


def repeated_inputs(validation: SampleBlock, training: HotColdPartition, chunk: int = 1 << 18) -> int:
    """How many ``validation`` inputs repeat a training input's features (every id and dense value
    alike; labels aside): a validation set that repeats its training set measures memory, not
    generalisation. Inputs compare by a 64-bit hash of their features' bytes (a false match among ``v``
    validation and ``t`` training inputs has odds about ``v * t / 2**64``); ``training``'s parts are
    read ``chunk`` inputs at a time, so a memory-mapped partition pages through once."""
    if validation is None or not len(validation):
        return 0
    seen, where = np.unique(_row_hashes(validation.ids, validation.dense), return_inverse=True)
    found = np.zeros(len(seen), dtype=bool)
    for part in (training.hot, training.cold):
        for start in range(0, len(part), chunk):
            rows = _row_hashes(part.ids[start : start + chunk], part.dense[start : start + chunk])
            at = np.minimum(np.searchsorted(seen, rows), len(seen) - 1)
            found[at[seen[at] == rows]] = True
    return int(np.count_nonzero(found[where]))


def _row_hashes(ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """A 64-bit hash per input of its ids (as int64) and dense values (as float32): its bytes as 64-bit
    words, each times its own fixed odd multiplier and mixed (xor-shift, multiply, xor-shift: a sum of
    the words alone would let structured differences cancel, such as two sign bits), summed (wrapping)."""
    parts = [
        np.ascontiguousarray(a, dtype=dtype)
        .view(np.uint8)
        .reshape(len(a), np.dtype(dtype).itemsize * a[0].size)
        for a, dtype in ((ids, np.int64), (dense, np.float32))
    ]
    width = sum(part.shape[1] for part in parts)
    padding = np.zeros((len(ids), -width % 8), dtype=np.uint8)
    words = np.ascontiguousarray(np.concatenate([*parts, padding], axis=1)).view(np.uint64)
    multipliers = np.random.default_rng(0).integers(0, 2**64, words.shape[1], np.uint64, endpoint=False) | 1
    mixed = words * multipliers
    mixed ^= mixed >> np.uint64(29)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(32)
    return mixed.sum(axis=1, dtype=np.uint64)


def _gathered(values: torch.Tensor) -> torch.Tensor:
    """Every rank's ``values``, in rank order, made by ``all_reduce`` into a zero buffer rather than
    ``all_gather``: on gloo (CPU) the first ``all_gather`` slows every later training step of the
    process by about half (measured; torchmetrics' metric objects gather that way on ``compute``)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    sizes = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=values.device)
    sizes[dist.get_rank()] = len(values)
    dist.all_reduce(sizes)
    start = int(sizes[: dist.get_rank()].sum())
    buffer = torch.zeros(int(sizes.sum()), dtype=values.dtype, device=values.device)
    buffer[start : start + len(values)] = values
    dist.all_reduce(buffer)
    return buffer


def _nccl() -> bool:
    return dist.is_initialized() and dist.get_backend() == "nccl"
