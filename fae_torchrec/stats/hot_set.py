"""The hot rows of each table, with vectorised lookups: is an id hot, where does it live, is an input hot."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.stats.feature_ids import BatchLike, FeatureIds
from fae_torchrec.tables import TableLayout


class Part(StrEnum):
    """The two parts every row, table and input falls into: names of the split module's EBCs, of the
    partition's files and of the planner's parts."""

    HOT = "hot"
    COLD = "cold"


HOT, COLD = Part.HOT, Part.COLD
PARTS = tuple(Part)
#: The warning of a budget that makes every input hot (``profile``, the training recipe).
EVERYTHING_HOT = (
    "every input is hot (the hot set holds every row, or the hot-input share is 100%%): FAE then trains "
    "hot steps only, as TorchRec would with every table in device memory; choose a budget below %s"
)
#: ``HotRowIndex.table_kind``: a table with hot and cold rows, every row hot, no row hot.
SPLIT, ALL_HOT, ALL_COLD = 0, 1, 2


@dataclass(frozen=True)
class HotRowIndex:
    """The hot rows of every table in one sorted tensor of global rows (table offset + id), so that the
    ids of any tables are told hot or cold and numbered in their part by one ``searchsorted``, in torch
    on any device (a hot row by its rank among its table's hot rows; a cold row keeps its id): the one
    remap of FAE, behind ``HotSet``'s numpy methods and the split module's.

    Only tables with rows in both parts are in ``hot_rows`` (their kind ``SPLIT``), followed by the
    number of all rows as a sentinel so that a search lands on a valid index; a table entirely hot or
    cold keeps its ids, with no memory spent on it. ``hot_offsets`` says where each table's hot rows
    start in ``hot_rows``, ``row_offsets`` where its rows start among all rows."""

    hot_rows: torch.Tensor
    row_offsets: torch.Tensor
    hot_offsets: torch.Tensor
    table_kind: torch.Tensor

    @classmethod
    def of(cls, hot_set: HotSet) -> HotRowIndex:
        layout = hot_set.layout
        num_hot = np.array([len(ids) for ids in hot_set.hot_ids], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(layout.num_rows)])
        split = (num_hot > 0) & (num_hot < layout.num_rows)
        hot_rows = [ids + offsets[t] for t, ids in enumerate(hot_set.hot_ids) if split[t]] + [offsets[-1:]]
        looked_up = np.where(split, num_hot, 0)
        kind = np.where(num_hot == 0, ALL_COLD, np.where(split, SPLIT, ALL_HOT))
        return cls(
            torch.from_numpy(np.concatenate(hot_rows).astype(np.int64)),
            torch.from_numpy(offsets[:-1].astype(np.int64)),
            torch.from_numpy((np.cumsum(looked_up) - looked_up).astype(np.int64)),
            torch.from_numpy(kind.astype(np.int64)),
        )

    def part_ids(self, ids: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each id of ``ids`` (a row of table ``tables[i]``, not checked) as its id in its part, and
        whether it is hot; on the ids' device (where this index's tensors must be)."""
        rows = ids + self.row_offsets[tables]
        position = torch.searchsorted(self.hot_rows, rows)
        kind = self.table_kind[tables]
        is_hot = torch.where(kind == SPLIT, self.hot_rows[position] == rows, kind == ALL_HOT)
        # a hot id: the hot rows of its table below it (an entirely hot table's ids are their hot ids)
        hot_id = torch.where(kind == SPLIT, position - self.hot_offsets[tables], ids)
        return torch.where(is_hot, hot_id, ids), is_hot

    def to(self, device: torch.device) -> HotRowIndex:
        return HotRowIndex(
            *(t.to(device) for t in (self.hot_rows, self.row_offsets, self.hot_offsets, self.table_kind))
        )


@dataclass(frozen=True)
class HotSet:
    """Per table (in ``tables`` order) the sorted ids of its hot rows.

    Hot rows get hot ids ``0..H-1`` in the order of the original ids; cold rows keep their ids in the
    cold part, whose tables keep every row (``FAEEmbeddingBagCollection``), so that a re-plan moves
    only the rows that change part and no cold row changes place.
    """

    tables: tuple[EmbeddingBagConfig, ...]
    hot_ids: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if len(self.hot_ids) != len(self.tables):
            raise ValueError(f"{len(self.hot_ids)} hot id arrays for {len(self.tables)} tables")
        for config, ids in zip(self.tables, self.hot_ids, strict=True):
            if ids.ndim != 1 or (len(ids) and (ids[0] < 0 or ids[-1] >= config.num_embeddings)):
                raise ValueError(f"table {config.name}: hot ids outside [0, {config.num_embeddings})")
            if np.any(ids[1:] <= ids[:-1]):  # no np.diff: an int64 array of the table's size
                raise ValueError(f"table {config.name}: hot ids must be sorted and unique")

    @classmethod
    def everything(cls, tables: Sequence[EmbeddingBagConfig]) -> HotSet:
        """Every row hot. Each table's ids ``0..n-1`` are a read-only prefix of one ``arange`` as
        long as the largest table: the memory of one table, not of all."""
        ids = np.arange(max((t.num_embeddings for t in tables), default=0))
        ids.flags.writeable = False
        return cls(tuple(tables), tuple(ids[: t.num_embeddings] for t in tables))

    @cached_property
    def layout(self) -> TableLayout:
        return TableLayout(self.tables)

    @cached_property
    def digest(self) -> str:
        """A fingerprint of the tables and each table's hot ids: a partition records the one its part ids
        were made with, and a split module of another hot set refuses it (its part ids would name other
        rows)."""
        fingerprint = hashlib.sha256(repr(self.layout.describe()).encode())
        fingerprint.update(np.array([len(ids) for ids in self.hot_ids], dtype=np.int64).tobytes())
        for ids in self.hot_ids:
            fingerprint.update(np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        return fingerprint.hexdigest()[:16]

    @property
    def num_hot(self) -> dict[str, int]:
        """Hot rows per table name."""
        return {c.name: len(ids) for c, ids in zip(self.tables, self.hot_ids, strict=True)}

    @property
    def total_hot(self) -> int:
        return sum(len(ids) for ids in self.hot_ids)

    @property
    def holds_every_row(self) -> bool:
        """Whether every row of every table is hot: every input is then hot, and FAE does nothing."""
        return bool(self._entirely_hot.all())

    def hot_bytes(self, optimizer_class: type[torch.optim.Optimizer] | None = None) -> int:
        """Bytes of all hot rows, optimizer state included."""
        sizes = np.array([len(ids) for ids in self.hot_ids], dtype=np.int64)
        return int(sizes @ self.layout.row_bytes(optimizer_class))

    @cached_property
    def _masks(self) -> list[np.ndarray]:
        masks = []
        for config, ids in zip(self.tables, self.hot_ids, strict=True):
            mask = np.zeros(config.num_embeddings, dtype=bool)
            mask[ids] = True
            masks.append(mask)
        return masks

    @cached_property
    def _row_bits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every table's hot rows as one bitmap of global rows (table offset + id), 64 rows a word; the
        hot rows before each word; the hot rows before each table's. A quarter of a byte a row (8 MiB at
        Criteo Kaggle's 33.8M rows), so that several processes' copies stay in a shared cache, where a
        search of the hot rows (``index``) reads a sorted array of 8 bytes a hot row, ~22 times an id.
        Built from the hot rows alone, never a byte a row (32 MiB at Kaggle's rows, for a moment)."""
        offsets = self.layout.row_offsets
        rows = np.concatenate([ids + offsets[t] for t, ids in enumerate(self.hot_ids)] + [[]]).astype(
            np.uint64
        )
        words = np.zeros(-(-int(offsets[-1]) // 64), dtype=np.uint64)
        if len(rows):  # ascending and unique (each table's hot ids are): each word's rows are a run
            word = rows >> np.uint64(6)
            first = np.flatnonzero(np.concatenate([[True], word[1:] != word[:-1]]))
            # one word's bits are distinct: their sum is their union
            words[word[first]] = np.add.reduceat(np.left_shift(np.uint64(1), rows & np.uint64(63)), first)
        counts = np.bitwise_count(words)
        before = counts.astype(np.int64)
        np.cumsum(before, out=before)  # in place: no second array of the words' size
        before -= counts
        num_hot = np.array([len(ids) for ids in self.hot_ids], dtype=np.int64)
        return words, before, np.cumsum(num_hot) - num_hot

    def _bits_of(self, ids: np.ndarray, tables: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a 2-D array whose column ``c`` holds ids of table ``tables[c]`` (rows of it, not
        checked): each id's word of :attr:`_row_bits`, that word, and the id's bit in it."""
        rows = (ids + self.layout.row_offsets[np.asarray(tables)]).astype(np.uint64)
        word = rows >> np.uint64(6)
        return word, self._row_bits[0][word], rows & np.uint64(63)

    def all_hot_by_column(self, ids: np.ndarray, tables: np.ndarray) -> np.ndarray:
        """For a 2-D array whose column ``c`` holds ids of table ``tables[c]`` (rows of it, not
        checked): whether each row's ids are all hot (one look-up an id in :attr:`_row_bits`, none in
        a column of an entirely hot table)."""
        columns = self._partly_hot_columns(tables)
        _, held, bit = self._bits_of(ids[:, columns], np.asarray(tables)[columns])
        return ((held >> bit) & np.uint64(1)).astype(bool).all(axis=1)

    @cached_property
    def _entirely_hot(self) -> np.ndarray:
        """Whether each table's rows are all hot."""
        return np.array(
            [len(ids) == c.num_embeddings for ids, c in zip(self.hot_ids, self.tables, strict=True)],
            dtype=bool,
        )

    def _partly_hot_columns(self, tables: np.ndarray) -> np.ndarray:
        """The columns of tables ``tables`` (one per column) whose table has cold rows."""
        return np.flatnonzero(~self._entirely_hot[np.asarray(tables)])

    def hot_mask(self, table: str | int) -> np.ndarray:
        """Boolean mask over all rows of ``table`` (name or index): True where the row is hot."""
        return self._masks[self.layout.index(table)]

    @cached_property
    def index(self) -> HotRowIndex:
        """The hot rows of every table in one sorted tensor (:class:`HotRowIndex`)."""
        return HotRowIndex.of(self)

    def is_hot(self, table: str | int, ids: np.ndarray) -> np.ndarray:
        """For ``ids`` of ``table`` (rows of it, not checked): whether each is hot. A binary search in
        the hot rows, so no mask of the table's size is built."""
        return self._part_ids(self.layout.index(table), np.asarray(ids))[1]

    def _part_ids(self, index: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ``ids`` of table ``index``: each one's id in its part, and whether it is hot
        (:meth:`HotRowIndex.part_ids`, on the ids' memory)."""
        values = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).reshape(-1)
        part, hot = self.index.part_ids(values, torch.full_like(values, index))
        return part.numpy().reshape(np.shape(ids)), hot.numpy().reshape(np.shape(ids))

    def is_hot_row(self, rows: np.ndarray) -> np.ndarray:
        """For global rows (table offset + id, as a holdout stores them): whether each is hot."""
        global_rows = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        tables = torch.from_numpy(np.asarray(self.layout.table_of_rows(global_rows.numpy()), dtype=np.int64))
        return self.index.part_ids(global_rows - self.index.row_offsets[tables], tables)[1].numpy()

    def remap(self, table: str | int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For original ``ids`` of ``table``: whether each is hot, and its id in its part.

        Raises ``ValueError`` naming the table and the id when an id is not a row of the table.
        """
        part, is_hot = self._checked_part_ids(table, ids)
        return is_hot, part

    def signed_part_ids(self, table: str | int, ids: np.ndarray, feature: str | None = None) -> np.ndarray:
        """Original ``ids`` of ``table`` as ids in their part, in one signed array: hot id ``h`` as
        ``h``, cold id ``c`` as ``~c`` (``-c - 1``). What a partition stores, so that training splits
        a batch by sign instead of looking its ids up (``FAEEmbeddingBagCollection.split``).

        A binary search in the hot rows (no array of the table's size). Raises ``ValueError``
        naming the table (and ``feature``) and the id when an id is not a row of the table.
        """
        part, is_hot = self._checked_part_ids(table, ids, feature)
        return np.where(is_hot, part, ~part)

    def signed_part_ids_by_column(self, ids: np.ndarray, tables: np.ndarray) -> np.ndarray:
        """:meth:`signed_part_ids` of a 2-D array whose column ``c`` holds ids of table ``tables[c]``
        (rows of it, not checked), a block of inputs at a time, by the bitmap of hot rows (an entirely
        hot table's ids are their hot ids: its columns are copied), in the tables' ``id_dtype``."""
        columns = self._partly_hot_columns(tables)
        signed = ids.astype(self.layout.id_dtype)
        ids, tables = ids[:, columns], np.asarray(tables)[columns]
        word, held, bit = self._bits_of(ids, tables)
        _, before, table_before = self._row_bits
        below = np.bitwise_count(held & ((np.uint64(1) << bit) - np.uint64(1))).astype(np.int64)
        hot_before = before[word] + below - table_before[tables]  # its table's, before it
        signed[:, columns] = np.where((held >> bit) & np.uint64(1), hot_before, ~ids)
        return signed

    def _checked_part_ids(
        self, table: str | int, ids: np.ndarray, feature: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_part_ids` of ``ids`` once they are checked to be rows of ``table``."""
        index = self.layout.index(table)
        ids = np.asarray(ids)
        self.layout.check_ids(index, ids.reshape(-1), feature=feature)
        return self._part_ids(index, ids)

    def is_hot_input(self, data: BatchLike) -> np.ndarray:
        """Per input of a batch: True when every id it carries, in every feature, is hot.

        Raises ``ValueError`` when the batch's features are not the tables' or an id is out of range.
        """
        ids = FeatureIds.of(data)
        ids.check(self.layout)
        hot = np.ones(ids.stride, dtype=bool)
        for key, values in ids.values.items():
            cold = ~self._masks[self.layout.table_of(key)][values]
            if cold.any():
                hot[ids.input_index(key)[cold]] = False
        return hot
