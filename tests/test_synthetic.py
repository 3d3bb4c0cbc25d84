from itertools import pairwise

import numpy as np
import pytest
import torch
from torchrec.datasets.utils import Batch

from fae_torchrec import AccessProfiler
from fae_torchrec.data import KAGGLE_TABLE_SIZES, SyntheticCriteo, scaled_table_sizes
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.data.synthetic import CHUNK_SIZE
from fae_torchrec.stats import FeatureIds


def _all_ids(data: SyntheticCriteo) -> np.ndarray:
    return np.concatenate([block.ids for block in data.blocks()])


def test_batches_are_torchrec_batches_with_ids_in_range():
    data = SyntheticCriteo(5000, batch_size=1024, scale=0.001, seed=1)
    batches = list(data)
    assert len(batches) == len(data) == 5
    assert [b.labels.numel() for b in batches] == [1024] * 4 + [904]
    batch = batches[0]
    assert isinstance(batch, Batch)
    assert batch.dense_features.shape == (1024, 13)
    assert batch.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    ids = FeatureIds.of(batch)
    for key, size in zip(batch.sparse_features.keys(), data.table_sizes, strict=True):
        assert ids.values[key].min() >= 0 and ids.values[key].max() < size
    assert set(torch.unique(batch.labels).tolist()) <= {0, 1}


def test_same_seed_same_data_whatever_the_batch_size():
    a = _all_ids(SyntheticCriteo(CHUNK_SIZE + 100, batch_size=1000, scale=0.01, seed=7))
    b = _all_ids(SyntheticCriteo(CHUNK_SIZE + 100, batch_size=4096, scale=0.01, seed=7))
    c = _all_ids(SyntheticCriteo(CHUNK_SIZE + 100, batch_size=4096, scale=0.01, seed=8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_scale_multiplies_kaggle_table_sizes():
    assert scaled_table_sizes(1.0) == KAGGLE_TABLE_SIZES
    small = scaled_table_sizes(0.01)
    assert small[2] == round(KAGGLE_TABLE_SIZES[2] * 0.01) and min(small) == 1
    with pytest.raises(ValueError, match="scale"):
        scaled_table_sizes(0)


def test_default_skew_is_criteo_like_and_hot_rows_are_not_small_ids():
    data = SyntheticCriteo(300_000, batch_size=CHUNK_SIZE, seed=0)
    ids = _all_ids(data)
    counts = np.concatenate([np.bincount(ids[:, f], minlength=n) for f, n in enumerate(data.table_sizes)])
    top = np.sort(counts)[::-1][: len(counts) // 100]
    assert top.sum() / counts.sum() > 0.9
    big = np.bincount(ids[:, 2], minlength=data.table_sizes[2])
    hottest = np.argsort(big)[::-1][:100]
    assert np.median(hottest) > data.table_sizes[2] / 10


def test_multi_hot_carries_several_ids_per_feature():
    counts = [1, 3] * 13
    data = SyntheticCriteo(500, batch_size=200, scale=0.001, ids_per_feature=counts)
    batch = next(iter(data))
    lengths = batch.sparse_features.length_per_key()
    assert lengths == [200 * c for c in counts]
    assert batch.sparse_features.lengths().tolist()[200:203] == [3, 3, 3]


@pytest.mark.parametrize(("seed", "scale"), [(0, 1.0), (5, 0.01)])
def test_click_rate_is_calibrated(seed, scale):
    data = SyntheticCriteo(CHUNK_SIZE, scale=scale, seed=seed, ctr=0.3)
    assert np.mean(data.chunk(0).labels) == pytest.approx(0.3, abs=0.01)


def test_a_planted_label_gap_makes_fae_hot_inputs_click_less():
    """``label_gap`` changes labels only; inputs that FAE's hot set makes entirely hot then click at
    another rate than the rest (by about the gap), while the click rate stays calibrated."""
    rates = {}
    for gap in (0.0, -1.0):
        data = SyntheticCriteo(4 * CHUNK_SIZE, scale=0.1, seed=4, label_gap=gap)
        blocks = list(data.blocks())
        if gap == 0.0:
            tables = data.table_configs(16)
            stats = AccessProfiler(tables, 0.05, seed=0, holdout_size=1000).profile(data)
            hot_set = stats.hot_set(1 << 20)
            ids = np.concatenate([b.ids for b in blocks])
            hot = np.concatenate([hot_set.is_hot_input(b.to_batch(DEFAULT_CAT_NAMES)) for b in blocks])
            assert 0.1 < hot.mean() < 0.9
        assert np.array_equal(np.concatenate([b.ids for b in blocks]), ids), (
            "the ids do not depend on the gap"
        )
        labels = np.concatenate([b.labels for b in blocks])
        assert labels.mean() == pytest.approx(0.25, abs=0.01)
        rates[gap] = labels[hot].mean() - labels[~hot].mean()
    assert rates[-1.0] < rates[0.0] - 0.05, rates
    with pytest.raises(ValueError, match="popular_rows"):
        SyntheticCriteo(10, popular_rows=0)


def test_labels_are_learnable():
    """Per-row label rates learnt on one part of the data predict labels of another (AUC > 0.6)."""
    data = SyntheticCriteo(200_000, batch_size=CHUNK_SIZE, scale=0.01, seed=3)
    blocks = list(data.blocks())
    train, valid = blocks[:-1], blocks[-1]
    ids = np.concatenate([b.ids for b in train])
    labels = np.concatenate([b.labels for b in train])
    mean = labels.mean()
    score = np.zeros(len(valid))
    for f, n in enumerate(data.table_sizes):
        clicks = np.bincount(ids[:, f], weights=labels, minlength=n)
        shows = np.bincount(ids[:, f], minlength=n)
        rate = (clicks + 10 * mean) / (shows + 10)
        score += np.log(rate / (1 - rate))[valid.ids[:, f]]
    assert _auc(score, valid.labels) > 0.6


def _auc(score: np.ndarray, labels: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(score)) + 1
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_empty_and_invalid_arguments():
    assert list(SyntheticCriteo(0)) == []
    with pytest.raises(ValueError, match="batch_size"):
        SyntheticCriteo(10, batch_size=0)
    with pytest.raises(ValueError, match=r"correlation must be a share in \[0, 1\], got 1.5"):
        SyntheticCriteo(10, correlation=1.5)
    with pytest.raises(ValueError, match="ids_per_feature must be positive"):
        SyntheticCriteo(10, ids_per_feature=0)
    with pytest.raises(ValueError, match="exponent must be one value or 26"):
        SyntheticCriteo(10, exponent=[1.1, 1.2])


def _day_shares(data: SyntheticCriteo, profiled_day: int, budget: int) -> np.ndarray:
    """Per day, the share of its inputs that a hot set profiled on day ``profiled_day`` makes hot: the
    profile reads the first half of that day, the shares the second half of every day."""
    ids = np.concatenate([block.ids for block in data.raw_blocks()])

    def block(start: int, stop: int) -> SampleBlock:
        n = stop - start
        return SampleBlock(np.zeros((n, 13), np.float32), ids[start:stop], np.zeros(n, np.int32), (1,) * 26)

    halves = [(a, (a + b) // 2, b) for a, b in pairwise(data.day_starts())]
    start, middle, _ = halves[profiled_day]
    profiled = block(start, middle).to_batch(data.feature_names)
    hot_set = AccessProfiler(data.table_configs(8), 1.0, holdout_size=0).profile([profiled]).hot_set(budget)
    measured = [block(middle, stop).feature_ids(data.feature_names) for _, middle, stop in halves]
    return np.array([hot_set.is_hot_input(day).mean() for day in measured])


def test_drift_rotates_popularity_day_by_day():
    """Day 0 is the stationary data; a day-0 hot set covers fewer inputs every later day, a hot set
    profiled on the current day covers as many as day 0's did; without drift the days stay alike."""
    common = {"batch_size": 4096, "scale": 0.002, "seed": 5}
    stationary = SyntheticCriteo(16_000, **common)
    drifting = SyntheticCriteo(16_000, days=8, drift=0.001, **common)
    first_day = drifting.day_starts()[1]
    assert np.array_equal(_all_ids(drifting)[:first_day], _all_ids(stationary)[:first_day])
    assert not np.array_equal(_all_ids(drifting)[first_day:], _all_ids(stationary)[first_day:])
    shares = _day_shares(drifting, 0, 256 << 10)
    assert shares[0] > 0.3 and np.all(np.diff(shares) < 0.05) and shares[-1] < shares[0] - 0.2, shares
    current = _day_shares(drifting, 7, 256 << 10)
    assert abs(current[7] - shares[0]) < 0.1 and current[7] > shares[7] + 0.2, (current, shares)
    flat = _day_shares(SyntheticCriteo(16_000, days=8, **common), 0, 256 << 10)
    assert np.ptp(flat[1:]) < 0.1 and abs(flat[-1] - flat[0]) < 0.1, flat
    with pytest.raises(ValueError, match="days"):
        SyntheticCriteo(10, days=0)
    with pytest.raises(ValueError, match="drift"):
        SyntheticCriteo(10, days=2, drift=1.5)
