"""Cold-table load factors: caches and whole cold parts in HBM within the budget, as TorchRec counts it."""

import numpy as np
import pytest

from fae_torchrec import AccessProfiler
from fae_torchrec.data import SyntheticCriteo
from planner.cache_sizing import (
    CACHE_ROW_AUX_BYTES,
    CACHE_SLOT_AUX_BYTES,
    LOAD_FACTOR_RANGE,
    ColdCacheSizing,
    cache_load_factors,
    seen_cold_counts,
)
from planner.constraints import cold_cache_statistics
from tests.conftest import dense_counts

LOW, HIGH = LOAD_FACTOR_RANGE


@pytest.fixture(scope="module")
def cold_tables():
    data = SyntheticCriteo(60_000, batch_size=8192, scale=0.01, seed=2)
    stats = AccessProfiler(data.table_configs(), 0.1, seed=0, holdout_size=2000).profile(data)
    hot_set = stats.hot_set(1 << 14)
    return stats, hot_set, cold_cache_statistics(stats, hot_set, 4096)


def _device_bytes(stats, hot_set, load_factors):
    """Bytes TorchRec's storage estimate gives the cold parts (without per-table I/O buffers): a table with
    cold rows keeps every row in the cold part."""
    total = 0.0
    for t, config in enumerate(stats.tables):
        rows = config.num_embeddings if (~hot_set.hot_mask(t)).any() else 0
        row = config.embedding_dim * 4
        lf = load_factors.get(config.name)
        if lf == 1.0:
            total += rows * row
        elif lf is not None:
            total += rows * (CACHE_ROW_AUX_BYTES + lf * (row + CACHE_SLOT_AUX_BYTES))
    return total


def test_spare_budget_moves_the_cheapest_cold_parts_whole_into_hbm(cold_tables):
    stats, hot_set, caches = cold_tables
    model = sum(int((~hot_set.hot_mask(t)).sum()) * c.embedding_dim * 4 for t, c in enumerate(stats.tables))
    budget = 0.3 * model
    load_factors = cache_load_factors(stats, hot_set, budget, caches)
    assert set(load_factors) == set(caches)
    whole = {n for n, lf in load_factors.items() if lf == 1.0}
    cached = {n: lf for n, lf in load_factors.items() if lf < 1.0}
    assert whole and cached, "small cold parts go whole, the largest stays cached"
    assert all(0.0 < lf < 1.0 for lf in cached.values())
    sizes = {c.name: c.num_embeddings for c in stats.tables}
    assert max(sizes[n] for n in whole) <= min(sizes[n] for n in cached)
    assert _device_bytes(stats, hot_set, load_factors) <= budget * 1.001

    everything = cache_load_factors(stats, hot_set, 2 * model, caches)
    assert set(everything.values()) == {1.0}


def test_without_whole_parts_every_cold_table_gets_a_cache(cold_tables):
    stats, hot_set, caches = cold_tables
    load_factors = cache_load_factors(stats, hot_set, 1 << 20, caches, whole_parts=False)
    assert all(0.0 < lf < 1.0 for lf in load_factors.values())
    tight = cache_load_factors(stats, hot_set, 0.0, caches)
    floors = {n: min(max(caches[n].minimum_load_factor, LOW), HIGH) for n in tight}
    assert tight == pytest.approx(floors), "no budget: every cache holds one batch's distinct rows"


def test_device_bytes_per_table_are_what_the_sizing_spends(cold_tables):
    """The planner compares sizings by ``device_bytes``: the storage counted above, table by table."""
    stats, hot_set, caches = cold_tables
    cold = ColdCacheSizing(stats, hot_set, caches)
    for budget, whole_parts in [(1 << 20, True), (1 << 20, False), (1 << 23, True), (0.0, True)]:
        load_factors = cold.load_factors(budget, whole_parts)
        asks = cold.device_bytes(load_factors)
        assert asks.shape == (len(stats.tables),)
        for t, config in enumerate(stats.tables):
            one = {config.name: load_factors[config.name]} if config.name in load_factors else {}
            assert asks[t] == pytest.approx(_device_bytes(stats, hot_set, one))


def test_a_sizing_asks_at_least_another_per_table_and_never_whole_against_a_cache(cold_tables):
    """A cache sizing asks at least what another does where every table's memory is no smaller; a whole
    part in HBM is never said to ask more than a cache (it may take sharding types a cache may not)."""
    stats, hot_set, caches = cold_tables
    cold = ColdCacheSizing(stats, hot_set, caches)
    whole = {name: 1.0 for name in caches}
    nearly_whole = {name: HIGH for name in caches}  # a cache of 99.9% of the rows costs more than them
    small = {name: LOW for name in caches}
    assert np.all(cold.device_bytes(nearly_whole) >= cold.device_bytes(whole))
    assert cold.asks_at_least(nearly_whole, whole) and cold.asks_at_least(small, small)
    assert cold.asks_at_least(nearly_whole, small) and not cold.asks_at_least(small, nearly_whole)
    assert np.all(cold.device_bytes(whole) >= cold.device_bytes(small))
    assert not cold.asks_at_least(whole, small)


def test_seen_cold_counts_match_the_dense_hot_masks(cold_tables):
    stats, hot_set, _ = cold_tables
    for t, cold in enumerate(seen_cold_counts(stats, hot_set)):
        counts = dense_counts(stats)[t]
        assert np.array_equal(cold, counts[(counts > 0) & ~hot_set.hot_mask(t)])
    everything = stats.hot_set(stats.ranking().total_bytes)
    assert all(len(cold) == 0 for cold in seen_cold_counts(stats, everything))
