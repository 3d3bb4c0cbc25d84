from dataclasses import replace

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.data import SyntheticCriteo
from tests.conftest import dense_counts


def _kjt(a, b, c1, c2) -> KeyedJaggedTensor:
    """A KJT from per-feature lists of per-input id lists."""
    features = [a, b, c1, c2]
    return KeyedJaggedTensor(
        keys=["a", "b", "c1", "c2"],
        values=torch.tensor([i for f in features for ids in f for i in ids], dtype=torch.int64),
        lengths=torch.tensor([len(ids) for f in features for ids in f], dtype=torch.int32),
    )


def test_full_sample_counts_every_access(small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0, holdout_size=0)
    counted = profiler.update(_kjt([[1], [1, 2]], [[], [19]], [[5], [5]], [[29, 5], [0]]))
    stats = profiler.stats()
    assert counted.tolist() == [True, True]
    assert [ids.tolist() for ids in stats.seen_rows] == [[1, 2], [19], [0, 5, 29]]
    assert [c.tolist() for c in stats.seen_counts] == [[2, 1], [1], [1, 3, 1]], "c1 and c2 share table t_c"
    assert (stats.num_inputs, stats.num_sampled) == (2, 2)


def test_id_arrays_are_accepted(small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0, holdout_size=0)
    ids = {"a": np.array([1, 2]), "b": np.array([[3, 4], [3, 3]]), "c1": np.array([0, 0])}
    ids["c2"] = np.array([7, 7])
    profiler.update(ids)
    assert dense_counts(profiler.stats())[1][[3, 4]].tolist() == [3, 1]


def test_sample_is_seeded_and_about_the_fraction():
    data = SyntheticCriteo(40_000, batch_size=4096, scale=0.001, seed=0)
    tables = data.table_configs()

    def run(seed):
        profiler = AccessProfiler(tables, sample_fraction=0.1, seed=seed)
        masks = np.concatenate([profiler.update(b) for b in data])
        return masks, profiler.stats()

    masks, stats = run(1)
    again, _ = run(1)
    other, _ = run(2)
    assert np.array_equal(masks, again) and not np.array_equal(masks, other)
    assert stats.num_sampled == masks.sum()
    assert 0.09 < stats.sample_fraction < 0.11
    assert sum(c.sum() for c in stats.seen_counts) == 26 * stats.num_sampled


def test_holdout_is_a_uniform_bounded_sample_of_the_inputs_left_out():
    table = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=4000, feature_names=["x"])
    profiler = AccessProfiler([table], sample_fraction=0.5, seed=3, holdout_size=100)
    for start in range(0, 4000, 250):
        profiler.update({"x": np.arange(start, start + 250)})  # input i carries id i
    stats = profiler.stats()
    held = stats.holdout.rows
    assert len(stats.holdout) == 100 and np.array_equal(np.sort(stats.holdout.owners), np.arange(100))
    assert len(np.unique(held)) == 100
    assert not np.isin(held, stats.seen_rows[0]).any(), "holdout inputs are never counted"
    assert held.min() < 1000 and held.max() > 3000, "drawn from the whole stream"


def test_save_and_load_round_trip(tmp_path, small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=0.5, seed=0, holdout_size=5)
    profiler.update({"a": np.arange(10), "b": np.arange(10), "c1": np.arange(10), "c2": np.ones(10, int)})
    stats = profiler.stats()
    stats.save(tmp_path / "stats.npz")
    loaded = AccessStats.load(tmp_path / "stats.npz", small_tables)
    assert all(np.array_equal(a, b) for a, b in zip(dense_counts(stats), dense_counts(loaded), strict=True))
    assert np.array_equal(stats.holdout.rows, loaded.holdout.rows)
    assert (loaded.num_inputs, loaded.num_sampled) == (stats.num_inputs, stats.num_sampled)
    rebuilt = AccessStats.load(tmp_path / "stats.npz")
    assert [t.name for t in rebuilt.tables] == ["t_a", "t_b", "t_c"]
    assert rebuilt.tables[2].feature_names == ["c1", "c2"]


def test_stats_file_for_other_tables_is_refused(tmp_path, small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0)
    profiler.update({"a": [1], "b": [1], "c1": [1], "c2": [1]})
    profiler.stats().save(tmp_path / "stats.npz")
    other = SyntheticCriteo(1, scale=0.001).table_configs()
    with pytest.raises(ValueError, match="statistics are for other tables: table #0"):
        AccessStats.load(tmp_path / "stats.npz", other)
    bigger = [small_tables[0], replace(small_tables[1], num_embeddings=21), small_tables[2]]
    with pytest.raises(ValueError, match=r"table #1 is .*'t_b', 20.* but .*'t_b', 21"):
        AccessStats.load(tmp_path / "stats.npz", bigger)


def test_id_out_of_range_names_feature_table_and_id(small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0)
    with pytest.raises(ValueError, match=r"feature b \(table t_b\): id 20 out of range \[0, 20\)"):
        profiler.update({"a": [1], "b": [20], "c1": [1], "c2": [1]})
    with pytest.raises(ValueError, match=r"feature c2 \(table t_c\): id -1 out of range"):
        profiler.update({"a": [1], "b": [2], "c1": [1], "c2": [-1]})
    assert profiler.num_inputs == 0, "a rejected batch is not counted at all"


def test_features_must_match_the_tables(small_tables):
    profiler = AccessProfiler(small_tables)
    with pytest.raises(ValueError, match=r"missing \['c2'\], unknown \['d'\]"):
        profiler.update({"a": [1], "b": [2], "c1": [1], "d": [1]})


def test_empty_data_and_bad_arguments(small_tables):
    profiler = AccessProfiler(small_tables)
    with pytest.raises(ValueError, match="no input was sampled: 0 inputs seen"):
        profiler.profile([])
    with pytest.raises(ValueError, match="sample_fraction"):
        AccessProfiler(small_tables, sample_fraction=0.0)
    with pytest.raises(ValueError, match="holdout_size"):
        AccessProfiler(small_tables, holdout_size=-1)
    with pytest.raises(ValueError, match="unique"):
        AccessProfiler([small_tables[0], small_tables[0]])


def test_stats_are_a_snapshot_that_later_updates_leave_alone(small_tables):
    profiler = AccessProfiler(small_tables, sample_fraction=1.0, holdout_size=0)
    profiler.update({"a": [1], "b": [2], "c1": [3], "c2": [3]})
    first = profiler.stats()
    profiler.update({"a": [1, 1], "b": [2, 0], "c1": [4, 4], "c2": [4, 4]})
    second = profiler.stats()
    assert first.seen_counts[0].tolist() == [1] and dense_counts(first)[2][[3, 4]].tolist() == [2, 0]
    assert second.seen_counts[0].tolist() == [3] and dense_counts(second)[2][[3, 4]].tolist() == [2, 4]
    assert all(c.dtype == np.int64 for c in second.seen_rows + second.seen_counts)


@pytest.fixture(scope="module")
def profiled():
    data = SyntheticCriteo(20_000, batch_size=4096, scale=0.001, seed=4)
    return AccessProfiler(data.table_configs(), 0.1, seed=0, holdout_size=500).profile(data)


def test_ranking_and_hot_rows_match_dense_arrays_of_every_row(profiled):
    """The ranking and the hot-row lookups work table by table; a dense array over every row of every
    table, as they were once computed, gives the same answers."""
    ranking = profiled.ranking()
    counts = np.concatenate(dense_counts(profiled))
    seen = np.flatnonzero(counts)
    assert np.array_equal(ranking.rows, seen[np.argsort(-counts[seen], kind="stable")])
    rows = profiled.holdout.rows
    for budget in (0, 1 << 12, 1 << 16, ranking.total_bytes):
        hot_set = ranking.hot_set(budget)
        masks = [hot_set.hot_mask(t) for t in range(len(profiled.tables))]
        assert np.array_equal(hot_set.is_hot_row(rows), np.concatenate(masks)[rows])
        for t, mask in enumerate(masks):
            ids = np.arange(len(mask))
            assert np.array_equal(hot_set.is_hot(t, ids), mask)


def test_everything_shares_one_read_only_arange(small_tables):
    hot_set = HotSet.everything(small_tables)
    for config, ids in zip(small_tables, hot_set.hot_ids, strict=True):
        assert np.array_equal(ids, np.arange(config.num_embeddings)) and ids.dtype == np.int64
        assert not ids.flags.writeable
    assert all(ids.base is hot_set.hot_ids[2].base for ids in hot_set.hot_ids)


def test_loaded_counts_equal_the_saved_ones(tmp_path, profiled):
    profiled.save(tmp_path / "stats.npz")
    loaded = AccessStats.load(tmp_path / "stats.npz")
    for saved, read in zip(
        profiled.seen_rows + profiled.seen_counts, loaded.seen_rows + loaded.seen_counts, strict=True
    ):
        assert read.dtype == saved.dtype and np.array_equal(read, saved)


@pytest.mark.parametrize(("holdout", "bounded"), [(0, False), (700, False), (700, True), (50_000, True)])
def test_profilers_of_consecutive_shares_join_into_the_profiler_of_all(holdout, bounded):
    """Profilers of three shares of the data (as ranks hold them), their counts added and joined on
    the holdout's largest draw, are one profiler of all of it: counts, totals and holdout alike; so
    are shares told the inputs of all of them (``total_inputs``: each keeps only what the holdout of
    all needs)."""
    data = SyntheticCriteo(20_000, scale=0.001, seed=3)
    tables, keys = data.table_configs(4), data.feature_names
    blocks = list(data.split_blocks(False, 5, 1000))
    total = sum(map(len, blocks))
    one = AccessProfiler(tables, 0.1, seed=7, holdout_size=holdout)
    for block in blocks:
        one.update(block.to_batch(keys))
    parts, first = [], 0
    for share in (blocks[:3], blocks[3:4], blocks[4:]):
        profiler = AccessProfiler(tables, 0.1, seed=7, holdout_size=holdout, first_input=first,
                                  total_inputs=total if bounded else None)  # fmt: skip
        for block in share:
            profiler.update(block.to_batch(keys))
        first += sum(map(len, share))
        parts.append(profiler)
    joined = parts[1]
    for other in (parts[0], parts[2]):
        for mine, theirs in zip(joined.counts, other.counts, strict=True):
            mine += theirs
    if bounded and holdout < total:
        assert all(len(part.holdout_draws()) < holdout for part in parts), "each keeps about its part"
    below = joined.holdout_below([part.holdout_draws() for part in parts])
    joined.join([part.share(below) for part in parts])
    assert not joined.holdout_short()
    expected, got = one.stats(), joined.stats()
    for mine, theirs in zip(
        got.seen_rows + got.seen_counts, expected.seen_rows + expected.seen_counts, strict=True
    ):
        np.testing.assert_array_equal(mine, theirs)
    assert (got.num_inputs, got.num_sampled) == (expected.num_inputs, expected.num_sampled)
    assert got.holdout.num_inputs == min(holdout, expected.num_inputs - expected.num_sampled)
    np.testing.assert_array_equal(got.holdout.rows, expected.holdout.rows)
    np.testing.assert_array_equal(got.holdout.owners, expected.holdout.owners)


def test_a_holdout_bound_that_does_not_hold_is_told():
    """Told more inputs than the data holds, the holdout's bound is too tight: it keeps fewer inputs
    than it should, and says so; told the truth, or nothing, it keeps them all."""
    data = SyntheticCriteo(20_000, scale=0.001, seed=3)
    kept = {}
    for told in (None, data.num_samples, 20 * data.num_samples):
        profiler = AccessProfiler(data.table_configs(4), 0.1, seed=7, holdout_size=700, total_inputs=told)
        profiler.profile(data)
        kept[told] = (len(profiler.holdout_draws()), profiler.holdout_short())
    assert kept[None] == kept[data.num_samples] == (700, False)
    assert kept[20 * data.num_samples][0] < 700 and kept[20 * data.num_samples][1]
