"""TBSM's Taobao layout: features and tables, samples, the UserBehavior.csv reader, synthetic events, and
the command-line source (real data from ``FAE_TAOBAO_CSV``, skipped when unset)."""

import argparse

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec.command_line import add_taobao_arguments
from fae_torchrec.data import (
    REFERENCE_TABLE_SIZES,
    Events,
    SyntheticTaobao,
    TaobaoCsvReader,
    read_user_behavior,
    taobao_like_events,
    tbsm_feature_names,
    tbsm_samples,
    tbsm_table_configs,
)
from fae_torchrec.recipes.sources import open_taobao_source
from tests.conftest import taobao_slice


def _events(user, item, category, timestamp, num_items=None) -> Events:
    user, item, category, timestamp = (
        np.asarray(c, dtype=np.int64) for c in (user, item, category, timestamp)
    )
    sizes = (int(user.max()) + 1, (num_items or int(item.max())) + 1, int(category.max()) + 1)
    return Events(user, item, category, np.zeros(len(user), dtype=np.int8), timestamp, sizes)


def _chain_events(num_users=300, num_items=50, seed=0) -> Events:
    """Users 1..num_users with 1..30 events each; a user's items follow one another (item ``i`` is
    followed by ``i % num_items + 1``), so a sample's real target is known from its last past item.
    An item's category is ``item % 7 + 1``; events are shuffled."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 31, num_users)
    user = np.repeat(np.arange(1, num_users + 1), counts)
    position = np.arange(len(user)) - np.repeat(np.cumsum(counts) - counts, counts)
    item = (np.repeat(rng.integers(num_items, size=num_users), counts) + position) % num_items + 1
    timestamp = np.repeat(rng.integers(0, 1000, num_users), counts) + 10 * position
    shuffle = rng.permutation(len(user))
    return _events(user[shuffle], item[shuffle], item[shuffle] % 7 + 1, timestamp[shuffle], num_items)


def _columns(block, ts_length):
    steps = ts_length + 1
    return block.ids[:, :steps], block.ids[:, steps : 2 * steps], block.ids[:, 2 * steps :]


# Layout


def test_feature_names_are_table_major_with_two_digits_at_least():
    names = tbsm_feature_names()
    assert len(names) == 63
    assert names[:2] == ["user_00", "user_01"] and names[20] == "user_20"
    assert names[21] == "item_00" and names[42] == "category_00" and names[-1] == "category_20"
    assert tbsm_feature_names(3) == [f"{t}_0{s}" for t in ("user", "item", "category") for s in range(4)]
    assert tbsm_feature_names(100)[:2] == ["user_000", "user_001"]


def test_table_configs_read_every_step_of_their_kind():
    configs = tbsm_table_configs((5, 9, 4), embedding_dim=8, ts_length=2)
    assert [c.name for c in configs] == ["t_user", "t_item", "t_category"]
    assert [c.num_embeddings for c in configs] == [5, 9, 4]
    assert configs[1].feature_names == ["item_00", "item_01", "item_02"]
    assert all(c.embedding_dim == 8 for c in configs)
    for bad in [(5, 9), (5, 0, 4)]:
        with pytest.raises(ValueError, match="3 positive table sizes"):
            tbsm_table_configs(bad)


def test_events_refuse_rows_outside_their_tables():
    with pytest.raises(ValueError, match=r"item ids must be rows 1\.\.2"):
        _events([1], [3], [1], [0], num_items=2)
    with pytest.raises(ValueError, match=r"item ids must be rows 1\.\.2, found 0"):
        Events(*(np.array([1, 0]) if c == 1 else np.array([1, 1]) for c in range(5)), table_sizes=(2, 3, 2))


# Samples


def test_windows_of_a_short_history_are_padded_at_the_front():
    # User 1: 3 events (a training user); users 2..10 end later, 9 and 10 after the split (time 108).
    user = [1, 1, 1, *range(2, 11)]
    item = [1, 2, 3, *range(4, 13)]
    category = [1, 1, 2, *[3] * 9]
    timestamp = [30, 10, 20, *range(102, 111)]
    train, validation = tbsm_samples(_events(user, item, category, timestamp), ts_length=4, seed=3)
    users, items, categories = _columns(train, 4)
    mine = users[:, 0] == 1
    assert mine.sum() == 2, "targets at positions 1 and 2: a target needs a past event"
    assert (users[mine] == 1).all(), "the user row stays at padded steps"
    # In time order the user's items are 2, 3, 1 (categories 1, 2, 1).
    assert sorted(map(tuple, items[mine, :-1])) == [(0, 0, 0, 2), (0, 0, 2, 3)]
    assert sorted(map(tuple, categories[mine, :-1])) == [(0, 0, 0, 1), (0, 0, 1, 2)]
    real = np.where(items[mine, -2] == 2, 3, 1)
    assert np.array_equal(items[mine, -1] == real, train.labels[mine] == 1)
    assert np.array_equal(
        categories[mine, -1], np.where(items[mine, -1] == 3, 2, np.where(items[mine, -1] < 4, 1, 3))
    )
    assert len(train) == 2, "users 2..8 have one event: no training window"
    # Validation: users 9 and 10, one event each, so an all-padded history and the event as target.
    assert validation.ids[:, 0].tolist() == [9, 10]
    _, v_items, v_categories = _columns(validation, 4)
    assert (v_items[:, :-1] == 0).all() and (v_categories[:, :-1] == 0).all()
    np.testing.assert_allclose(train.dense[0], np.arange(5) / 5)
    assert train.ids_per_feature == (1,) * 15 and train.ids.dtype == np.int64
    assert train.labels.dtype == np.int32 and train.dense.dtype == np.float32


def test_users_split_by_last_time_and_windows_per_user():
    events = _chain_events()
    train, validation = tbsm_samples(events, ts_length=5, points_per_user=4, test_share=0.3, seed=1)
    users = np.unique(events.user)
    last = np.array([events.timestamp[events.user == u].max() for u in users])
    counts = np.array([np.sum(events.user == u) for u in users])
    test = last > np.sort(last)[int(len(users) * 0.7)]
    assert 0.25 < test.mean() <= 0.3
    assert validation.ids[:, 0].tolist() == users[test].tolist(), "one window per test user, user order"
    per_user = np.bincount(train.ids[:, 0], minlength=users.max() + 1)[users]
    assert np.array_equal(per_user, np.where(test, 0, np.minimum(4, counts - 1)))
    assert not np.all(np.diff(train.ids[:, 0]) >= 0), "training samples come shuffled"
    _, v_items, _ = _columns(validation, 5)
    for u, row in zip(users[test], v_items, strict=True):
        real = events.item[events.user == u][np.argsort(events.timestamp[events.user == u])]
        history = row[:-1][row[:-1] > 0]
        assert np.array_equal(history, real[-len(history) - 1 : -1] if len(history) else history)


def test_half_the_targets_are_replaced_by_another_item_of_its_category():
    events = _chain_events(num_users=2000)
    train, validation = tbsm_samples(events, ts_length=5, seed=2)
    for block in (train, validation):
        _, items, categories = _columns(block, 5)
        assert abs(block.labels.mean() - 0.5) < 0.03
        assert np.array_equal(categories[:, -1], items[:, -1] % 7 + 1), "a target keeps its item's category"
        known = items[:, -2] > 0
        real = items[known, -2] % 50 + 1
        assert np.array_equal(items[known, -1] == real, block.labels[known] == 1)
    replaced = np.concatenate([_columns(b, 5)[1][b.labels == 0, -1] for b in (train, validation)])
    assert len(np.unique(replaced)) == 50, "replacements are drawn among all items"


def test_same_seed_same_samples():
    events = _chain_events()
    a, b = tbsm_samples(events, seed=5), tbsm_samples(events, seed=5)
    c = tbsm_samples(events, seed=6)
    assert all(np.array_equal(x.ids, y.ids) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0].ids, c[0].ids)


def test_source_blocks_batches_and_tables_fit_an_embedding_bag_collection():
    source = SyntheticTaobao(500, batch_size=64, scale=0.001, ts_length=3, seed=1)
    assert sum(map(len, source.raw_blocks())) == source.num_train + source.num_validation
    validation = list(source.split_blocks(validation=True, every=7, block_size=100))
    assert [len(b) for b in validation][:-1] == [100] * (len(validation) - 1)
    assert np.array_equal(np.concatenate([b.ids for b in validation]), source.validation.ids)
    train = np.concatenate([b.ids for b in source.split_blocks(False, 7, 1000)])
    assert np.array_equal(train, source.train.ids)
    batch = next(iter(source))
    assert batch.sparse_features.keys() == tbsm_feature_names(3)
    ebc = EmbeddingBagCollection(tables=source.table_configs(4), device=torch.device("cpu"))
    pooled = ebc(batch.sparse_features)
    assert pooled.values().shape == (64, 12 * 4)


def test_bad_parameters():
    events = _chain_events(num_users=10)
    for kwargs, message in [
        ({"ts_length": 0}, "ts_length"),
        ({"points_per_user": 0}, "points_per_user"),
        ({"test_share": 1.0}, "test_share"),
    ]:
        with pytest.raises(ValueError, match=message):
            tbsm_samples(events, **kwargs)
    with pytest.raises(ValueError, match="two distinct items"):
        tbsm_samples(_events([1, 2], [1, 1], [1, 1], [0, 1]))


# Reader

CSV = "543462,1715,1464116,pv,1511658000\n662867,2244074,1575622,buy,1511658000\n"
CSV_2 = "543462,17,1464116,cart,1511658100\n7,1715,1575622,fav,1511658200"


def test_reader_remaps_ids_and_reads_several_files_in_chunks(tmp_path):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text(CSV)
    second.write_text(CSV_2)
    events = read_user_behavior([first, second])
    assert len(events) == 4
    assert events.user.tolist() == [2, 3, 2, 1], "users 7 < 543462 < 662867 become rows 1, 2, 3"
    assert events.item.tolist() == [2, 3, 1, 2]
    assert events.category.tolist() == [1, 2, 1, 2]
    assert events.behavior.tolist() == [0, 1, 2, 3]
    assert events.timestamp.tolist() == [1511658000, 1511658000, 1511658100, 1511658200]
    assert events.table_sizes == (4, 4, 3)
    chunked = read_user_behavior([first, second], chunk_bytes=7)
    for name in ("user", "item", "category", "behavior", "timestamp"):
        assert np.array_equal(getattr(chunked, name), getattr(events, name))
    source = TaobaoCsvReader([first, second], batch_size=2, ts_length=2)
    assert source.table_configs()[0].num_embeddings == 4
    assert source.num_train + source.num_validation >= 1


GOOD = "1,2,3,pv,100"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1,2,3,pv", "expected 5 comma-separated fields .*found 4"),
        ("1,2,3,pv,100,7", "found 6"),
        ("1,2x,3,pv,100", "field item_id '2x' is not a non-negative integer"),
        ("1,2,-3,pv,100", "field category_id '-3' is not a non-negative integer"),
        ("1,-0,3,pv,100", "field item_id '-0' is not a non-negative integer"),
        ("1,2,3,pv,", "field timestamp '' is not a non-negative integer"),
        ("1,2,3,click,100", r"field behavior_type 'click' is not a behaviour \(pv, buy, cart, fav\)"),
        ("1,2,3,p,100", "field behavior_type 'p' is not a behaviour"),
        (GOOD + "\r", "carriage return in line"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([GOOD, GOOD, line, GOOD]) + "\n")
    with pytest.raises(ValueError, match=rf"bad\.csv:3: .*{message}"):
        read_user_behavior(path, chunk_bytes=8)


def test_empty_file_has_no_events(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(ValueError, match=r"empty\.csv: no events"):
        read_user_behavior(path)


# Synthetic


def test_synthetic_is_deterministic_by_seed():
    a = SyntheticTaobao(300, scale=0.001, seed=4)
    b = SyntheticTaobao(300, scale=0.001, seed=4)
    c = SyntheticTaobao(300, scale=0.001, seed=5)
    assert np.array_equal(a.train.ids, b.train.ids) and np.array_equal(a.validation.ids, b.validation.ids)
    assert not np.array_equal(a.train.ids, c.train.ids)
    assert a.table_sizes == (989, 4163, 10), "at least num_users user rows, plus padding row 0"


def test_synthetic_items_are_skewed_and_targets_follow_the_history():
    events = taobao_like_events(5000, (10_000, 40_000, 100), seed=0)
    assert events.table_sizes == (10_001, 40_001, 101)
    counts = np.sort(np.bincount(events.item))[::-1]
    assert counts[: 40_000 // 100].sum() / counts.sum() > 0.3, "top 1% of items"
    order = np.lexsort((events.timestamp, events.user))
    assert np.all(np.diff(events.user[order]) >= 0)
    source = SyntheticTaobao(5000, table_sizes=(10_000, 40_000, 100), seed=0)
    _, _, categories = _columns(source.train, 20)
    shared = (categories[:, :-1] == categories[:, -1:]).any(axis=1)
    real, replaced = shared[source.train.labels == 1].mean(), shared[source.train.labels == 0].mean()
    assert real > replaced + 0.3, (real, replaced)


# Command line


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_taobao_arguments(parser, num_users=200, scale=0.001)
    return parser.parse_args(list(argv))


def test_open_taobao_source(tmp_path):
    source = open_taobao_source(_args("--ts-length", "4", "--points-per-user", "2"), batch_size=32)
    assert isinstance(source, SyntheticTaobao) and source.feature_names[-1] == "category_04"
    assert source.table_sizes[1] == round(REFERENCE_TABLE_SIZES[1] * 0.001) + 1
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("300, 500 # users, items\n20\n")
    source = open_taobao_source(_args("--tables", str(sizes), "--scale", "1"), batch_size=32)
    assert source.table_sizes == (301, 501, 21)
    sizes.write_text("300, 500\n")
    with pytest.raises(ValueError, match=r"--tables: .*2 table sizes, expected 3 \(user, item, category\)"):
        open_taobao_source(_args("--tables", str(sizes)), batch_size=32)
    csv = tmp_path / "UserBehavior.csv"
    csv.write_text(CSV + CSV_2)
    source = open_taobao_source(_args("--data", "taobao-csv", str(csv)), batch_size=32)
    assert isinstance(source, TaobaoCsvReader) and source.table_sizes == (4, 4, 3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "criteo-tsv", "x"], "--data: unknown kind 'criteo-tsv'"),
        (["--data", "synthetic", "x"], "--data synthetic: takes no path"),
        (["--data", "taobao-csv"], "--data taobao-csv: needs a path"),
        (["--data", "taobao-csv", "/nonexistent.csv"], "--data taobao-csv: no such file"),
        (["--data", "taobao-csv", "/"], "--data taobao-csv: a directory"),
        (["--data", "taobao-csv", __file__, "--tables", "reference"], "--tables: synthetic data only"),
        (["--tables", "/nonexistent.txt"], "--tables: .*cannot read table sizes"),
        (["--tables", __file__], "--tables: .*is not a table size"),
        (["--data", "taobao-csv", __file__, "--scale", "1"], "--scale: synthetic data only"),
        (["--test-share", "1"], "--test-share: must be below 1"),
        (["--scale", "1e300"], "--scale: "),
    ],
)
def test_open_taobao_source_errors_name_the_option(argv, message):
    with pytest.raises(ValueError, match=message):
        open_taobao_source(_args(*argv), batch_size=32)


# Real data


def test_real_two_hour_slice():
    events = read_user_behavior(taobao_slice())
    assert len(events) == 110_300
    assert events.table_sizes == (66_454 + 1, 84_793 + 1, 3_913 + 1)
    assert np.bincount(events.behavior).tolist() == [98_361, 2_493, 6_063, 3_383]
    assert events.timestamp.min() == 1_511_658_000 and events.timestamp.max() == 1_511_665_811
    train, validation = tbsm_samples(events)
    assert len(validation) == 19_927, "users whose last event is after the 70th percentile"
    assert len(train) == 26_630, "min(10, events - 1) windows per training user"
    assert abs(np.concatenate([train.labels, validation.labels]).mean() - 0.5) < 0.01
