"""The hot rows of each table, with vectorised lookups: is an id hot, where does it live, is an input hot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.stats.feature_ids import BatchLike, FeatureIds
from fae_torchrec.tables import TableLayout

#: The two parts every row, table and input falls into: names of the split module's EBCs, of the
#: partition's files and of the planner's parts.
HOT, COLD = "hot", "cold"
PARTS = (HOT, COLD)


@dataclass(frozen=True)
class HotSet:
    """Per table (in ``tables`` order) the sorted ids of its hot rows.

    Every row is in exactly one part: hot rows get hot ids ``0..H-1`` and cold rows cold ids
    ``0..C-1``, both in the order of the original ids.
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

    @property
    def num_hot(self) -> dict[str, int]:
        """Hot rows per table name."""
        return {c.name: len(ids) for c, ids in zip(self.tables, self.hot_ids, strict=True)}

    @property
    def total_hot(self) -> int:
        return sum(len(ids) for ids in self.hot_ids)

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

    def hot_mask(self, table: str | int) -> np.ndarray:
        """Boolean mask over all rows of ``table`` (name or index): True where the row is hot."""
        return self._masks[self.layout.index(table)]

    def is_hot(self, table: str | int, ids: np.ndarray) -> np.ndarray:
        """For ``ids`` of ``table`` (rows of it, not checked): whether each is hot. A binary search in
        the table's hot ids, so no mask of the table's size is built."""
        return self._search(self.layout.index(table), np.asarray(ids))[1]

    def _search(self, index: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ``ids`` of table ``index``: the hot rows below each (its hot id if it is hot), and
        whether it is hot."""
        hot_ids = self.hot_ids[index]
        if len(hot_ids) in (0, self.tables[index].num_embeddings):  # no row hot, or every row
            return (ids if len(hot_ids) else np.zeros_like(ids)), np.full(ids.shape, len(hot_ids) > 0)
        below = np.searchsorted(hot_ids, ids)
        return below, hot_ids[np.minimum(below, len(hot_ids) - 1)] == ids

    def is_hot_row(self, rows: np.ndarray) -> np.ndarray:
        """For global rows (table offset + id, as a holdout stores them): whether each is hot."""
        rows = np.asarray(rows)
        tables = self.layout.table_of_rows(rows)
        hot = np.zeros(rows.shape, dtype=bool)
        for t, offset in enumerate(self.layout.row_offsets[:-1]):
            in_table = tables == t
            hot[in_table] = self.is_hot(t, rows[in_table] - offset)
        return hot

    def remap(self, table: str | int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For original ``ids`` of ``table``: whether each is hot, and its id in its part.

        Raises ``ValueError`` naming the table and the id when an id is not a row of the table.
        """
        signed = self.signed_part_ids(table, ids)
        is_hot = signed >= 0
        return is_hot, np.where(is_hot, signed, ~signed)

    def signed_part_ids(self, table: str | int, ids: np.ndarray, feature: str | None = None) -> np.ndarray:
        """Original ``ids`` of ``table`` as ids in their part, in one signed array: hot id ``h`` as
        ``h``, cold id ``c`` as ``~c`` (``-c - 1``). What a partition stores, so that training splits
        a batch by sign instead of looking its ids up (``FAEEmbeddingBagCollection.split``).

        A binary search in the table's hot ids (no array of the table's size). Raises ``ValueError``
        naming the table (and ``feature``) and the id when an id is not a row of the table.
        """
        index = self.layout.index(table)
        ids = np.asarray(ids)
        self.layout.check_ids(index, ids.reshape(-1), feature=feature)
        hot_below, is_hot = self._search(index, ids)
        return np.where(is_hot, hot_below, ~(ids - hot_below))

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
