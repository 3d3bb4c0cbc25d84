"""Recent access counts while training (``RecentAccessCounts``) and the measured share's test."""

import numpy as np
import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.stats import AccessProfiler, AccessStats, estimate_hot_share
from fae_torchrec.stats.hot_share import ShareEstimate, clearly_below, measured_share
from fae_torchrec.stats.recent import ENTRY_BYTES, RecentAccessCounts
from tests.conftest import dense_counts


def _tables(*rows: int) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=4, feature_names=[f"f{i}"])
        for i, n in enumerate(rows)
    ]


def test_every_input_counted_gives_the_exact_counts():
    """Sample fraction 1, room for every row, no fading to speak of: the counts are the accesses."""
    rng = np.random.default_rng(0)
    counts = RecentAccessCounts(_tables(50, 7), capacity=50, sample_fraction=1.0, holdout_fraction=0.0,
                                half_life=1e12)  # fmt: skip
    expected = [np.zeros(50, np.int64), np.zeros(7, np.int64)]
    for _ in range(30):
        batch = {"f0": rng.integers(0, 50, (64, 2)), "f1": rng.integers(0, 7, 64)}
        counts.update(batch)
        np.add.at(expected[0], batch["f0"].ravel(), 1)
        np.add.at(expected[1], batch["f1"], 1)
    stats = counts.stats()
    for got, want in zip(dense_counts(stats), expected, strict=True):
        assert np.array_equal(got, want)
    assert stats.num_sampled == stats.num_inputs == 30 * 64


def test_the_statistics_hold_the_kept_rows_alone_and_rank_them_as_dense_counts_do():
    """``stats()`` holds only the kept rows; its ranking and hot sets are those of statistics made of
    arrays of every row (ties included: many rows share a count here)."""
    rng = np.random.default_rng(4)
    tables = _tables(5000, 300, 40)
    counts = RecentAccessCounts(tables, capacity=[400, 100, 40], sample_fraction=0.3, holdout_fraction=0.1,
                                holdout_size=200, half_life=20)  # fmt: skip
    for _ in range(60):
        ids = np.minimum(rng.zipf(1.2, (128, 3)), 40) - 1
        counts.update({"f0": ids[:, 0] * 97 % 5000, "f1": ids[:, 1] * 7 % 300, "f2": ids[:, 2]})
    stats = counts.stats()
    assert all(len(ids) <= cap for ids, cap in zip(stats.seen_rows, [400, 100, 40], strict=True))
    assert all(
        np.all(np.diff(ids) > 0) and np.all(c > 0)
        for ids, c in zip(stats.seen_rows, stats.seen_counts, strict=True)
    )
    dense = AccessStats.of_counts(
        tables, dense_counts(stats), stats.num_inputs, stats.num_sampled, stats.holdout
    )
    counts = np.concatenate(dense_counts(stats))
    seen = np.flatnonzero(counts)
    assert np.array_equal(stats.ranking().rows, seen[np.argsort(-counts[seen], kind="stable")])
    row_bytes = 4 * 4
    for budget in (0, 10 * row_bytes, 97 * row_bytes, 400 * row_bytes, 10**9):
        got, want = stats.hot_set(budget).hot_ids, dense.hot_set(budget).hot_ids
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), budget


def test_old_accesses_fade_with_the_half_life():
    counts = RecentAccessCounts(
        _tables(10), capacity=10, sample_fraction=1.0, holdout_fraction=0.0, half_life=4
    )
    counts.update({"f0": np.full(800, 3)})
    for _ in range(8):  # two half-lives of accesses to another row
        counts.update({"f0": np.full(100, 5)})
    counted = dense_counts(counts.stats())[0]
    assert counted[3] == 200  # 800 / 2 ** (8 / 4)
    assert counted[5] > 100  # its most recent step counts whole


def test_memory_is_bounded_per_table_and_the_largest_counts_stay():
    rng = np.random.default_rng(1)
    counts = RecentAccessCounts(_tables(100_000, 30), capacity=[500, 100], sample_fraction=0.5,
                                holdout_fraction=0.2, holdout_size=300)  # fmt: skip
    assert list(counts.capacity) == [500, 30]  # at most a table's rows
    assert list(counts.bytes_per_table()) == [2 * 500 * ENTRY_BYTES, 2 * 30 * ENTRY_BYTES]
    for _ in range(200):
        ids = np.minimum(rng.zipf(1.3, 256), 100_000) - 1
        counts.update({"f0": ids, "f1": rng.integers(0, 30, 256)})
        kept = counts._rows  # the kept rows, pending ones merged past twice the capacity
        assert len(kept) + counts._pending_rows <= 2 * int(counts.capacity.sum()) + 512
    stats = counts.stats()
    assert len(stats.seen_rows[0]) <= 500
    assert stats.seen_rows[0][0] == 0 and stats.seen_counts[0][0] == stats.seen_counts[0].max()  # zipf rank 1
    assert 300 <= len(stats.holdout) < 300 + 256
    assert counts.holdout_bytes() == 16 * len(stats.holdout.rows)


def test_recent_counts_follow_drift_where_the_first_profile_does_not():
    """Eight days of rotating popularity streamed step by step: the hot set of the recent counts
    covers today's held-out inputs about as well as a profile of today, the day-0 profile far less."""
    data = SyntheticCriteo(48_000, batch_size=1000, scale=0.002, seed=2, days=8, drift=0.001)
    tables = data.table_configs(8)
    budget = 256 << 10
    blocks = list(data.blocks())
    first = AccessProfiler(tables, 0.5, seed=0, holdout_size=0).profile(
        b.to_batch(data.feature_names) for b in blocks[:6]
    )
    counts = RecentAccessCounts(tables, capacity=4000, sample_fraction=0.3, half_life=6, holdout_fraction=0.3)
    for block in blocks[:-6]:
        counts.update(block.feature_ids(data.feature_names))
    recent = counts.stats()
    today = AccessProfiler(tables, 0.5, seed=0, holdout_size=0).profile(
        b.to_batch(data.feature_names) for b in blocks[-12:-6]
    )
    hot_sets = {
        "recent": recent.hot_set(budget),
        "today": today.hot_set(budget),
        "day 0": first.hot_set(budget),
    }
    held_out = np.concatenate([b.ids for b in blocks[-6:]])
    ids = {key: held_out[:, [i]] for i, key in enumerate(data.feature_names)}
    shares = {name: hot_set.is_hot_input(ids).mean() for name, hot_set in hot_sets.items()}
    assert shares["today"] > 0.25 and abs(shares["recent"] - shares["today"]) < 0.05, shares
    assert shares["day 0"] < shares["today"] - 0.1, shares
    estimate = estimate_hot_share(recent, hot_sets["recent"])  # from the recent holdout
    assert abs(estimate.share - shares["recent"]) < 0.1, (estimate, shares)


def test_a_share_is_clearly_below_only_beyond_its_interval():
    planned = ShareEstimate(0.5, 0.49, 0.51, 10_000)
    assert clearly_below(measured_share(400, 1000), planned, 0.02)
    assert not clearly_below(measured_share(470, 1000), planned, 0.02)  # within chance and margin
    assert not clearly_below(measured_share(40, 100), planned, 0.02)  # too few inputs to tell


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="fraction"):
        RecentAccessCounts(_tables(5), 5, sample_fraction=0.8, holdout_fraction=0.3)
    with pytest.raises(ValueError, match="capacity"):
        RecentAccessCounts(_tables(5), 0)
    with pytest.raises(ValueError, match="no input counted"):
        RecentAccessCounts(_tables(5), 5).stats()
