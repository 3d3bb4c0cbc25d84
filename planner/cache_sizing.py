"""How much of each cold table its UVM cache holds: FAE's ranking applied to the cold rows.

The cache budget goes to the most accessed cold rows of all tables together (the rows an ideal cache
would keep); a table's load factor is the share of its cold rows that made the cut. No cache is made
smaller than the rows one global batch looks up, since a smaller one thrashes within a step.
"""

from __future__ import annotations

import numpy as np
import torch

from fae_torchrec import AccessStats, HotSet

#: FBGEMM's UVM cache needs a load factor strictly between 0 and 1.
LOAD_FACTOR_RANGE = (0.001, 0.999)


def cold_counts(stats: AccessStats, hot_set: HotSet) -> list[np.ndarray]:
    """Per table, the sampled access counts of its cold rows (in cold id order)."""
    return [counts[~hot_set.hot_mask(t)] for t, counts in enumerate(stats.counts)]


def cache_load_factors(
    stats: AccessStats,
    hot_set: HotSet,
    cache_budget_bytes: float,
    minimum: dict[str, float],
    optimizer_class: type[torch.optim.Optimizer] | None = None,
) -> dict[str, float]:
    """Load factor per table with cold rows, keyed by table name.

    The budget is filled with the most accessed cold rows of all tables; ``minimum`` gives each
    table's smallest sensible load factor (rows it looks up per batch over its cold rows), which
    wins where the ranking gives the table less. Load factors stay within ``LOAD_FACTOR_RANGE``.
    """
    row_bytes = stats.layout.row_bytes(optimizer_class)
    counts = cold_counts(stats, hot_set)
    tables = np.concatenate([np.full(len(c), t) for t, c in enumerate(counts)])
    flat = np.concatenate(counts)
    order = np.argsort(-flat, kind="stable")
    order = order[flat[order] > 0]
    fits = np.searchsorted(np.cumsum(row_bytes[tables[order]]), cache_budget_bytes, side="right")
    taken = np.bincount(tables[order[:fits]], minlength=len(counts))
    low, high = LOAD_FACTOR_RANGE
    return {
        config.name: min(max(minimum.get(config.name, 0.0), float(taken[t] / len(c)), low), high)
        for t, (config, c) in enumerate(zip(stats.tables, counts, strict=True))
        if len(c)
    }
