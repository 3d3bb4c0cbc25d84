import copy
from collections import OrderedDict
from itertools import pairwise

import numpy as np
import pytest

from planner.cache_statistics import AccessCacheStatistics, _row_probabilities


def _lru_miss_rate(stream: np.ndarray, capacity: int) -> float:
    """Reference: replay ``stream`` through an LRU cache of ``capacity`` rows."""
    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for row in stream.tolist():
        if row in cache:
            cache.move_to_end(row)
            continue
        misses += 1
        cache[row] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return misses / len(stream)


def test_miss_rate_and_lookups_match_an_lru_replay():
    rows = 20_000
    weights = 1 / np.arange(1, rows + 1) ** 1.1
    counts = np.round(weights / weights.sum() * 1e7).astype(np.int64) + 2
    stats = AccessCacheStatistics.from_counts(counts, lookups_per_batch=20_000)
    stream = np.random.default_rng(0).choice(rows, 200_000, p=counts / counts.sum())
    for capacity in (200, 2000):
        assert stats.expected_miss_rate(capacity / rows) == pytest.approx(
            _lru_miss_rate(stream, capacity), abs=0.02
        )
    assert stats.expected_lookups == pytest.approx(len(np.unique(stream[:20_000])), rel=0.03)


def test_curve_ends_and_cacheability():
    counts = np.array([50, 20, 5, 1, 1, 0, 0, 0])
    stats = AccessCacheStatistics.from_counts(counts, lookups_per_batch=10)
    assert stats.expected_miss_rate(0.0) == 1.0 and stats.expected_miss_rate(1.0) == 0.0
    curve = [stats.expected_miss_rate(x) for x in np.linspace(0, 1, 11)]
    assert all(a >= b for a, b in pairwise(curve))
    assert 0.0 < stats.cacheability < 1.0
    uniform = AccessCacheStatistics.from_counts(np.full(8, 10), lookups_per_batch=10)
    assert uniform.cacheability > stats.cacheability, "skewed access is easier to cache"


def test_unseen_rows_take_the_good_turing_mass():
    counts = np.array([100] + [1] * 10 + [0] * 1000)
    stats = AccessCacheStatistics.from_counts(counts, lookups_per_batch=1)
    unseen_mass = 10 / 110
    # a cache as large as the seen rows still misses most of the mass spread over the unseen ones
    assert stats.expected_miss_rate(11 / 1011) > 0.8 * unseen_mass


def test_unseen_rows_without_singletons_still_count_as_rows():
    stats = AccessCacheStatistics.from_counts(np.array([2] * 100 + [0] * 900), lookups_per_batch=1)
    assert stats.expected_miss_rate(0.12) < 0.01, "a cache of 120 rows holds every row ever accessed"
    all_singletons = AccessCacheStatistics.from_counts(np.array([1] * 10 + [0] * 90), lookups_per_batch=1)
    assert all_singletons.expected_miss_rate(0.1) > 0.5


def test_small_immutable_and_shared_by_deepcopy():
    stats = AccessCacheStatistics.from_counts(np.arange(100), lookups_per_batch=64)
    assert copy.deepcopy(stats) is stats
    with pytest.raises(AttributeError):
        stats.lookups = 1.0
    with pytest.raises(ValueError, match="at least one row"):
        AccessCacheStatistics.from_counts(np.array([], dtype=np.int64), lookups_per_batch=1)


def test_counts_must_be_non_negative_integers():
    for bad in (np.array([1.5, 2.0]), np.array([3, -1])):
        with pytest.raises(ValueError, match="non-negative integers"):
            AccessCacheStatistics.from_counts(bad, lookups_per_batch=1)


def _bisected_miss_rate(probability, multiplicity, cache_rows):
    """Che's miss rate by plain bisection of ``sum m (1 - exp(-p T)) = C`` on log T: the reference."""
    low, high = -40.0, 60.0
    for _ in range(80):
        middle = (low + high) / 2
        filled = multiplicity @ -np.expm1(-probability * np.exp(middle))
        low, high = (middle, high) if filled < cache_rows else (low, middle)
    return 1.0 - (multiplicity * probability) @ -np.expm1(-probability * np.exp(low))


@pytest.mark.parametrize("rows", [3, 10_000, 40_000_000])
def test_the_miss_rate_curve_solves_ches_equation_for_every_load_factor(rows):
    """Every tabulated point, from caches of a few rows to nearly the whole table (where the time is
    largest), is the miss rate a bisection finds; tables of millions of rows with few seen included."""
    seen = np.bincount(np.minimum(np.random.default_rng(rows).zipf(1.2, 50_000), rows) - 1)
    stats = AccessCacheStatistics.from_seen(seen[seen > 0], rows, lookups_per_batch=100)
    probability, multiplicity = _row_probabilities(seen[seen > 0], rows)
    for load_factor, miss in zip(stats.load_factors[1:-1], stats.miss_rates[1:-1], strict=True):
        expected = _bisected_miss_rate(probability, multiplicity, load_factor * rows)
        assert miss == pytest.approx(max(expected, 0.0), abs=1e-9), load_factor


def test_load_factors_of_a_cold_table_that_keeps_its_hot_rows_copies():
    """A cold part's table keeps every row, its hot ones' copies too: the cache of a load factor of the
    whole table holds as many rows as that of the cold rows alone at the load factor scaled up."""
    seen = np.array([40, 30, 9, 5, 3, 2, 1, 1])
    cold = AccessCacheStatistics.from_seen(seen, 1000, lookups_per_batch=50)
    table = AccessCacheStatistics.from_seen(seen, 1000, lookups_per_batch=50, table_rows=4000)
    assert table.rows == 4000 and table.expected_lookups == cold.expected_lookups
    assert table.minimum_load_factor == pytest.approx(cold.minimum_load_factor / 4)
    for factor in (0.001, 0.01, 0.1, 0.25):
        assert table.expected_miss_rate(factor) == pytest.approx(cold.expected_miss_rate(4 * factor))
    assert table.expected_miss_rate(0.5) == 0.0, "a cache of every cold row misses none"
    assert table.cacheability == pytest.approx(cold.cacheability / 4)
    with pytest.raises(ValueError, match="its 1000 looked up"):
        AccessCacheStatistics.from_seen(seen, 1000, lookups_per_batch=50, table_rows=999)
