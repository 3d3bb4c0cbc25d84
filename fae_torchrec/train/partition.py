"""FAE's offline step: a data set split once into its entirely-hot inputs and the others.

Inputs keep their order within each part. Each input's ids are stored twice: as they are (``ids``)
and as FAE's parts number them (``part_ids``, ``HotSet.signed_part_ids``), remapped here once so that
training splits its batches by sign, with no lookup in the hot set (FAE's offline remap); both in int32
where every table has at most 2^31 rows (``TableLayout.id_dtype``: half the bytes). A partition
lives in memory or in a directory of ``.npy`` files (``hot_dense.npy``, ``hot_ids.npy``,
``hot_part_ids.npy``, ``hot_labels.npy``, the same for ``cold``, and ``is_hot.npy``, which inputs of the
data went to the hot part), written chunk by chunk while the data streams past, and read back
memory-mapped. Where several ranks write a partition at once, each writes its share of the data into
files of its own (``share-R``, rank ``R``'s), and the partition reads them one after another
(``RowChain``): no writer waits for the others to count where its rows go.

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
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fae_torchrec.checks import check_share
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.npy_append import NpyFolder
from fae_torchrec.data.row_chain import chain_rows, count_nonzero
from fae_torchrec.seeds import generator
from fae_torchrec.stats.hot_set import COLD, HOT, PARTS, HotSet

_FIELDS = ("dense", "ids", "labels", "part_ids")
#: The files of a partition (or of one writer's share of it), without ``.npy``.
#: How a partition's cold part ids number the rows (``partition.json``): by their original ids, as the
#: cold part keeps every row at its id (a partition written before numbered them among the cold rows).
COLD_IDS = "original"
_FILES = ("is_hot", *(f"{part}_{field}" for part in PARTS for field in _FIELDS))
#: The folder of rank ``R``'s share of a partition that several ranks wrote.
SHARE = "share-{}"


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
        marked = count_nonzero(self.is_hot)
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
        hot_before = count_nonzero(self.is_hot, start)
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
        written = write_files(blocks, hot_set, keys, directory, balance, seed, first_block, progress, total)
        if written.ids_per_feature is None:
            raise ValueError("no inputs to partition")
        finish_partition(directory, keys, written.ids_per_feature, hot_set)
        return cls.open(directory)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> HotColdPartition:
        """A partition written by :meth:`write`, or by several ranks (:func:`finish_shares`),
        memory-mapped."""
        directory = Path(directory)
        meta = directory / "partition.json"
        if not meta.exists():
            raise FileNotFoundError(f"{meta}: missing; not a partition directory")
        described = json.loads(meta.read_text())
        for field, what in (
            ("keys", "feature names"),
            ("hot_set", "digest of its hot set"),
            ("cold_ids", "cold ids kept as the original ids"),
        ):
            if field not in described or (field == "cold_ids" and described[field] != COLD_IDS):
                raise ValueError(
                    f"{meta}: no {what}; the partition was written by an older version, write it again"
                )
        ids_per_feature = tuple(described["ids_per_feature"])
        opened = [_open_files(directory / name) for name in described.get("shares", ["."])]

        def chained(name: str) -> np.ndarray:
            return chain_rows([files[name] for files in opened])

        try:
            blocks = {
                part: SampleBlock(
                    **{field: chained(f"{part}_{field}") for field in _FIELDS},
                    ids_per_feature=ids_per_feature,
                )
                for part in PARTS
            }
            return cls(
                blocks[HOT], blocks[COLD], chained("is_hot"), tuple(described["keys"]), described["hot_set"]
            )
        except ValueError as error:
            raise ValueError(f"{directory}: damaged partition: {error}") from error


def _open_files(folder: Path) -> dict[str, np.ndarray]:
    """The files of a partition, or of one writer's share of it, in ``folder``, memory-mapped."""
    is_hot = folder / "is_hot.npy"
    if not is_hot.exists():
        raise FileNotFoundError(
            f"{is_hot}: missing; the partition was written by an older version, write it again"
        )
    return {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _FILES}


@dataclass(frozen=True)
class WrittenShare:
    """What one writer wrote (:func:`write_files`): per file (``is_hot``, ``{part}_{field}``)
    its dtype, row shape and rows written, and the ids per feature of its inputs (None: it had none)."""

    files: dict[str, tuple[np.dtype, tuple[int, ...], int]]
    ids_per_feature: tuple[int, ...] | None

    def layout(self) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...]]], tuple[int, ...] | None]:
        """Per file its dtype and row shape, and the ids per feature: alike for every writer of the same
        data."""
        return {name: (dtype, shape) for name, (dtype, shape, _) in self.files.items()}, self.ids_per_feature


def write_files(
    blocks: Iterable[SampleBlock],
    hot_set: HotSet,
    keys: Sequence[str],
    directory: str | os.PathLike,
    balance: float = 0.0,
    seed: int = 0,
    first_block: int = 0,
    progress: bool = False,
    total: int | None = None,
) -> WrittenShare:
    """Partition ``blocks`` (the first of them block ``first_block`` of the data: the label balance's
    draws) into the files of ``directory``, block by block (memory stays one block), as
    :meth:`HotColdPartition.write` does (``balance``, ``seed``, ``progress`` and ``total`` as it takes
    them), without describing them: the files of one writer's share, or of a whole partition."""
    check_share(balance, "label balance")
    files = NpyFolder(Path(directory))
    return _write_blocks(blocks, hot_set, keys, files, balance, seed, first_block, _bar(total, progress))


def finish_shares(
    directory: str | os.PathLike, written: Sequence[WrittenShare], keys: Sequence[str], hot_set: HotSet
) -> None:
    """Make the shares that ``written`` (every rank's :func:`write_files` into ``directory``'s
    ``SHARE`` folder, in rank order, of the same fields) wrote one partition: their description, naming
    the shares that hold inputs in order."""
    shares = [SHARE.format(rank) for rank, share in enumerate(written) if share.ids_per_feature is not None]
    if not shares:
        raise ValueError("no inputs to partition")
    ids_per_feature = next(share.ids_per_feature for share in written if share.ids_per_feature is not None)
    finish_partition(directory, keys, ids_per_feature, hot_set, shares)


def clear_partition(directory: str | os.PathLike) -> None:
    """Remove the partition an earlier run wrote to ``directory`` (its description first, so that no
    half-written one opens; one process's files or several ranks' shares), before it is written again."""
    directory = Path(directory)
    for path in (directory / "partition.json", *(directory / f"{name}.npy" for name in _FILES)):
        path.unlink(missing_ok=True)
    for folder in directory.glob(SHARE.format("*")):
        shutil.rmtree(folder)


def finish_partition(
    directory: str | os.PathLike,
    keys: Sequence[str],
    ids_per_feature: Sequence[int],
    hot_set: HotSet,
    shares: Sequence[str] | None = None,
) -> None:
    """Write the description that makes ``directory``'s files a partition (:meth:`HotColdPartition.open`),
    or the files of its folders ``shares``, one after another."""
    meta: dict = {
        "ids_per_feature": list(ids_per_feature),
        "keys": list(keys),
        "hot_set": hot_set.digest,
        "cold_ids": COLD_IDS,
    }
    if shares is not None:
        meta["shares"] = list(shares)
    (Path(directory) / "partition.json").write_text(json.dumps(meta))


def _bar(total: int | None, progress: bool) -> tqdm:
    return tqdm(total=total, desc="partitioning", unit="input", unit_scale=True, leave=False,
                disable=not progress)  # fmt: skip


def _write_blocks(
    blocks: Iterable[SampleBlock],
    hot_set: HotSet,
    keys: Sequence[str],
    files: NpyFolder,
    balance: float,
    seed: int,
    first_block: int,
    bar: tqdm,
) -> WrittenShare:
    """Each block's inputs into ``files`` (``is_hot``, then ``{part}_{field}``), the hot part's the
    entirely hot ones, balanced."""
    ids_per_feature = None
    try:
        for index, block in enumerate(blocks, start=first_block):
            bar.update(len(block))
            ids_per_feature = block.ids_per_feature
            block, chosen = _with_part_ids(block, hot_set, keys, balance, generator(seed, "balance", index))
            files.append("is_hot", chosen)
            for part, inputs in ((HOT, block.select(chosen)), (COLD, block.select(~chosen))):
                for field in _FIELDS:
                    files.append(f"{part}_{field}", getattr(inputs, field))
    finally:
        bar.close()
        files.close()
    written = {name: (file.dtype, file.row_shape, file.rows) for name, file in files.files.items()}
    return WrittenShare(written, ids_per_feature)


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
    """``block`` (features ``keys``) with the ids of ``hot_set``'s parts (``HotSet.signed_part_ids``), both
    of the tables' ``id_dtype``: a partition of tables under 2^31 rows stores half the bytes of int64
    (batches are int64 again, ``SampleBlock.to_batch``)."""
    layout = hot_set.layout
    if sorted(keys) != sorted(layout.features):
        raise ValueError(f"batch features do not match the tables: {list(keys)} against {layout.features}")
    ids = np.asarray(block.ids)  # read whole where several files hold them (``RowChain``)
    layout.check_features(ids, keys, block.ids_per_feature)
    tables = layout.column_tables(keys, block.ids_per_feature)
    part_ids = hot_set.signed_part_ids_by_column(ids, tables)
    ids = ids.astype(layout.id_dtype, copy=False)
    return SampleBlock(block.dense, ids, block.labels, block.ids_per_feature, part_ids)
