import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch
import torchrec
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.stats import Holdout
from fae_torchrec.tables import row_bytes


def _stats(tables, counts) -> AccessStats:
    return AccessStats.of_counts(
        tables=tuple(tables),
        counts=[np.asarray(c, dtype=np.int64) for c in counts],
        num_inputs=100,
        num_sampled=5,
        holdout=Holdout(rows=np.empty(0, np.int64), owners=np.empty(0, np.int64), num_inputs=0),
    )


@pytest.fixture
def stats(small_tables):
    a = np.zeros(10, int)
    a[[3, 7]] = [9, 4]
    b = np.zeros(20, int)
    b[[0, 5, 6]] = [9, 4, 1]
    c = np.zeros(30, int)
    c[[2, 29]] = [8, 4]
    return _stats(small_tables, [a, b, c])


def test_rows_are_ranked_together_and_kept_while_they_fit(stats):
    # row bytes (fp32, no optimizer): t_a 16, t_b 32, t_c 16
    hot = stats.hot_set(16 + 32 + 16)
    assert [h.tolist() for h in hot.hot_ids] == [[3], [0], [2]]
    # next in rank: count 4 in t_a (id 7), t_b (id 5), t_c (id 29): ties go to the earlier table
    hot = stats.hot_set(16 + 32 + 16 + 16 + 31)
    assert [h.tolist() for h in hot.hot_ids] == [[3, 7], [0], [2]], "t_b's row (32 B) does not fit"
    hot = stats.hot_set(16 + 32 + 16 + 16 + 32)
    assert [h.tolist() for h in hot.hot_ids] == [[3, 7], [0, 5], [2]]


def test_zero_budget_is_empty_and_unseen_rows_are_never_hot(stats):
    assert stats.hot_set(0).total_hot == 0
    total = 10 * 16 + 20 * 32 + 30 * 16
    almost = stats.hot_set(total - 1)
    assert almost.total_hot == 7, "only the 7 rows seen in the sample"


def test_budget_that_holds_every_table_makes_every_row_hot(stats):
    total = 10 * 16 + 20 * 32 + 30 * 16
    for budget in (total, 10 * total):
        hot = stats.hot_set(budget)
        assert hot.total_hot == 60 and hot.hot_bytes() == total


def test_negative_budget_is_an_error(stats):
    with pytest.raises(ValueError, match="non-negative"):
        stats.hot_set(-1)


def test_optimizer_state_counts_as_torchrec_counts_it(stats, small_tables):
    assert row_bytes(small_tables[1]) == 32
    assert row_bytes(small_tables[1], torchrec.optim.RowWiseAdagrad) == 36
    assert row_bytes(small_tables[1], torchrec.optim.Adagrad) == 64
    assert row_bytes(small_tables[1], torch.optim.Adam) == 96
    adam = stats.hot_set(3 * 16 + 3 * 32 + 3 * 16, torch.optim.Adam)
    assert [h.tolist() for h in adam.hot_ids] == [[3], [0], [2]]
    assert adam.hot_bytes(torch.optim.Adam) == 3 * 16 + 3 * 32 + 3 * 16


def test_per_table_share_threshold(stats):
    hot = stats.hot_set_by_share(0.3)
    # t_a: 9/13, 4/13 ; t_b: 9/14, 4/14, 1/14 ; t_c: 8/12, 4/12
    assert [h.tolist() for h in hot.hot_ids] == [[3, 7], [0], [2, 29]]
    with pytest.raises(ValueError, match="threshold"):
        stats.hot_set_by_share(0.0)


def test_remap_numbers_the_hot_rows_in_order_and_keeps_the_cold_ids(small_tables):
    hot = HotSet(tuple(small_tables), (np.array([2, 5]), np.arange(20), np.empty(0, np.int64)))
    is_hot, new = hot.remap("t_a", np.arange(10))
    assert np.flatnonzero(is_hot).tolist() == [2, 5]
    assert new[is_hot].tolist() == [0, 1]
    assert new[~is_hot].tolist() == [0, 1, 3, 4, 6, 7, 8, 9], "the cold part keeps every row at its id"
    assert hot.remap("t_b", np.arange(20))[0].all(), "a table whose rows are all hot"
    assert not hot.remap("t_c", np.arange(30))[0].any(), "a table with no hot row"
    assert hot.num_hot == {"t_a": 2, "t_b": 20, "t_c": 0}


def test_an_input_is_hot_when_every_id_of_every_feature_is(small_tables):
    hot = HotSet(tuple(small_tables), (np.array([2, 5]), np.arange(20), np.array([1, 3])))
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c1", "c2"],
        values=torch.tensor([2, 5, 2, 7, 2, 1, 2, 3, 4, 1, 1, 1, 1, 3, 3, 1, 0, 1]),
        lengths=torch.tensor([1, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1, 0, 1, 1, 1, 2]),
    )
    # a: [2] [5,2] [7] [2]   b: [1] [2] [3] [4]   c1: [1] [1,1] [1] []   c2: [3] [3] [1] [0,1]
    assert hot.is_hot_input(kjt).tolist() == [True, True, False, False]


def test_is_hot_input_rejects_ids_out_of_range(small_tables):
    hot = HotSet.everything(small_tables)
    ids = {"a": np.array([1, 10]), "b": np.array([1, 1]), "c1": np.array([0, 0]), "c2": [0, 0]}
    with pytest.raises(ValueError, match=r"feature a \(table t_a\): id 10 out of range"):
        hot.is_hot_input(ids)


def test_invalid_hot_ids_are_refused(small_tables):
    with pytest.raises(ValueError, match="sorted and unique"):
        HotSet(tuple(small_tables), (np.array([5, 2]), np.arange(2), np.arange(2)))
    with pytest.raises(ValueError, match=r"t_a: hot ids outside \[0, 10\)"):
        HotSet(tuple(small_tables), (np.array([10]), np.arange(2), np.arange(2)))


def test_profiled_hot_set_matches_a_naive_count(small_tables):
    rng = np.random.default_rng(0)
    ids = {
        "a": rng.zipf(1.5, 2000) % 10,
        "b": rng.zipf(1.5, 2000) % 20,
        "c1": rng.zipf(1.5, 2000) % 30,
        "c2": rng.zipf(1.5, 2000) % 30,
    }
    profiler = AccessProfiler(small_tables, sample_fraction=1.0, holdout_size=0)
    profiler.update(ids)
    hot = profiler.stats().hot_set(200)
    naive = {
        (t, i): c
        for t, values in enumerate([ids["a"], ids["b"], np.concatenate([ids["c1"], ids["c2"]])])
        for i, c in zip(*np.unique(values, return_counts=True), strict=True)
    }
    ranked = sorted(naive, key=lambda key: (-naive[key], key))
    cost = {0: 16, 1: 32, 2: 16}
    chosen, used = [], 0
    for key in ranked:
        if used + cost[key[0]] > 200:
            break
        chosen.append(key)
        used += cost[key[0]]
    assert sorted((t, int(i)) for t, h in enumerate(hot.hot_ids) for i in h) == sorted(chosen)


def test_remap_rejects_ids_that_are_not_rows(small_tables):
    hot = HotSet.everything(small_tables)
    with pytest.raises(ValueError, match=r"table t_a: id -1 out of range \[0, 10\)"):
        hot.remap("t_a", np.array([0, -1]))
    with pytest.raises(ValueError, match=r"table t_b: id 20 out of range"):
        hot.remap(1, np.array([20]))
    with pytest.raises(IndexError, match="table index 3"):
        hot.hot_mask(3)
    with pytest.raises(KeyError, match="no table 't_x'"):
        hot.remap("t_x", np.array([0]))


def test_tables_need_positive_sizes(small_tables):
    with pytest.raises(ValueError, match="t_a: num_embeddings and embedding_dim must be positive"):
        AccessProfiler([replace(small_tables[0], embedding_dim=0), *small_tables[1:]])


@pytest.mark.parametrize("seed", range(4))
def test_the_bitmap_remap_of_a_block_is_the_search_of_each_table(seed):
    """A block's part ids by the bitmap of hot rows (the offline pass's) are those the sorted hot rows
    give table by table (training's ``HotRowIndex``), for tables split, all hot and all cold."""
    rng = np.random.default_rng(seed)
    sizes = [1, 70, 64, 129, 1000, 5]
    tables = [
        torchrec.EmbeddingBagConfig(name=f"t{t}", embedding_dim=4, num_embeddings=n, feature_names=[f"f{t}"])
        for t, n in enumerate(sizes)
    ]
    shares = [1.0, 0.3, 0.0, 0.5, 0.02, 1.0]
    hot = tuple(np.flatnonzero(rng.random(n) < share) for n, share in zip(sizes, shares, strict=True))
    hot_set = HotSet(tuple(tables), hot)
    columns = np.array([0, 1, 1, 2, 3, 4, 5, 4])
    ids = (rng.random((300, len(columns))) * np.array(sizes)[columns]).astype(np.int64)
    searched = np.stack([hot_set.signed_part_ids(t, ids[:, c]) for c, t in enumerate(columns)], axis=1)
    np.testing.assert_array_equal(hot_set.signed_part_ids_by_column(ids, columns), searched)
    np.testing.assert_array_equal(hot_set.all_hot_by_column(ids, columns), (searched >= 0).all(axis=1))
    np.testing.assert_array_equal(
        hot_set.all_hot_by_column(ids[:, [0, 6]], columns[[0, 6]]), np.ones(300, bool)
    )


def test_the_bitmap_of_a_large_table_costs_a_quarter_byte_a_row_even_as_it_is_built():
    """A re-plan builds it for its new hot set beside the model: no array of a byte a row (the 64 MiB of
    a bool mask at twice Kaggle's rows), only the words and the hot rows before each (1/8 byte a row each)."""
    rows = 1 << 24
    table = torchrec.EmbeddingBagConfig(name="big", embedding_dim=4, num_embeddings=rows, feature_names=["f"])
    hot = np.unique(np.random.default_rng(0).integers(0, rows, 5_000))
    hot_set = HotSet((table,), (hot,))
    tracemalloc.start()
    try:
        words, before, _ = hot_set._row_bits
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.3 * rows, peak
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    np.testing.assert_array_equal(np.flatnonzero(bits), hot)
    np.testing.assert_array_equal(before, np.searchsorted(hot, np.arange(0, rows, 64)))


@pytest.mark.parametrize("rows, dtype", [(1, np.int32), (1 << 31, np.int32), ((1 << 31) + 1, np.int64)])
def test_ids_and_part_ids_are_stored_in_the_narrowest_type_that_holds_them(rows, dtype):
    """Ids up to ``rows - 1`` and signed part ids down to ``~(rows - 1)``: int32 up to 2^31 rows."""
    tables = [
        torchrec.EmbeddingBagConfig(name="big", embedding_dim=4, num_embeddings=rows, feature_names=["f"]),
        torchrec.EmbeddingBagConfig(name="small", embedding_dim=4, num_embeddings=3, feature_names=["g"]),
    ]
    hot_set = HotSet(tuple(tables), (np.array([0]), np.array([1])))
    assert hot_set.layout.id_dtype == dtype
    ids = np.array([[rows - 1, 1], [0, 2]])
    part_ids = hot_set.signed_part_ids_by_column(ids, np.array([0, 1]))
    assert part_ids.dtype == dtype
    searched = [hot_set.signed_part_ids(t, ids[:, t]) for t in range(2)]  # int64
    np.testing.assert_array_equal(part_ids, np.stack(searched, axis=1))
    assert ids.max() <= np.iinfo(dtype).max
