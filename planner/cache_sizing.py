"""How much of each cold table its UVM cache holds: FAE's ranking applied to the cold rows.

The cache budget goes first to the most accessed cold rows of all tables together (the rows an ideal
cache would keep); a table's load factor is the share of its cold rows so paid for. No cache is made
smaller than the rows one global batch looks up, since a smaller one thrashes within a step.
"""

from __future__ import annotations

import numpy as np
import torch

from fae_torchrec import AccessStats, HotSet
from planner.cache_statistics import AccessCacheStatistics

#: FBGEMM's UVM cache needs a load factor strictly between 0 and 1.
LOAD_FACTOR_RANGE = (0.001, 0.999)


def cold_counts(stats: AccessStats, hot_set: HotSet) -> list[np.ndarray]:
    """Per table, the sampled access counts of its cold rows (in cold id order)."""
    return [counts[~hot_set.hot_mask(t)] for t, counts in enumerate(stats.counts)]


def cache_load_factors(
    stats: AccessStats,
    hot_set: HotSet,
    cache_budget_bytes: float,
    caches: dict[str, AccessCacheStatistics],
    optimizer_class: type[torch.optim.Optimizer] | None = None,
) -> dict[str, float]:
    """Load factor per table with cold rows, keyed by table name.

    The budget first takes the most accessed cold rows seen in the sample, over all tables; what is
    left goes to the tables in proportion to their distinct cold lookups per batch (rows the sample
    never saw are looked up too). No table gets less than one batch's distinct rows
    (``minimum_load_factor``), and load factors stay within ``LOAD_FACTOR_RANGE``.
    """
    row_bytes = stats.layout.row_bytes(optimizer_class)
    counts = cold_counts(stats, hot_set)
    tables = np.concatenate([np.full(len(c), t) for t, c in enumerate(counts)])
    flat = np.concatenate(counts)
    order = np.argsort(-flat, kind="stable")
    order = order[flat[order] > 0]
    cost = np.cumsum(row_bytes[tables[order]])
    fits = np.searchsorted(cost, cache_budget_bytes, side="right")
    taken = np.bincount(tables[order[:fits]], minlength=len(counts)).astype(np.float64)
    spare = cache_budget_bytes - (cost[fits - 1] if fits else 0.0)
    lookups = np.array([caches[c.name].lookups if c.name in caches else 0.0 for c in stats.tables])
    if spare > 0 and lookups.sum() > 0:
        taken += spare * lookups / lookups.sum() / row_bytes
    low, high = LOAD_FACTOR_RANGE
    return {
        config.name: float(min(max(caches[config.name].minimum_load_factor, taken[t] / len(c), low), high))
        for t, (config, c) in enumerate(zip(stats.tables, counts, strict=True))
        if len(c)
    }
