"""TorchRec ``Batch``es as a ``BlockSource``: the stream a TorchRec script trains on, read once.

FAE reads its training data twice (the profile, then the partition), and a TorchRec script's data is a
stream of ``Batch``es that need not give the same inputs twice (an endless ``RandomRecDataset``, a
``DataLoader`` that shuffles). :func:`spool_batches` reads the stream once, checks each ``Batch`` and
appends its dense features, ids and labels to ``.npy`` files; :class:`BatchSource` reads one or several
such spools (one per rank, in rank order), memory-mapped, as often as it is asked.

A ``SampleBlock`` holds a fixed number of ids per feature and input, so a jagged ``KeyedJaggedTensor``
(a feature whose inputs carry different numbers of ids) is refused, as are keys other than the tables'
feature names, weighted features, labels other than 0 and 1, and dense values that are not finite: each
error names the batch (counted from 0) and the feature or column.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path

import numpy as np
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from tqdm import tqdm

from fae_torchrec.data.block import SampleBlock, dense_problem, float32_dense
from fae_torchrec.data.npy_append import NpyAppender
from fae_torchrec.data.source import BlockSource
from fae_torchrec.tables import TableLayout

logger = logging.getLogger(__name__)
#: The description a finished spool writes last: a spool without it was cut short.
SPOOL_META = "batches.json"
#: The arrays of a spool, by field of ``SampleBlock``, and their types.
SPOOL_FIELDS = {"dense": np.float32, "ids": np.int64, "labels": np.int32}


def batch_block(batch: Batch, layout: TableLayout, index: int) -> SampleBlock:
    """``batch`` as a ``SampleBlock`` whose ids are in ``layout``'s feature order; ``ValueError`` naming
    batch ``index`` and the feature or column at fault where it does not fit one (see the module)."""
    where = f"batch {index}"
    if not isinstance(batch, Batch):
        raise ValueError(f"{where}: a {type(batch).__qualname__}, not a torchrec.datasets.utils.Batch")
    features = batch.sparse_features
    keys, expected = list(features.keys()), layout.features
    if sorted(keys) != sorted(expected):
        missing, unknown = sorted(set(expected) - set(keys)), sorted(set(keys) - set(expected))
        raise ValueError(
            f"{where}: its features {keys} are not the tables' feature names {expected} (missing "
            f"{missing}, unknown {unknown}{', some twice' if len(set(keys)) < len(keys) else ''})"
        )
    if features.weights_or_none() is not None:
        raise ValueError(f"{where}: weighted features (the KeyedJaggedTensor has weights) are not supported")
    if features.variable_stride_per_key():
        raise ValueError(f"{where}: the KeyedJaggedTensor has a variable batch size per feature")
    dense, bad = float32_dense(batch.dense_features.detach().cpu().numpy())
    labels = batch.labels.detach().cpu().numpy()
    n = features.stride()
    if dense.ndim != 2 or len(dense) != n or labels.shape != (n,):
        raise ValueError(
            f"{where}: dense features of shape {tuple(dense.shape)} and labels of shape {labels.shape} for "
            f"{n} inputs (the KeyedJaggedTensor's batch size): expected ({n}, dense features) and ({n},)"
        )
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise ValueError(f"{where}, dense column {column} (input {row}): {dense_problem(dense[row, column])}")
    not_binary = (labels != 0) & (labels != 1)
    if not_binary.any():
        row = int(np.argmax(not_binary))
        raise ValueError(
            f"{where}, labels (input {row}): {labels[row].item()!r} is not 0 or 1, a click's label"
        )
    lengths = features.lengths().detach().cpu().numpy().reshape(len(keys), n)
    jagged = (lengths != lengths[:, :1]).any(axis=1) | (lengths[:, :1] == 0).any(axis=1)
    if n and jagged.any():
        key = int(np.argmax(jagged))
        raise ValueError(
            f"{where}, feature {keys[key]}: from {lengths[key].min()} to {lengths[key].max()} ids per input; "
            "FAE's inputs carry the same number of ids (at least one) per feature in every input: pad or "
            "cut the feature to a fixed length (RandomRecDataset: min_ids_per_feature=ids_per_feature)"
        )
    counts = lengths[:, 0] if n else np.ones(len(keys), dtype=np.int64)
    values = np.split(features.values().detach().cpu().numpy(), np.cumsum(counts * n)[:-1])
    by_key = {key: ids.reshape(n, count) for key, ids, count in zip(keys, values, counts, strict=True)}
    for key, ids in by_key.items():
        try:
            layout.check_ids(layout.table_of(key), ids.reshape(-1), feature=key)
        except ValueError as error:
            raise ValueError(f"{where}, {error}") from error
    return SampleBlock(
        dense,
        np.concatenate([by_key[key] for key in expected], axis=1).astype(np.int64),
        labels.astype(np.int32),
        tuple(int(by_key[key].shape[1]) for key in expected),
    )


def spool_batches(
    batches: Iterable[Batch],
    tables: Sequence[EmbeddingBagConfig],
    directory: str | os.PathLike,
    num_batches: int | None = None,
    progress: bool = False,
) -> int:
    """Read ``batches`` once (the first ``num_batches`` of them; None: until it ends, which an endless
    dataset never does) into ``directory`` as ``.npy`` files; the number of inputs read.

    Raises ``ValueError`` naming the batch and the feature or column of the first ``Batch`` that does not
    fit a ``SampleBlock`` of ``tables``' features (see the module) or that changes the number of ids of a
    feature or of dense features from the first batch's; the spool is left unfinished then."""
    if num_batches is not None and num_batches <= 0:
        raise ValueError(f"num_batches must be a positive number of batches, got {num_batches}")
    layout = TableLayout.of(tables)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPOOL_META).unlink(missing_ok=True)
    writers: dict[str, NpyAppender] = {}
    first: SampleBlock | None = None
    read = tqdm(islice(batches, num_batches), total=num_batches or _length(batches), desc="reading batches",
                unit="batch", leave=False, disable=not progress)  # fmt: skip
    index = -1
    try:
        for index, batch in enumerate(read):
            block = batch_block(batch, layout, index)
            if not len(block):  # an empty batch: no input, and no number of ids to hold the others to
                continue
            first = block if first is None else first
            _check_like_first(block, first, layout, index)
            for field, dtype in SPOOL_FIELDS.items():
                array = getattr(block, field)
                if field not in writers:
                    writers[field] = NpyAppender(directory / f"{field}.npy", dtype, array.shape[1:])
                writers[field].append(array)
    finally:
        for writer in writers.values():
            writer.close()
    inputs = writers["labels"].rows if writers else 0
    if num_batches is not None and index + 1 < num_batches:
        logger.warning(
            "num_batches=%d, but the batches ended after %d: read them all", num_batches, index + 1
        )
    meta = {
        "keys": layout.features,
        "ids_per_feature": None if first is None else list(first.ids_per_feature),
        "batch_size": None if first is None else len(first),
        "inputs": inputs,
    }
    (directory / SPOOL_META).write_text(json.dumps(meta))
    return inputs


def _length(batches: Iterable[Batch]) -> int | None:
    """``len(batches)`` where it has one (a list, a ``DataLoader`` over a sized dataset), for the bar."""
    try:
        return len(batches)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None


def _check_like_first(block: SampleBlock, first: SampleBlock, layout: TableLayout, index: int) -> None:
    """``ValueError`` where ``block`` (batch ``index``) has other numbers of ids or dense features than
    the first batch."""
    if block.ids_per_feature != first.ids_per_feature:
        changed = np.flatnonzero(np.array(block.ids_per_feature) != np.array(first.ids_per_feature))[0]
        raise ValueError(
            f"batch {index}, feature {layout.features[changed]}: {block.ids_per_feature[changed]} ids per "
            f"input where batch 0 has {first.ids_per_feature[changed]}; FAE's inputs carry a fixed number "
            "of ids per feature"
        )
    if block.dense.shape[1] != first.dense.shape[1]:
        raise ValueError(
            f"batch {index}: {block.dense.shape[1]} dense features where batch 0 has {first.dense.shape[1]}"
        )


class BatchSource(BlockSource):
    """The ``Batch``es :func:`spool_batches` read into ``directories``, in order (one per rank, in rank
    order, for data that each rank reads its own share of), memory-mapped: a source read as often as
    asked. ``FileNotFoundError`` names a directory without a finished spool."""

    def __init__(
        self, directories: Sequence[str | os.PathLike], tables: Sequence[EmbeddingBagConfig]
    ) -> None:
        self.tables = list(tables)
        self.spools: list[SampleBlock] = []
        spooled = []
        for directory in map(Path, directories):
            meta = directory / SPOOL_META
            if not meta.exists():
                raise FileNotFoundError(f"{meta}: missing; {directory} holds no finished spool of batches")
            described = json.loads(meta.read_text())
            if described["keys"] != TableLayout.of(tables).features:
                raise ValueError(
                    f"{directory}: spooled for the features {described['keys']}, not these tables'"
                )
            if described["inputs"]:
                spooled.append((directory, described))
                self.spools.append(
                    SampleBlock(
                        **{
                            field: np.load(directory / f"{field}.npy", mmap_mode="r")
                            for field in SPOOL_FIELDS
                        },
                        ids_per_feature=tuple(described["ids_per_feature"]),
                    )
                )
        for (directory, _), spool in zip(spooled[1:], self.spools[1:], strict=True):
            first = self.spools[0]
            if spool.ids_per_feature != first.ids_per_feature or spool.dense.shape[1] != first.dense.shape[1]:
                raise ValueError(
                    f"{directory}: {spool.ids_per_feature} ids per feature and {spool.dense.shape[1]} dense "
                    f"features per input, where {spooled[0][0]} has {first.ids_per_feature} and "
                    f"{first.dense.shape[1]}: every rank's batches must have the same features"
                )
        self.num_dense = self.spools[0].dense.shape[1] if self.spools else 0
        self.num_samples = sum(map(len, self.spools))  # known before reading: bars show a total
        batch_size = spooled[0][1]["batch_size"] if spooled else 1
        super().__init__(batch_size, TableLayout.of(tables).features)

    def table_configs(self, embedding_dim: int | None = None) -> list[EmbeddingBagConfig]:
        """The tables the batches were checked against."""
        return list(self.tables)

    def raw_blocks(self) -> Iterator[SampleBlock]:
        return iter(self.spools)
