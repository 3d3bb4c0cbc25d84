"""FAE's offline step: a data set split once into its entirely-hot inputs and the others.

Inputs keep their order within each part. Each input's ids are stored twice: as they are (``ids``)
and as FAE's parts number them (``part_ids``, ``HotSet.signed_part_ids``), remapped here once so that
training splits its batches by sign, with no lookup in the hot set (FAE's offline remap). A partition
lives in memory or in a directory of ``.npy`` files (``hot_dense.npy``, ``hot_ids.npy``,
``hot_part_ids.npy``, ``hot_labels.npy``, the same for ``cold``, and ``is_hot.npy``, which inputs of the
data went to the hot part), written chunk by chunk while the data streams past, and read back
memory-mapped.

Label balance: entirely-hot inputs are not a random sample of the data; they click more often than the
rest (TBSM, whose negatives are random, mostly cold, items) or less (Criteo), so every hot step is a
label-biased batch, and the bias costs accuracy (BENCHMARKS.md, section 6). With ``balance`` b, each
block of the data sends to the cold part a random b of the hot inputs that would have to leave for the
rest to click at the block's rate, all of the label they over-represent (a cold step trains a hot input
as the baseline would): b = 1 makes hot steps click at the data's rate, at the cost of those inputs'
hot steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fae_torchrec.checks import check_share
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.npy_append import NpyAppender, NpyRegion, allocate_npy, reserve_npy, write_npy_header
from fae_torchrec.seeds import generator
from fae_torchrec.stats.hot_set import COLD, HOT, PARTS, HotSet

_FIELDS = ("dense", "ids", "labels", "part_ids")
#: Per field of a part, its dtype and the shape of a row.
FieldLayout = dict[str, tuple[np.dtype, tuple[int, ...]]]


@dataclass(frozen=True)
class HotColdPartition:
    """The entirely-hot inputs of a data set (``hot``; label-balanced, see the module docstring), all
    the others (``cold``), for each input of the data, in its order, whether it went to the hot part
    (``is_hot``; the stream order needs it), the feature names of the parts' id columns (``keys``:
    the batches' ``KeyedJaggedTensor`` keys) and the ``HotSet.digest`` of the hot set its part ids were
    made with (``hot_set_digest``; None: its inputs carry none), which a split module checks against its
    own."""

    hot: SampleBlock
    cold: SampleBlock
    is_hot: np.ndarray
    keys: tuple[str, ...]
    hot_set_digest: str | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.hot.ids_per_feature):
            raise ValueError(f"{len(self.keys)} keys for {len(self.hot.ids_per_feature)} features")
        marked = int(np.count_nonzero(self.is_hot))
        if len(self.is_hot) != len(self.hot) + len(self.cold) or marked != len(self.hot):
            raise ValueError(
                f"is_hot marks {marked} of {len(self.is_hot)} inputs hot, but the parts hold "
                f"{len(self.hot)} hot and {len(self.cold)} cold inputs"
            )

    def part(self, name: str) -> SampleBlock:
        parts: dict[str, SampleBlock] = {HOT: self.hot, COLD: self.cold}
        return parts[name]

    def take_ids(self, spans: Sequence[tuple[str, int, int]], positions: np.ndarray) -> np.ndarray:
        """The original ids (one input per row) of the inputs at ``positions`` (sorted) among those
        ``spans`` (``(part, start, stop)``, such as a step's on every rank) hold one after another:
        what watching a step reads of it (a memory-mapped partition pages in those rows only)."""
        lengths = np.array([stop - start for _, start, stop in spans], dtype=np.int64)
        ends = np.cumsum(lengths)
        which = np.searchsorted(ends, positions, side="right")
        rows = positions - (ends - lengths)[which]
        pieces = [
            self.part(spans[index][0]).ids[spans[index][1] + rows[which == index]]
            for index in np.unique(which)
        ]
        return np.concatenate(pieces) if pieces else self.hot.ids[:0]

    def inputs(
        self, chosen: np.ndarray, block_size: int = 1 << 16, start: int = 0, stop: int | None = None
    ) -> Iterator[SampleBlock]:
        """The inputs that the boolean mask ``chosen`` (over the data, in its order) selects, in the
        data's order, ``block_size`` inputs of the data at a time (fewer chosen), with their original
        ids only: what a re-plan partitions again against its new hot set. ``start`` and ``stop``
        (None: the end) limit them to a run of the data (one rank's share)."""
        if len(chosen) != len(self.is_hot):
            raise ValueError(f"a mask of {len(chosen)} inputs for a partition of {len(self.is_hot)}")
        hot_before = int(np.count_nonzero(self.is_hot[:start]))
        before = {HOT: hot_before, COLD: start - hot_before}  # inputs of each part before the window
        for first in range(start, len(chosen) if stop is None else stop, block_size):
            hot = np.asarray(self.is_hot[first : first + block_size], dtype=bool)
            window = np.asarray(chosen[first : first + block_size], dtype=bool)
            pieces, order = [], []
            for part, mask in ((HOT, hot), (COLD, ~hot)):
                rows = before[part] + np.flatnonzero(window[mask])  # chosen rows of the part
                pieces.append(self.part(part).select(rows).without_part_ids())
                order.append(np.flatnonzero(mask & window))
                before[part] += int(np.count_nonzero(mask))
            block = SampleBlock.concat(pieces)
            if len(block):
                yield block.select(np.argsort(np.concatenate(order), kind="stable"))

    @classmethod
    def of(
        cls,
        blocks: Iterable[SampleBlock],
        hot_set: HotSet,
        keys: Sequence[str],
        balance: float = 0.0,
        seed: int = 0,
    ) -> HotColdPartition:
        """Partition in memory (``balance``: see the module docstring; ``seed`` draws its inputs)."""
        check_share(balance, "label balance")
        parts: dict[str, list[SampleBlock]] = {HOT: [], COLD: []}
        is_hot = []
        for index, block in enumerate(blocks):
            block, hot = _with_part_ids(block, hot_set, keys, balance, generator(seed, "balance", index))
            parts[HOT].append(block.select(hot))
            parts[COLD].append(block.select(~hot))
            is_hot.append(hot)
        if not parts[HOT]:
            raise ValueError("no inputs to partition")
        hot_part, cold_part = SampleBlock.concat(parts[HOT]), SampleBlock.concat(parts[COLD])
        return cls(hot_part, cold_part, np.concatenate(is_hot), tuple(keys), hot_set.digest)

    @classmethod
    def write(
        cls,
        blocks: Iterable[SampleBlock],
        hot_set: HotSet,
        keys: Sequence[str],
        directory: str | os.PathLike,
        total: int | None = None,
        balance: float = 0.0,
        seed: int = 0,
        progress: bool = False,
        first_block: int = 0,
    ) -> HotColdPartition:
        """Partition to ``directory`` block by block (memory stays one block), then open it
        (``balance`` and ``seed`` as in :meth:`of`; ``progress`` draws a bar over ``total`` inputs;
        ``first_block``: the number of the first block, where they are a share of the data)."""
        check_share(balance, "label balance")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)

        def appender(name: str, array: np.ndarray) -> NpyAppender:
            return NpyAppender(directory / f"{name}.npy", array.dtype, array.shape[1:])

        bar = _bar(total, progress)
        written = _write_blocks(blocks, hot_set, keys, appender, balance, seed, first_block, bar)
        ids_per_feature = written.ids_per_feature
        if ids_per_feature is None:
            raise ValueError("no inputs to partition")
        finish_partition(directory, keys, ids_per_feature, hot_set)
        return cls.open(directory)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> HotColdPartition:
        """A partition written by :meth:`write`, memory-mapped."""
        directory = Path(directory)
        meta = directory / "partition.json"
        if not meta.exists():
            raise FileNotFoundError(f"{meta}: missing; not a partition directory")
        described = json.loads(meta.read_text())
        for field, what in (("keys", "feature names"), ("hot_set", "digest of its hot set")):
            if field not in described:
                raise ValueError(
                    f"{meta}: no {what}; the partition was written by an older version, write it again"
                )
        ids_per_feature = tuple(described["ids_per_feature"])
        blocks = {
            part: SampleBlock(
                **{field: np.load(directory / f"{part}_{field}.npy", mmap_mode="r") for field in _FIELDS},
                ids_per_feature=ids_per_feature,
            )
            for part in PARTS
        }
        is_hot = directory / "is_hot.npy"
        if not is_hot.exists():
            raise FileNotFoundError(
                f"{is_hot}: missing; the partition was written by an older version, write it again"
            )
        try:
            return cls(
                blocks[HOT], blocks[COLD], np.load(is_hot, mmap_mode="r"), tuple(described["keys"]),
                described["hot_set"],
            )  # fmt: skip
        except ValueError as error:
            raise ValueError(f"{directory}: damaged partition: {error}") from error


@dataclass(frozen=True)
class PartitionShare:
    """Where one writer's share of the data goes in a partition that several write at once
    (:func:`write_share`): the rows before its own in the hot part, the cold part and the data
    (``is_hot``)."""

    hot: int
    cold: int
    inputs: int


@dataclass(frozen=True)
class WrittenShare:
    """What one writer of a share wrote (:func:`write_share`): per file (``is_hot``, ``{part}_{field}``)
    its dtype, row shape and rows written, and the ids per feature of its inputs (None: it had none)."""

    files: dict[str, tuple[np.dtype, tuple[int, ...], int]]
    ids_per_feature: tuple[int, ...] | None

    def layout(self) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...]]], tuple[int, ...] | None]:
        """Per file its dtype and row shape, and the ids per feature: alike for every writer of the same
        data."""
        return {name: (dtype, shape) for name, (dtype, shape, _) in self.files.items()}, self.ids_per_feature


def count_hot(
    blocks: Iterable[tuple[SampleBlock, np.ndarray]],
    hot_set: HotSet,
    keys: Sequence[str],
    balance: float = 0.0,
    seed: int = 0,
    first_block: int = 0,
) -> tuple[int, int]:
    """Of the inputs of ``blocks`` (per block of the data, a block and the mask of those it partitions),
    how many :meth:`HotColdPartition.write` sends to the hot part (``balance``, ``seed`` and
    ``first_block`` as it takes them) and how many there are, by the hot set's bitmap, without the remap
    or a copy of the inputs: where the writer of the share of the data after them starts."""
    layout, hot, inputs = hot_set.layout, 0, 0
    for index, (block, chosen) in enumerate(blocks, start=first_block):
        layout.check_features(block.ids, keys, block.ids_per_feature, chosen)
        tables = layout.column_tables(keys, block.ids_per_feature)
        all_hot = hot_set.all_hot_by_column(block.ids, tables)[chosen]
        rng = generator(seed, "balance", index)
        hot += int(np.count_nonzero(balanced(all_hot, block.labels[chosen], balance, rng)))
        inputs += len(all_hot)
    return hot, inputs


def create_partition(directory: str | os.PathLike) -> None:
    """A partition's files in ``directory``, empty, for :func:`write_share` writers to fill and
    :func:`finish_shares` to describe once every writer is done."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("is_hot", *(f"{part}_{field}" for part in PARTS for field in _FIELDS)):
        reserve_npy(directory / f"{name}.npy")


def allocate_fields(directory: Path, fields: FieldLayout, rows: int, prefix: str = "") -> None:
    """``{prefix}{field}.npy`` in ``directory`` per field of ``fields``, of ``rows`` rows, for
    ``NpyRegion`` writers to fill."""
    for field, (dtype, shape) in fields.items():
        allocate_npy(directory / f"{prefix}{field}.npy", dtype, (rows, *shape))


def fields_of(block: SampleBlock, fields: Sequence[str]) -> FieldLayout:
    """The dtype and row shape of each of ``block``'s ``fields``."""
    return {field: (getattr(block, field).dtype, getattr(block, field).shape[1:]) for field in fields}


def write_share(
    blocks: Iterable[SampleBlock],
    hot_set: HotSet,
    keys: Sequence[str],
    directory: str | os.PathLike,
    share: PartitionShare,
    balance: float = 0.0,
    seed: int = 0,
    first_block: int = 0,
    progress: bool = False,
) -> WrittenShare:
    """Write ``blocks``, one writer's share of the data (the first of them block ``first_block`` of
    all), into the files :func:`create_partition` made in ``directory``, where ``share`` says: the bytes
    that :meth:`HotColdPartition.write` of all the data writes there (``balance`` and ``seed`` as it
    takes them); what it wrote, for :func:`finish_shares`."""
    starts = {"is": share.inputs, HOT: share.hot, COLD: share.cold}

    def region(name: str, array: np.ndarray) -> NpyRegion:
        start = starts[name.split("_", 1)[0]]
        return NpyRegion(Path(directory) / f"{name}.npy", array.dtype, array.shape[1:], start)

    bar = _bar(None, progress)
    return _write_blocks(blocks, hot_set, keys, region, balance, seed, first_block, bar)


def finish_shares(
    directory: str | os.PathLike, written: Sequence[WrittenShare], keys: Sequence[str], hot_set: HotSet
) -> None:
    """Make ``directory``'s files, which ``written`` (every writer's :func:`write_share`, of the same
    fields) filled, a partition: the headers of every writer's rows, and its description."""
    wrote = [share for share in written if share.ids_per_feature is not None]
    if not wrote:
        raise ValueError("no inputs to partition")
    for name, (dtype, shape, _) in wrote[0].files.items():
        rows = sum(share.files[name][2] for share in wrote)
        write_npy_header(Path(directory) / f"{name}.npy", dtype, (rows, *shape))
    ids_per_feature = wrote[0].ids_per_feature
    assert ids_per_feature is not None  # a writer that wrote inputs
    finish_partition(directory, keys, ids_per_feature, hot_set)


def finish_partition(
    directory: str | os.PathLike, keys: Sequence[str], ids_per_feature: Sequence[int], hot_set: HotSet
) -> None:
    """Write the description that makes ``directory``'s files a partition (:meth:`HotColdPartition.open`)."""
    meta = {"ids_per_feature": list(ids_per_feature), "keys": list(keys), "hot_set": hot_set.digest}
    (Path(directory) / "partition.json").write_text(json.dumps(meta))


def _bar(total: int | None, progress: bool) -> tqdm:
    return tqdm(total=total, desc="partitioning", unit="input", unit_scale=True, leave=False,
                disable=not progress)  # fmt: skip


def _write_blocks(
    blocks: Iterable[SampleBlock],
    hot_set: HotSet,
    keys: Sequence[str],
    open_file: Callable[[str, np.ndarray], NpyAppender],
    balance: float,
    seed: int,
    first_block: int,
    bar: tqdm,
) -> WrittenShare:
    """Each block's inputs into the files ``open_file(name, first array)`` opens (``is_hot``, then
    ``{part}_{field}``), the hot part's the entirely hot ones, balanced."""
    writers: dict[str, NpyAppender] = {}

    def put(name: str, array: np.ndarray) -> None:
        if name not in writers:
            writers[name] = open_file(name, array)
        writers[name].append(array)

    ids_per_feature = None
    try:
        for index, block in enumerate(blocks, start=first_block):
            bar.update(len(block))
            ids_per_feature = block.ids_per_feature
            block, chosen = _with_part_ids(block, hot_set, keys, balance, generator(seed, "balance", index))
            put("is_hot", chosen)
            for part, inputs in ((HOT, block.select(chosen)), (COLD, block.select(~chosen))):
                for field in _FIELDS:
                    put(f"{part}_{field}", getattr(inputs, field))
    finally:
        bar.close()
        for writer in writers.values():
            writer.close()
    files = {name: (writer.dtype, writer.row_shape, writer.rows) for name, writer in writers.items()}
    return WrittenShare(files, ids_per_feature)


def balanced(hot: np.ndarray, labels: np.ndarray, balance: float, rng: np.random.Generator) -> np.ndarray:
    """``hot`` less a random share ``balance`` of its excess inputs of the label it over-represents:
    the inputs to take out so that the rest carry positives at the rate of all of ``labels``."""
    if balance == 0:  # the default: no count over the block
        return hot
    positive = labels != 0
    rate = float(positive.mean()) if len(labels) else 0.0
    if not 0 < rate < 1:
        return hot
    num_positive = int(np.count_nonzero(hot & positive))
    num_negative = int(np.count_nonzero(hot)) - num_positive
    if num_positive > rate * (num_positive + num_negative):
        majority, excess = hot & positive, num_positive - num_negative * rate / (1 - rate)
    else:
        majority, excess = hot & ~positive, num_negative - num_positive * (1 - rate) / rate
    out = hot.copy()
    out[rng.choice(np.flatnonzero(majority), round(balance * excess), replace=False)] = False
    return out


def _with_part_ids(
    block: SampleBlock, hot_set: HotSet, keys: Sequence[str], balance: float, rng: np.random.Generator
) -> tuple[SampleBlock, np.ndarray]:
    """``block`` with its part ids, and which of its inputs go to the hot part: the entirely hot ones
    (no negative part id), label-balanced by ``balance``."""
    block = with_part_ids(block, hot_set, keys)
    assert block.part_ids is not None  # just made
    return block, balanced(np.all(block.part_ids >= 0, axis=1), block.labels, balance, rng)


def with_part_ids(block: SampleBlock, hot_set: HotSet, keys: Sequence[str]) -> SampleBlock:
    """``block`` (features ``keys``) with the ids of ``hot_set``'s parts (``HotSet.signed_part_ids``)."""
    layout = hot_set.layout
    if sorted(keys) != sorted(layout.features):
        raise ValueError(f"batch features do not match the tables: {list(keys)} against {layout.features}")
    layout.check_features(block.ids, keys, block.ids_per_feature)
    tables = layout.column_tables(keys, block.ids_per_feature)
    part_ids = hot_set.signed_part_ids_by_column(block.ids, tables)
    return SampleBlock(block.dense, block.ids, block.labels, block.ids_per_feature, part_ids)
