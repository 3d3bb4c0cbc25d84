"""What a profile found: per-table access counts of the sampled inputs, and a holdout of unseen inputs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.hot_set import HotSet
from fae_torchrec.ranking import RowRanking
from fae_torchrec.tables import TableLayout


@dataclass(frozen=True)
class Holdout:
    """Inputs left out of the sample: their global rows, and for each row the input it belongs to.

    A global row is ``table offset + id``, tables in order, so one array serves all tables. Inputs
    are numbered ``0..num_inputs-1``; one that carries no id has no row but still counts.
    """

    rows: np.ndarray
    owners: np.ndarray
    num_inputs: int

    def __len__(self) -> int:
        return self.num_inputs


@dataclass(frozen=True)
class AccessStats:
    """Access counts per row of each table, from ``num_sampled`` of ``num_inputs`` inputs."""

    tables: tuple[EmbeddingBagConfig, ...]
    counts: tuple[np.ndarray, ...]
    num_inputs: int
    num_sampled: int
    holdout: Holdout

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.tables):
            raise ValueError(f"{len(self.counts)} count arrays for {len(self.tables)} tables")
        for config, counts in zip(self.tables, self.counts, strict=True):
            if counts.shape != (config.num_embeddings,):
                raise ValueError(
                    f"table {config.name}: counts of shape {counts.shape}, "
                    f"expected ({config.num_embeddings},)"
                )

    @cached_property
    def layout(self) -> TableLayout:
        return TableLayout(self.tables)

    @property
    def sample_fraction(self) -> float:
        return self.num_sampled / self.num_inputs

    @cached_property
    def row_offsets(self) -> np.ndarray:
        """Global row of each table's row 0 (and the total as the last entry)."""
        return np.concatenate([[0], np.cumsum(self.layout.num_rows)])

    def ranking(self, optimizer_class: type[torch.optim.Optimizer] | None = None) -> RowRanking:
        """All sampled rows ranked together, with row costs for ``optimizer_class``."""
        return RowRanking(self, optimizer_class)

    def hot_set(
        self, budget_bytes: int, optimizer_class: type[torch.optim.Optimizer] | None = None
    ) -> HotSet:
        """FAE's hot set: the most accessed rows of all tables that fit ``budget_bytes``.

        A row costs its weights plus its ``optimizer_class`` state (TorchRec's accounting). A budget
        of 0 gives no hot row; a budget that holds every table makes every row hot; below that, a row
        never seen in the sample is never hot.
        """
        return self.ranking(optimizer_class).hot_set(budget_bytes)

    def hot_set_by_share(self, threshold: float = 0.001) -> HotSet:
        """The per-table alternative: rows with at least ``threshold`` of their table's accesses."""
        return self.ranking().hot_set_by_share(threshold)

    def with_embedding_dim(self, embedding_dim: int) -> AccessStats:
        """The same counts for tables of another embedding dimension (counts do not depend on it)."""
        tables = tuple(replace(t, embedding_dim=embedding_dim) for t in self.tables)
        return replace(self, tables=tables)

    def table_accesses(self) -> np.ndarray:
        """Sampled accesses per table."""
        return np.array([c.sum() for c in self.counts], dtype=np.int64)

    def table_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Table index of each global row."""
        return np.searchsorted(self.row_offsets, rows, side="right") - 1

    def save(self, path: str | os.PathLike) -> None:
        """Write everything to one compressed npz file at exactly ``path`` (tables as JSON, counts,
        holdout)."""
        with open(path, "wb") as file:
            np.savez_compressed(
                file,
                tables=np.array(json.dumps(self.layout.describe())),
                num_inputs=self.num_inputs,
                num_sampled=self.num_sampled,
                holdout_rows=self.holdout.rows,
                holdout_owners=self.holdout.owners,
                holdout_inputs=self.holdout.num_inputs,
                **{f"counts_{i}": c for i, c in enumerate(self.counts)},
            )

    @classmethod
    def load(cls, path: str | os.PathLike, tables: list[EmbeddingBagConfig] | None = None) -> AccessStats:
        """Read a ``.npz`` written by :meth:`save`.

        With ``tables``, raise ``ValueError`` unless the file describes exactly those tables (names,
        rows, dims and features, in order); the stats are then tied to these config objects.
        """
        with np.load(path) as data:
            described = [
                (name, rows, dim, tuple(features))
                for name, rows, dim, features in json.loads(str(data["tables"]))
            ]
            if tables is None:
                tables = [
                    EmbeddingBagConfig(
                        name=name, num_embeddings=rows, embedding_dim=dim, feature_names=list(f)
                    )
                    for name, rows, dim, f in described
                ]
            else:
                _check_same_tables(path, described, TableLayout.of(tables).describe())
            return cls(
                tables=tuple(tables),
                counts=tuple(data[f"counts_{i}"] for i in range(len(described))),
                num_inputs=int(data["num_inputs"]),
                num_sampled=int(data["num_sampled"]),
                holdout=Holdout(
                    rows=data["holdout_rows"],
                    owners=data["holdout_owners"],
                    num_inputs=int(data["holdout_inputs"]),
                ),
            )


def _check_same_tables(path: str | os.PathLike, in_file: list, in_model: list) -> None:
    """Raise, naming the first table that differs, unless both describe the same tables."""
    if in_file == in_model:
        return
    for index, (a, b) in enumerate(zip(in_file, in_model, strict=False)):
        if a != b:
            raise ValueError(
                f"{path}: statistics are for other tables: table #{index} is "
                f"(name, rows, dim, features)={a} in the file but {b} in the model"
            )
    raise ValueError(
        f"{path}: statistics are for other tables: the file has {len(in_file)} tables, "
        f"the model {len(in_model)}"
    )
