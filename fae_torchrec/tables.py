"""The embedding tables a profile or hot set describes, checked once and indexed for vectorised work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np
import torch
from torchrec.modules.embedding_configs import DATA_TYPE_NUM_BITS, EmbeddingBagConfig

from fae_torchrec.torchrec_compat import optimizer_multiplier


def row_bytes(config: EmbeddingBagConfig, optimizer_class: type[torch.optim.Optimizer] | None = None) -> int:
    """Bytes one row of ``config`` takes on the device: weights plus optimizer state.

    The optimizer-state share follows TorchRec's planner (``shard_estimators``), so that a hot-set
    budget and a TorchRec storage estimate agree: SGD adds nothing, Adam two copies of the row,
    RowWiseAdagrad one float per row, other optimizers one copy.
    """
    weight = config.embedding_dim * DATA_TYPE_NUM_BITS[config.data_type] // 8
    shape = torch.Size([config.num_embeddings, config.embedding_dim])
    return round(weight * (1 + optimizer_multiplier(optimizer_class, shape)))


@dataclass(frozen=True)
class TableLayout:
    """Tables in a fixed order, with the feature → table map that lookups and counts go through."""

    configs: tuple[EmbeddingBagConfig, ...]

    def __post_init__(self) -> None:
        if not self.configs:
            raise ValueError("no embedding tables given")
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        seen: dict[str, str] = {}
        for config in self.configs:
            if config.num_embeddings <= 0 or config.embedding_dim <= 0:
                raise ValueError(
                    f"table {config.name}: num_embeddings and embedding_dim must be positive, got "
                    f"{config.num_embeddings} and {config.embedding_dim}"
                )
            if not config.feature_names:
                raise ValueError(f"table {config.name}: no feature_names")
            for feature in config.feature_names:
                if feature in seen:
                    raise ValueError(f"feature {feature} is read by tables {seen[feature]} and {config.name}")
                seen[feature] = config.name

    @classmethod
    def of(cls, configs: Sequence[EmbeddingBagConfig]) -> TableLayout:
        return cls(tuple(configs))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.configs]

    @property
    def features(self) -> list[str]:
        return [f for c in self.configs for f in c.feature_names]

    @property
    def num_rows(self) -> np.ndarray:
        return np.array([c.num_embeddings for c in self.configs], dtype=np.int64)

    @property
    def id_dtype(self) -> np.dtype:
        """The narrowest integer type of these tables' ids and signed part ids (``HotSet.signed_part_ids``,
        from ``-rows`` to ``rows - 1``): int32 where every table has at most 2^31 rows, as TorchRec's
        Criteo npy files store them, else int64."""
        fits = int(self.num_rows.max()) <= 1 << 31
        return np.dtype(np.int32 if fits else np.int64)

    @cached_property
    def row_offsets(self) -> np.ndarray:
        """Global row of each table's row 0 (and the total as the last entry): global row ``offset +
        id`` numbers the rows of all tables in one array."""
        return np.concatenate([[0], np.cumsum(self.num_rows)])

    def table_slices(self, rows: np.ndarray) -> list[slice]:
        """For ascending global rows, the slice of ``rows`` that falls in each table."""
        bounds = np.searchsorted(rows, self.row_offsets)
        return [slice(int(a), int(b)) for a, b in pairwise(bounds)]

    def table_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Table index of each global row."""
        return np.searchsorted(self.row_offsets, rows, side="right") - 1

    @cached_property
    def _table_index(self) -> dict[str, int]:
        return {f: i for i, c in enumerate(self.configs) for f in c.feature_names}

    def table_of(self, feature: str) -> int:
        """Index of the table that ``feature`` reads."""
        if feature not in self._table_index:
            raise KeyError(f"feature {feature} is not read by any table ({self.names})")
        return self._table_index[feature]

    def column_tables(self, keys: Sequence[str], ids_per_feature: Sequence[int]) -> np.ndarray:
        """The table index of each id column of a block whose columns are ``ids_per_feature`` ids of each
        of ``keys`` in turn."""
        return np.repeat([self.table_of(key) for key in keys], ids_per_feature)

    def check_ids(self, table: int, ids: np.ndarray, feature: str | None = None) -> None:
        """Raise ``ValueError`` naming the table (and feature) and an id unless all ``ids`` are rows."""
        config = self.configs[table]
        if len(ids) == 0 or (ids.min() >= 0 and ids.max() < config.num_embeddings):
            return
        bad = (ids < 0) | (ids >= config.num_embeddings)
        where = f"feature {feature} (table {config.name})" if feature else f"table {config.name}"
        raise ValueError(
            f"{where}: id {int(ids[np.argmax(bad)])} out of range [0, {config.num_embeddings}) "
            f"({int(bad.sum())} ids out of range)"
        )

    def check_features(
        self,
        block_ids: np.ndarray,
        keys: Sequence[str],
        ids_per_feature: Sequence[int],
        inputs: np.ndarray | None = None,
    ) -> None:
        """:meth:`check_ids` of a block's ids (columns: ``ids_per_feature`` of each of ``keys`` in turn;
        the inputs the mask ``inputs`` selects, None: all) in one pass over the block, feature by
        feature only to name one that fails."""
        tables = self.column_tables(keys, ids_per_feature)
        bad = (block_ids < 0) | (block_ids >= self.num_rows[tables])
        if inputs is not None:
            bad &= inputs[:, None]
        if not bad.any():
            return
        bounds = np.concatenate([[0], np.cumsum(ids_per_feature)])
        rows = slice(None) if inputs is None else inputs
        for f, key in enumerate(keys):
            self.check_ids(self.table_of(key), block_ids[rows, bounds[f] : bounds[f + 1]].reshape(-1), key)

    def index(self, table: str | int) -> int:
        """Position of ``table`` (a name or an index), checked."""
        if isinstance(table, str):
            if table not in self.names:
                raise KeyError(f"no table {table!r} (tables: {self.names})")
            return self.names.index(table)
        if not 0 <= table < len(self.configs):
            raise IndexError(f"table index {table} out of range [0, {len(self.configs)})")
        return table

    def row_bytes(self, optimizer_class: type[torch.optim.Optimizer] | None = None) -> np.ndarray:
        """Per-table bytes of one row (see :func:`row_bytes`)."""
        return np.array([row_bytes(c, optimizer_class) for c in self.configs], dtype=np.int64)

    def describe(self) -> list[tuple[str, int, int, tuple[str, ...]]]:
        """(name, rows, dim, features) per table: what must agree between a stats file and a model."""
        return [(c.name, c.num_embeddings, c.embedding_dim, tuple(c.feature_names)) for c in self.configs]
