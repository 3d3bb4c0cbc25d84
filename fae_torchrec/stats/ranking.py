"""FAE's hot-row rules: rank the rows of all tables together by sampled count and fill a budget."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.tables import TableLayout


@dataclass(frozen=True)
class RowRanking:
    """The rows seen in the sample, most accessed first; ties go to the earlier table, then lower id.

    ``rows`` are global (``table offset + id``), made by :meth:`of_counted` from a sample's counts
    (``AccessStats.ranking``). A row never seen in the sample is not ranked, so it is hot only when
    the budget holds every row of every table.
    """

    rows: np.ndarray
    layout: TableLayout
    holdout: Holdout
    optimizer_class: type[torch.optim.Optimizer] | None = None

    @classmethod
    def of_counted(
        cls,
        rows: np.ndarray,
        counts: np.ndarray,
        layout: TableLayout,
        holdout: Holdout,
        optimizer_class: type[torch.optim.Optimizer] | None = None,
    ) -> RowRanking:
        """The ranking of the global ``rows`` (ascending, each once) counted ``counts`` times (above 0)."""
        return cls(rows[np.argsort(-counts, kind="stable")], layout, holdout, optimizer_class)

    @cached_property
    def tables(self) -> np.ndarray:
        """Table index of each ranked row."""
        return self.layout.table_of_rows(self.rows)

    @cached_property
    def cumulative_bytes(self) -> np.ndarray:
        """Bytes of the first ``k + 1`` ranked rows, for every ``k``."""
        return np.cumsum(self.layout.row_bytes(self.optimizer_class)[self.tables])

    @property
    def total_bytes(self) -> int:
        """Bytes of every row of every table."""
        return int(self.layout.num_rows @ self.layout.row_bytes(self.optimizer_class))

    def num_hot_rows(self, budget_bytes: int | np.ndarray) -> int | np.ndarray:
        """How many ranked rows fit ``budget_bytes`` (taken in rank order while they fit)."""
        if np.any(np.asarray(budget_bytes) < 0):
            raise ValueError(f"budget must be non-negative, got {budget_bytes} bytes")
        return np.searchsorted(self.cumulative_bytes, budget_bytes, side="right")

    def hot_set(self, budget_bytes: int) -> HotSet:
        """FAE's hot set for a budget: every row when all tables fit, else the top ranked rows."""
        if budget_bytes >= self.total_bytes:
            return HotSet.everything(self.layout.configs)
        k = int(self.num_hot_rows(budget_bytes))
        return self._hot_set_of(np.sort(self.rows[:k]))

    def worst_ranks(self) -> np.ndarray:
        """Per holdout input, the largest rank among its rows (-1 for none; ``len(rows)`` when a row
        is unranked): with the top ``k`` ranked rows hot, the input is hot exactly when this is < k."""
        holdout = self.holdout
        order = np.argsort(self.rows)
        sorted_rows = self.rows[order]
        position = np.minimum(np.searchsorted(sorted_rows, holdout.rows), len(sorted_rows) - 1)
        ranked = sorted_rows[position] == holdout.rows if len(sorted_rows) else False
        rank = np.where(ranked, order[position] if len(order) else 0, len(self.rows))
        worst = np.full(len(holdout), -1, dtype=np.int64)
        np.maximum.at(worst, holdout.owners, rank)
        return worst

    def _hot_set_of(self, rows: np.ndarray) -> HotSet:
        offsets = self.layout.row_offsets
        return HotSet(
            self.layout.configs,
            tuple(rows[part] - offsets[t] for t, part in enumerate(self.layout.table_slices(rows))),
        )
