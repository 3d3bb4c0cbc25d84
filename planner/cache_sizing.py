"""How much of each cold table device memory holds: FAE's ranking applied to the cold rows.

The budget goes first to the most accessed cold rows of all tables together (the rows an ideal cache
would keep); a table's load factor is the share of its cold rows so paid for. What is left moves whole
cold parts into HBM, cheapest first (load factor 1: no cache, so no miss at all, not even on a row's
first use), and the rest is spread over the remaining caches. Costs follow TorchRec's storage
estimates, cache bookkeeping included. No cache is made smaller than the rows one global batch looks
up, since a smaller one thrashes within a step.
"""

from __future__ import annotations

import numpy as np
import torch

from fae_torchrec.stats import AccessStats, HotSet
from planner.cache_statistics import AccessCacheStatistics

#: FBGEMM's UVM cache needs a load factor strictly between 0 and 1.
LOAD_FACTOR_RANGE = (0.001, 0.999)
#: Device bytes TorchRec's storage estimate adds per cache slot (LRU time stamp and cached index) and
#: per row of a cached table (its slot lookup), after ``_calculate_cache_aux_state_sizes``.
CACHE_SLOT_AUX_BYTES = 16
CACHE_ROW_AUX_BYTES = 4


def seen_cold_counts(stats: AccessStats, hot_set: HotSet) -> list[np.ndarray]:
    """Per table, the sampled access counts of the cold rows the sample saw, in id order (the rows it
    never saw count 0: only their number matters, ``cold_rows``)."""
    return [
        counts[~hot_set.is_hot(t, seen)]
        for t, (counts, seen) in enumerate(zip(stats.seen_counts, stats.seen_rows, strict=True))
    ]


def cold_rows(hot_set: HotSet) -> np.ndarray:
    """Per table, how many of its rows are cold."""
    return hot_set.layout.num_rows - np.array([len(ids) for ids in hot_set.hot_ids], dtype=np.int64)


def cold_table_rows(hot_set: HotSet) -> np.ndarray:
    """Per table, the rows of its table in the cold part: all its rows where any is cold (the cold part
    keeps every row at its id, ``FAEEmbeddingBagCollection``), none elsewhere."""
    return np.where(cold_rows(hot_set) > 0, hot_set.layout.num_rows, 0)


class ColdCacheSizing:
    """FAE's ranking of one hot set's cold rows, made once and read for every cache budget (the planner
    sizes a hot set's caches up to eight times, and the ranking sorts every cold row the sample saw).

    ``load_factors(budget, whole_parts)`` gives the load factor per table with cold rows, keyed by table
    name; 1.0 puts the whole cold part in HBM. The budget first takes the most accessed cold rows seen in
    the sample, over all tables; what is left pays for whole cold parts, the cheapest first while they
    fit, and the rest goes to the other tables in proportion to their distinct cold lookups per batch
    (rows the sample never saw are looked up too). No cache gets less than one batch's distinct rows
    (``minimum_load_factor``), and cache load factors stay within ``LOAD_FACTOR_RANGE``. Without
    ``whole_parts`` every cold table gets a cache.
    """

    def __init__(
        self,
        stats: AccessStats,
        hot_set: HotSet,
        caches: dict[str, AccessCacheStatistics],
        optimizer_class: type[torch.optim.Optimizer] | None = None,
    ) -> None:
        self.tables = stats.tables
        self.caches = caches
        self.row_bytes = stats.layout.row_bytes(optimizer_class).astype(np.float64)
        self.slot_bytes = self.row_bytes + CACHE_SLOT_AUX_BYTES
        counts = seen_cold_counts(stats, hot_set)  # only rows seen in the sample are ranked
        self.rows = cold_table_rows(hot_set).astype(np.float64)  # what a cache's load factor is of
        tables = np.concatenate([np.full(len(c), t) for t, c in enumerate(counts)])
        self.ranked_tables = tables[np.argsort(-np.concatenate(counts), kind="stable")]
        self.cost = np.cumsum(self.slot_bytes[self.ranked_tables])
        self.lookups = np.array([caches[c.name].lookups if c.name in caches else 0.0 for c in self.tables])

    def load_factors(self, cache_budget_bytes: float, whole_parts: bool = True) -> dict[str, float]:
        """Load factor per table with cold rows for a cache budget of ``cache_budget_bytes``."""
        rows, row_bytes, slot_bytes = self.rows, self.row_bytes, self.slot_bytes
        budget = cache_budget_bytes - CACHE_ROW_AUX_BYTES * float(rows.sum())
        fits = np.searchsorted(self.cost, budget, side="right")
        taken = np.bincount(self.ranked_tables[:fits], minlength=len(rows)).astype(np.float64)
        spare = budget - (self.cost[fits - 1] if fits else 0.0)
        extra = rows * row_bytes - taken * slot_bytes - rows * CACHE_ROW_AUX_BYTES
        cheapest = np.argsort(extra, kind="stable")
        cheapest = cheapest[rows[cheapest] > 0]
        whole = cheapest[np.logical_and.accumulate(np.cumsum(extra[cheapest]) <= spare)]
        in_hbm = np.zeros(len(rows), dtype=bool)
        in_hbm[whole] = whole_parts
        spare -= extra[in_hbm].sum()
        cached_lookups = np.where(in_hbm, 0.0, self.lookups)
        if spare > 0 and cached_lookups.sum() > 0:
            taken += spare * cached_lookups / cached_lookups.sum() / slot_bytes
        low, high = LOAD_FACTOR_RANGE
        return {
            config.name: 1.0
            if in_hbm[t] or (whole_parts and taken[t] >= rows[t])
            else float(min(max(self.caches[config.name].minimum_load_factor, taken[t] / rows[t], low), high))
            for t, config in enumerate(self.tables)
            if rows[t]
        }

    def device_bytes(self, load_factors: dict[str, float]) -> np.ndarray:
        """Per table, the device memory a sizing's cold part asks, as ``load_factors`` counts it: the
        whole part at load factor 1, else its cache slots and the cache's bookkeeping per row."""
        return self._device_bytes(self._factors(load_factors))

    def asks_at_least(self, load_factors: dict[str, float], other: dict[str, float]) -> bool:
        """Whether the sizing ``load_factors`` asks every table for at least the device memory ``other``
        asks, and caches every table that ``other`` caches: then each of its tables' sharding options
        needs at least that HBM (and a cache DDR besides), where a whole part may also take sharding
        types that a cache may not."""
        mine, theirs = self._factors(load_factors), self._factors(other)
        more = self._device_bytes(mine) >= self._device_bytes(theirs)
        return bool(np.all(more & ((mine < 1.0) | (theirs == 1.0))))

    def _factors(self, load_factors: dict[str, float]) -> np.ndarray:
        return np.array([load_factors.get(c.name, 0.0) for c in self.tables])

    def _device_bytes(self, factors: np.ndarray) -> np.ndarray:
        cached = factors * self.slot_bytes + CACHE_ROW_AUX_BYTES
        return self.rows * np.where(factors == 1.0, self.row_bytes, cached)


def smallest_load_factors(caches: dict[str, AccessCacheStatistics]) -> dict[str, float]:
    """Per table of ``caches``, the load factor of its smallest cache that does not thrash within a step
    (one global batch's distinct rows, ``minimum_load_factor``), or 1.0 (the table in HBM) where that
    cache would hold the whole table: where ``EmbeddingOffloadScaleupProposer`` starts."""
    low, high = LOAD_FACTOR_RANGE
    return {
        name: 1.0 if cache.minimum_load_factor >= high else max(cache.minimum_load_factor, low)
        for name, cache in caches.items()
    }


def cache_load_factors(
    stats: AccessStats,
    hot_set: HotSet,
    cache_budget_bytes: float,
    caches: dict[str, AccessCacheStatistics],
    optimizer_class: type[torch.optim.Optimizer] | None = None,
    whole_parts: bool = True,
) -> dict[str, float]:
    """Load factor per table with cold rows for one cache budget (``ColdCacheSizing`` says how)."""
    return ColdCacheSizing(stats, hot_set, caches, optimizer_class).load_factors(
        cache_budget_bytes, whole_parts
    )
