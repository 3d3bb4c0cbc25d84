"""FAE's premise on the default synthetic data: a 5% sample finds the hot set, and says how good it is."""

import numpy as np
import pytest

from fae_torchrec import AccessProfiler
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.stats import estimate_hot_share, hot_share_curve, measure_hot_share
from fae_torchrec.stats.hot_share import wilson_interval

NUM_INPUTS = 2_000_000


@pytest.fixture(scope="module")
def data():
    synthetic = SyntheticCriteo(NUM_INPUTS, batch_size=1 << 16, seed=11)
    return synthetic.table_configs(), list(synthetic)


def _profile(tables, batches, fraction, seed):
    profiler = AccessProfiler(tables, sample_fraction=fraction, seed=seed)
    masks = [profiler.update(batch) for batch in batches]
    return profiler.stats(), masks


def _share_outside(hot_set, batches, sampled_masks) -> float:
    hot = np.concatenate([hot_set.is_hot_input(b)[~m] for b, m in zip(batches, sampled_masks, strict=True)])
    return float(hot.mean())


@pytest.mark.slow
def test_sampled_hot_set_is_nearly_as_good_as_the_full_count(data):
    tables, batches = data
    sampled, masks = _profile(tables, batches, 0.05, seed=0)
    full, _ = _profile(tables, batches, 1.0, seed=0)
    budget = 512 << 10  # 8,192 rows at dim 16: rows the 5% sample sees often enough to rank
    from_sample = _share_outside(sampled.hot_set(budget), batches, masks)
    from_all = _share_outside(full.hot_set(budget), batches, masks)
    assert from_sample > 0.1
    assert from_sample >= 0.97 * from_all


@pytest.mark.slow
def test_interval_covers_the_measured_share_for_most_seeds(data):
    tables, batches = data
    budget = 256 << 20
    covered = []
    for seed in range(10):
        stats, masks = _profile(tables, batches, 0.05, seed=seed)
        hot_set = stats.hot_set(budget)
        estimate = estimate_hot_share(stats, hot_set)
        measured = _share_outside(hot_set, batches, masks)
        covered.append(estimate.low <= measured <= estimate.high)
    assert sum(covered) >= 9, covered


def test_curve_agrees_with_single_estimates_and_grows_with_budget():
    synthetic = SyntheticCriteo(60_000, batch_size=8192, scale=0.01, seed=2)
    tables = synthetic.table_configs()
    profiler = AccessProfiler(tables, sample_fraction=0.2, seed=0, holdout_size=5000)
    stats = profiler.profile(synthetic)
    ranking = stats.ranking()
    budgets = np.array([0, 1 << 12, 1 << 14, 1 << 16, 1 << 18, ranking.total_bytes])
    curve = hot_share_curve(ranking, budgets)
    for budget, share in zip(budgets, curve.share, strict=True):
        assert share == estimate_hot_share(stats, stats.hot_set(int(budget))).share
    assert np.all(np.diff(curve.share) >= 0)
    assert curve.share[-1] == 1.0 and curve.share[0] == 0.0
    assert np.all((curve.low <= curve.share) & (curve.share <= curve.high))
    everything = measure_hot_share(stats.hot_set(int(ranking.total_bytes)), synthetic)
    assert everything == 1.0


def test_wilson_interval_at_the_edges():
    share, low, high = wilson_interval(0, 100)
    assert share == 0.0 and low == pytest.approx(0.0, abs=1e-12) and 0.03 < high < 0.04
    share, low, high = wilson_interval(100, 100)
    assert share == 1.0 and high == pytest.approx(1.0) and 0.96 < low < 0.97
    shares, lows, highs = wilson_interval(np.arange(4101), 4100)  # the bounds hold the share exactly
    assert np.all(lows <= shares) and np.all(shares <= highs) and lows[0] == 0.0 and highs[-1] == 1.0


def test_no_holdout_and_no_data_are_clear_errors(small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0)
    profiler.update({"a": [1], "b": [1], "c1": [1], "c2": [1]})
    stats = profiler.stats()
    with pytest.raises(ValueError, match="no holdout inputs"):
        estimate_hot_share(stats, stats.hot_set(0))
    with pytest.raises(ValueError, match="no inputs to measure"):
        measure_hot_share(stats.hot_set(0), [])


def test_estimate_matches_the_measured_share_on_multi_hot_data():
    synthetic = SyntheticCriteo(80_000, batch_size=8192, scale=0.01, seed=4, ids_per_feature=[1, 2] * 13)
    tables = synthetic.table_configs()
    profiler = AccessProfiler(tables, sample_fraction=0.1, seed=0, holdout_size=20_000)
    masks = [profiler.update(batch) for batch in synthetic]
    stats = profiler.stats()
    hot_set = stats.hot_set(64 << 10)
    estimate = estimate_hot_share(stats, hot_set)
    measured = _share_outside(hot_set, list(synthetic), masks)
    assert 0.05 < measured < 0.95
    assert abs(estimate.share - measured) < 1.5 * (estimate.high - estimate.low)
