"""``CacheStatistics`` of a cold table, computed from the sampled access counts of its cold rows.

TorchRec reads three numbers from a ``fused_uvm_caching`` table's ``CacheParams.stats``: the expected
distinct lookups per global batch, the miss rate as a function of the cache load factor, and a
cacheability score. Under the independent reference model (each lookup draws row ``r`` with
probability ``p_r``, estimated from the sample):

* distinct lookups among ``n`` draws: ``sum_r 1 - (1 - p_r) ** n``;
* LRU miss rate of a cache of ``C = clf * rows`` rows, by Che's approximation: find the
  characteristic time ``T`` with ``sum_r 1 - exp(-p_r T) = C``; the hit rate is
  ``sum_r p_r (1 - exp(-p_r T))``;
* cacheability: the area under the miss-rate curve (TorchRec's definition).

Rows never seen in the sample share the Good-Turing estimate of the unseen mass (the share of sampled
accesses made by rows seen once), capped at the share uniform access would give them. The miss-rate
curve is tabulated at construction: the object is small and immutable, and ``deepcopy`` returns it as
is (the planner copies it many times).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torchrec.distributed.types import CacheStatistics

#: Load factors at which the miss-rate curve is tabulated (dense near 0, where caches are sized).
LOAD_FACTOR_GRID = np.concatenate([[0.0], np.geomspace(1e-4, 1.0, 64)])


@dataclass(frozen=True, eq=False)
class AccessCacheStatistics(CacheStatistics):
    """Cache statistics of one table from access counts (see the module docstring)."""

    lookups: float
    rows: int
    load_factors: tuple[float, ...] = field(repr=False)
    miss_rates: tuple[float, ...] = field(repr=False)

    @classmethod
    def from_counts(cls, counts: np.ndarray, lookups_per_batch: float) -> AccessCacheStatistics:
        """Statistics of a table whose rows were accessed ``counts`` times in the sample, looked up
        ``lookups_per_batch`` times per global batch."""
        counts = np.asarray(counts)
        _check_counts(counts, "access counts must be non-negative integers")
        return cls.from_seen(counts[counts > 0], len(counts), lookups_per_batch)

    @classmethod
    def from_seen(
        cls, seen: np.ndarray, rows: int, lookups_per_batch: float, table_rows: int | None = None
    ) -> AccessCacheStatistics:
        """``from_counts`` given only the counts of the rows the sample saw (``seen``, all positive)
        and the number of rows looked up: the others count by their number, so a table of millions of
        rows that were never seen costs nothing. ``table_rows``: the rows of the table the cache serves
        (default ``rows``), of which ``rows`` are looked up, as a cold part's table keeps its hot rows'
        copies too; load factors are of ``table_rows``, as TorchRec sizes a cache."""
        table_rows = rows if table_rows is None else table_rows
        if rows <= 0 or table_rows < rows:
            raise ValueError(f"a table needs at least one row, and its {rows} looked up ({table_rows} rows)")
        seen = np.asarray(seen)
        _check_counts(seen, "seen access counts must be positive integers", low=1)
        if len(seen) > rows:
            raise ValueError(f"{len(seen)} seen rows in a table of {rows} rows")
        probability, multiplicity = _row_probabilities(seen.astype(np.int64), rows)
        distinct = float(
            multiplicity @ -np.expm1(lookups_per_batch * np.log1p(-np.minimum(probability, 1 - 1e-12)))
        )
        miss = [1.0, *_che_miss_rates(probability, multiplicity, LOAD_FACTOR_GRID[1:-1] * rows).tolist(), 0.0]
        return cls(
            distinct, table_rows, tuple((LOAD_FACTOR_GRID * (rows / table_rows)).tolist()), tuple(miss)
        )

    @property
    def expected_lookups(self) -> float:
        return self.lookups

    @property
    def minimum_load_factor(self) -> float:
        """The load factor of a cache that holds one global batch's distinct rows."""
        return min(1.0, self.lookups / self.rows)

    def expected_miss_rate(self, clf: float) -> float:
        return float(np.interp(clf, self.load_factors, self.miss_rates))

    @property
    def cacheability(self) -> float:
        return float(np.trapezoid(self.miss_rates, self.load_factors))

    def __deepcopy__(self, memo: dict) -> AccessCacheStatistics:
        return self


def _check_counts(counts: np.ndarray, message: str, low: int = 0) -> None:
    if counts.dtype.kind not in "iu" or (len(counts) and counts.min() < low):
        raise ValueError(f"{message}, got {counts.dtype} from {counts.min() if len(counts) else '-'}")


def _row_probabilities(seen: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct access probabilities of a table's rows and how many rows have each, from the counts
    of the rows seen."""
    total = seen.sum()
    unseen = rows - len(seen)
    if total == 0:
        return np.array([1.0 / rows]), np.array([float(rows)])
    # Good-Turing, but never more per unseen row than uniform access would give it
    unseen_mass = min(np.count_nonzero(seen == 1) / total, unseen / rows) if unseen else 0.0
    by_count = np.bincount(seen)  # counts are small integers: O(rows seen), no sort
    values = np.flatnonzero(by_count[1:]) + 1
    multiplicity = by_count[values]
    probability = values / total * (1.0 - unseen_mass)
    if unseen and unseen_mass > 0:
        probability = np.append(probability, unseen_mass / unseen)
        multiplicity = np.append(multiplicity, unseen)
    return probability, multiplicity.astype(np.float64)


#: Newton steps at most (a handful suffice: the loop ends once no cache's time moves by 1e-12 of itself).
_NEWTON_STEPS = 200


def _che_miss_rates(probability: np.ndarray, multiplicity: np.ndarray, cache_rows: np.ndarray) -> np.ndarray:
    """LRU miss rates of caches of ``cache_rows`` rows each (Che's approximation), all caches at once.

    The characteristic time ``T`` solves ``filled(T) = sum_r 1 - exp(-p_r T) = C``. ``filled`` is concave
    and below ``T`` (the probabilities sum to 1), so Newton's method started at ``T = C`` climbs to the
    root from below without overshooting it: a few matrix products over (probabilities x caches), where
    a bisection took 80 per cache."""
    occupied = multiplicity[probability > 0].sum()
    fits = cache_rows >= occupied
    target = np.where(fits, 0.0, cache_rows)
    characteristic = target.copy()
    for _ in range(_NEWTON_STEPS):
        missing = np.expm1(-np.outer(probability, characteristic))  # minus each row's chance to be held
        gap = target + multiplicity @ missing
        slope = (multiplicity * probability) @ (1.0 + missing)
        step = np.divide(gap, slope, out=np.zeros_like(gap), where=slope > 0)
        characteristic += step
        if np.all(step <= 1e-12 * characteristic):
            break
    held = -np.expm1(-np.outer(probability, characteristic))
    return np.where(fits, 0.0, 1.0 - (multiplicity * probability) @ held)
