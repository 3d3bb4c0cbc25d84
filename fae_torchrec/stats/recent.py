"""Recent access counts while training: a decayed sample of the rows the inputs use, in bounded memory.

A profile counts rows once, before training; popularity moves. ``RecentAccessCounts`` keeps counting
during training, cheaply: of every step's inputs it counts a random ``sample_fraction`` (as the profile
does) and holds out another ``holdout_fraction``, the last ``holdout_size`` of which estimate a new hot
set's share on recent unseen inputs (as the profile's holdout does). Each step's accesses weigh
``2 ** (1 / half_life)`` times the previous step's, so an access ``half_life`` steps old counts half.
Counts are kept per row for at most ``capacity[t]`` rows of table ``t`` (the largest; a row that falls
out and comes back starts again): memory is bounded, ``bytes_per_table`` says how much.
:meth:`stats` returns them as ``AccessStats``, as sparse as they are kept, for the ranking, the hot
set and the planner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.seeds import generator
from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.feature_ids import BatchLike, FeatureIds
from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.tables import TableLayout

#: Bytes a kept row costs: its global row (int64) and its count (float64).
ENTRY_BYTES = 16
#: Log2 of the step weight past which the kept counts are rescaled (float64 holds 2 ** 1023).
_RESCALE_AT = 512.0


class RecentAccessCounts:
    """Decayed access counts of a sample of recent inputs, and a holdout of recent inputs.

    Args:
        tables: the embedding tables the inputs look up.
        capacity: rows kept per table (one number for all, or one per table; at most its rows).
        sample_fraction: share of each step's inputs counted.
        half_life: steps after which an access counts half.
        holdout_fraction: share of each step's inputs held out (not counted).
        holdout_size: the most recent held-out inputs kept.
        seed: seed of the draws.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        capacity: int | Sequence[int],
        sample_fraction: float = 0.05,
        half_life: float = 200.0,
        holdout_fraction: float = 0.05,
        holdout_size: int = 20_000,
        seed: int = 0,
    ) -> None:
        if not (0 < sample_fraction and 0 <= holdout_fraction and sample_fraction + holdout_fraction <= 1):
            raise ValueError(
                f"sample fraction {sample_fraction} and holdout fraction {holdout_fraction}: each in [0, 1], "
                "the sample's above 0, together at most 1"
            )
        if half_life <= 0 or holdout_size < 0:
            raise ValueError(
                f"half_life must be positive and holdout_size non-negative, got {half_life}, {holdout_size}"
            )
        self.layout = TableLayout.of(tables)
        rows = self.layout.num_rows
        self.capacity = np.minimum(np.broadcast_to(np.asarray(capacity, dtype=np.int64), rows.shape), rows)
        if np.any(self.capacity <= 0):
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.sample_fraction, self.holdout_fraction = sample_fraction, holdout_fraction
        self.half_life, self.holdout_size = half_life, holdout_size
        self._offsets = np.concatenate([[0], np.cumsum(rows)])
        self._rng = generator(seed, "recent")
        self._rows = np.empty(0, dtype=np.int64)  # kept global rows, ascending
        self._counts = np.empty(0, dtype=np.float64)  # their counts, in units of step 0's weight
        self._pending: list[tuple[np.ndarray, float]] = []  # rows counted since the last merge, and weight
        self._pending_rows = 0
        self._log_weight = 0.0  # log2 of the current step's weight
        self._sampled = 0.0  # weighted count of the inputs counted
        self._held: deque[tuple[np.ndarray, np.ndarray, int]] = deque()  # (rows, owners, inputs) per step
        self._held_inputs = 0
        self.steps = 0

    def draw(self, num_inputs: int) -> tuple[np.ndarray, np.ndarray]:
        """The inputs of a step of ``num_inputs`` to count and to hold out: two index arrays, sorted."""
        u = self._rng.random(num_inputs)
        counted = u < self.sample_fraction
        held = ~counted & (u < self.sample_fraction + self.holdout_fraction)
        return np.flatnonzero(counted), np.flatnonzero(held)

    def update(self, data: BatchLike) -> None:
        """One step: draw its inputs (``draw``), count and hold out theirs (``add``)."""
        ids = FeatureIds.of(data)
        counted, held = self.draw(ids.stride)
        mask = np.zeros((2, ids.stride), dtype=bool)
        mask[0, counted], mask[1, held] = True, True
        self.add(ids.subset(mask[0]), ids.subset(mask[1]))

    def add(self, counted: BatchLike, held: BatchLike) -> None:
        """One step: count the rows of the ``counted`` inputs, hold out the ``held`` ones (the inputs
        ``draw`` chose), and age every count by a step."""
        counted_ids, held_ids = FeatureIds.of(counted), FeatureIds.of(held)
        for ids in (counted_ids, held_ids):
            ids.check(self.layout)
        keys = list(held_ids.values)
        owners = [held_ids.input_index(k) for k in keys]
        self._add_rows(
            self._global_rows(counted_ids), counted_ids.stride, self._global_rows(held_ids),
            np.concatenate(owners) if owners else np.empty(0, np.int64), held_ids.stride,
        )  # fmt: skip

    def add_columns(self, counted: np.ndarray, held: np.ndarray, tables: np.ndarray) -> None:
        """``add`` for ids in columns, one input per row (a ``SampleBlock``'s ``ids``), column ``c``
        a row of table ``tables[c]``: one vectorised pass, no per-feature work (ids not checked: a
        partition's are)."""
        offsets = self._offsets[tables]
        held_owners = np.repeat(np.arange(len(held)), held.shape[1])
        self._add_rows(
            (counted + offsets).ravel(), len(counted), (held + offsets).ravel(), held_owners, len(held)
        )

    def _add_rows(
        self,
        rows: np.ndarray,
        num_counted: int,
        held_rows: np.ndarray,
        held_owners: np.ndarray,
        num_held: int,
    ) -> None:
        """One step of global rows: ``rows`` of ``num_counted`` inputs counted, ``held_rows`` of
        ``num_held`` inputs (``held_owners``: each row's input) held out."""
        weight = 2.0**self._log_weight
        self._pending.append((rows, weight))
        self._pending_rows += len(rows)
        self._sampled += num_counted * weight
        if self._pending_rows > int(self.capacity.sum()):
            self._merge()
        if self.holdout_size and num_held:
            self._held.append((held_rows, held_owners, num_held))
            self._held_inputs += num_held
            while self._held_inputs - self._held[0][2] >= self.holdout_size:
                self._held_inputs -= self._held.popleft()[2]
        self.steps += 1
        self._log_weight += 1.0 / self.half_life
        if self._log_weight > _RESCALE_AT:
            self._merge()
            scale = 2.0**-self._log_weight
            self._counts *= scale
            self._sampled *= scale
            self._log_weight = 0.0

    def bytes_per_table(self) -> np.ndarray:
        """The most bytes the counts of each table take: its kept rows, and as many counted since
        the last merge (the holdout's ``holdout_size`` inputs come on top: see ``holdout_bytes``)."""
        return 2 * self.capacity * ENTRY_BYTES

    def holdout_bytes(self) -> int:
        """Bytes the held-out inputs take now (global rows and owners, int64 each)."""
        return sum(16 * len(rows) for rows, _, _ in self._held)

    def stats(self) -> AccessStats:
        """The recent counts now, as sparse as they are kept: per kept row its decayed count, in
        accesses at the latest step's weight rounded up to whole ones (a kept row counts at least 1:
        seen), ``num_sampled`` the decayed number of inputs counted, and the holdout of the most recent
        held-out inputs. Raises ``ValueError`` before any input was counted."""
        self._merge()
        scale = 2.0 ** (1.0 / self.half_life - self._log_weight)
        if self._sampled * scale < 1:
            raise ValueError(
                f"no input counted yet in {self.steps} steps (sample fraction {self.sample_fraction})"
            )
        rounded = np.ceil(self._counts * scale).astype(np.int64)
        seen = rounded > 0
        num_sampled = max(1, round(self._sampled * scale))
        rows, counts = self._rows[seen], rounded[seen]
        parts = self.layout.table_slices(rows)
        return AccessStats(
            tables=self.layout.configs,
            seen_rows=tuple(rows[part] - self._offsets[t] for t, part in enumerate(parts)),
            seen_counts=tuple(counts[part] for part in parts),
            num_inputs=max(num_sampled, round(num_sampled / self.sample_fraction)),
            num_sampled=num_sampled,
            holdout=self._holdout(),
        )

    def _global_rows(self, ids: FeatureIds) -> np.ndarray:
        """Every id of ``ids`` as a global row (table offset + id)."""
        pieces = [values + self._offsets[self.layout.table_of(key)] for key, values in ids.values.items()]
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)

    def _merge(self) -> None:
        """Fold the pending rows into the kept counts, and cut each table to its ``capacity`` largest."""
        if not self._pending:
            return
        rows = np.concatenate([self._rows, *(r for r, _ in self._pending)])
        weights = np.concatenate([self._counts, *(np.full(len(r), w) for r, w in self._pending)])
        self._pending, self._pending_rows = [], 0
        unique, inverse = np.unique(rows, return_inverse=True)
        counts = np.bincount(inverse, weights=weights, minlength=len(unique))
        table = np.searchsorted(self._offsets, unique, side="right") - 1
        # per table, the rank of each row by count (largest first): keep those under its capacity
        order = np.lexsort((-counts, table))
        first_of_table = np.searchsorted(table[order], np.arange(len(self.capacity)))
        rank = np.arange(len(order)) - first_of_table[table[order]]
        kept = np.sort(order[rank < self.capacity[table[order]]])
        self._rows, self._counts = unique[kept], counts[kept]

    def _holdout(self) -> Holdout:
        """The held-out inputs kept, numbered from 0 in the order they came."""
        if not self._held:
            return Holdout(np.empty(0, np.int64), np.empty(0, np.int64), 0)
        starts = np.cumsum([0] + [n for _, _, n in self._held])
        rows = np.concatenate([r for r, _, _ in self._held])
        owners = np.concatenate([o + s for (_, o, _), s in zip(self._held, starts[:-1], strict=True)])
        return Holdout(rows, owners, int(starts[-1]))
