"""Partition, schedule and router: every input exactly once per epoch, hot steps hot, ranks in step."""

import tracemalloc
from collections import Counter
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
import torch

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.command_line import STREAM_ORDERS
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.data.row_chain import RowChain
from fae_torchrec.stats.hot_set import COLD, HOT
from fae_torchrec.train import schedule
from fae_torchrec.train.partition import HotColdPartition, balanced
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.schedule import ORDERS, make_schedule, trained_inputs


@pytest.fixture(scope="module")
def data():
    synthetic = SyntheticCriteo(6_000, batch_size=1000, scale=0.002, seed=4)
    stats = AccessProfiler(synthetic.table_configs(), 0.3, seed=0, holdout_size=500).profile(synthetic)
    return synthetic, stats.hot_set(16 << 10)


def _covered(steps, world_size):
    return Counter(
        (part, i)
        for step in steps
        for r in range(world_size)
        for part, a, b in step.spans[r]
        for i in range(a, b)
    )


def _mask(num_hot, num_cold, seed=0, arrangement="random"):
    """Which inputs of a data set are hot: ``num_hot`` of them, at random places, first or last."""
    first = np.arange(num_hot + num_cold) < num_hot
    return {"random": np.random.default_rng(seed).permutation(first), "first": first, "last": first[::-1]}[
        arrangement
    ]


def _positions(is_hot, steps, world_size):
    """For each input of the data, how many inputs the epoch trains before its step."""
    part_to_data = {HOT: np.flatnonzero(is_hot), COLD: np.flatnonzero(~is_hot)}
    positions, done = np.full(len(is_hot), -1), 0
    for step in steps:
        for spans in step.spans:
            for part, a, b in spans:
                positions[part_to_data[part][a:b]] = done
        done += sum(step.size(r) for r in range(world_size))
    return positions


def _check_steps(steps, num_hot, num_cold, batch_size, world_size):
    """Every input exactly once; hot steps full and only hot; no rank idle, none twice loaded."""
    expected = Counter([(HOT, i) for i in range(num_hot)] + [(COLD, i) for i in range(num_cold)])
    assert _covered(steps, world_size) == expected
    for step in steps:
        sizes = [step.size(r) for r in range(world_size)]
        assert min(sizes) >= 1, "every rank trains on something at every step"
        if step.hot:
            assert sizes == [batch_size] * world_size
            assert all(part == HOT for spans in step.spans for part, _, _ in spans)
        else:
            assert max(sizes) < 2 * batch_size


@pytest.mark.parametrize("arrangement", ["random", "first", "last"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(
    ("num_hot", "num_cold", "batch_size"), [(25, 13, 4), (24, 0, 4), (3, 40, 8), (0, 9, 3), (8, 1, 4)]
)
def test_every_input_exactly_once_and_hot_steps_only_hot(
    arrangement, world_size, order, num_hot, num_cold, batch_size
):
    steps = make_schedule(
        _mask(num_hot, num_cold, arrangement=arrangement), batch_size, world_size, order, seed=1
    )
    _check_steps(steps, num_hot, num_cold, batch_size, world_size)
    if order == "phases":
        kinds = [s.hot for s in steps]
        assert kinds == sorted(kinds), "all cold steps, then all hot steps"


@pytest.mark.parametrize("order", ["stream", "shuffled"])
def test_random_orders_are_seeded_per_epoch(order):
    is_hot = _mask(50, 50)
    same = make_schedule(is_hot, 4, 2, order, seed=3, epoch=1)
    assert same == make_schedule(is_hot, 4, 2, order, seed=3, epoch=1)
    assert same != make_schedule(is_hot, 4, 2, order, seed=3, epoch=2)
    assert same != make_schedule(is_hot, 4, 2, order, seed=4, epoch=1)
    kinds = [s.hot for s in same]
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True), "interleaved"


def test_stream_order_without_hot_inputs_is_the_data_in_random_blocks():
    steps = make_schedule(np.zeros(10 * 16 + 3, dtype=bool), 8, 2, "stream", seed=2)
    assert [sum(step.size(r) for r in range(2)) for step in steps] == [16] * 9 + [16 + 3]
    spans = [span for step in steps for rank in step.spans for span in rank]
    # the spans read one after another, joined where one goes on where the last stopped: the blocks read
    runs = [[*spans[0][1:]]]
    for _, start, stop in spans[1:]:
        if start == runs[-1][1]:
            runs[-1][1] = stop
        else:
            runs.append([start, stop])
    blocks = [(start, stop) for run in runs for start, stop in pairwise(range(run[0], run[1] + 1, 16))]
    assert sorted(blocks) != blocks, "in a random order"
    assert sorted(tuple(run) for run in runs) != [(0, 163)] and (160, 163) in [tuple(r) for r in runs[:-1]], (
        "the short last block among the others"
    )


@pytest.mark.parametrize(
    "is_hot", [np.zeros(40 * 16 + 3, dtype=bool), _mask(240, 403)], ids=["baseline", "fae"]
)
def test_the_remainder_step_takes_other_inputs_each_epoch(is_hot):
    """The last cold step takes the remainder (3 inputs beyond a full step here): in the stream order the
    inputs it holds vary with the seed and the epoch, the short last block's only now and then, and every
    input still trains once; the time order keeps the data's order, its last inputs last."""

    def remainder_step(order: str, seed: int, epoch: int) -> frozenset:
        steps = make_schedule(is_hot, 8, 2, order, seed=seed, epoch=epoch)
        _check_steps(steps, int(is_hot.sum()), int((~is_hot).sum()), 8, 2)
        last = [step for step in steps if not step.hot][-1]
        assert sum(last.size(r) for r in range(2)) > 16, "the remainder joins the last cold step"
        return frozenset(np.flatnonzero(trained_inputs(is_hot, [last])).tolist())

    short_block = set(np.flatnonzero(~is_hot[640:]) + 640)  # its cold inputs
    last = [remainder_step("stream", seed, epoch) for seed in range(4) for epoch in range(3)]
    assert len(set(last)) == len(last), "other inputs at every seed and epoch"
    assert sum(short_block <= inputs for inputs in last) <= len(last) // 4, "the short block seldom last"
    assert all(short_block <= remainder_step("time", seed, 2) for seed in range(2))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_trained_inputs_are_the_inputs_of_the_steps_done(order, world_size, monkeypatch):
    """Any prefix of an epoch: the inputs its spans hold, where ``is_hot`` is read a chunk at a time
    (chunks that cut steps' blocks) from several files (a ``RowChain``)."""
    monkeypatch.setattr(schedule, "COUNT_CHUNK", 96)
    is_hot = _mask(700, 541, seed=3)
    warmup = 0.3 if order in STREAM_ORDERS else 0.0
    steps = make_schedule(is_hot, 8, world_size, order, seed=5, warmup=warmup)
    chained = RowChain([is_hot[:300], is_hot[300:301], is_hot[301:]])
    for done in (0, 1, len(steps) // 2, len(steps)):
        positions = _positions(is_hot, steps[:done], world_size)
        np.testing.assert_array_equal(trained_inputs(chained, steps[:done]), positions >= 0)


def test_trained_inputs_hold_two_bytes_per_input():
    """Half an epoch of 20M inputs: the result and a byte per input besides, whatever the data's size
    (the positions of each part's inputs alone took 8)."""
    is_hot = np.random.default_rng(0).random(20_000_000) < 0.6
    steps = make_schedule(is_hot, 4096, 2, seed=0)
    tracemalloc.start()
    try:
        trained = trained_inputs(is_hot, steps[: len(steps) // 2])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0.4 < trained.mean() < 0.6
    # the result, a byte per input, and a chunk of is_hot with its inverse
    assert peak < 2 * len(is_hot) + 3 * schedule.COUNT_CHUNK, f"{peak / len(is_hot):.2f} bytes per input"


def test_time_order_reads_the_blocks_in_the_data_order():
    """Cold data, then hot data: the time order trains the cold steps first, each block where it lies,
    whatever the seed."""
    is_hot = np.concatenate([np.zeros(64, dtype=bool), np.ones(64, dtype=bool)])
    for seed in (0, 1):
        steps = make_schedule(is_hot, 8, 2, "time", seed=seed)
        assert [s.hot for s in steps] == [False] * 4 + [True] * 4
        starts = [step.spans[0][0][1] for step in steps]
        assert starts == [0, 16, 32, 48, 0, 16, 32, 48], "each part in the data's order"


@pytest.mark.parametrize("share", [0.1, 0.5, 0.8])
def test_stream_order_trains_every_input_close_to_where_the_baseline_does(share):
    """The baseline's order is the stream order of the same data with nothing hot; FAE's stream order
    trains each input at most a few steps away from it (the shuffled order: anywhere in the epoch)."""
    batch_size, world_size, rounds = 8, 2, 250
    is_hot = np.random.default_rng(7).random(rounds * batch_size * world_size) < share
    nothing_hot = np.zeros_like(is_hot)
    baseline = _positions(nothing_hot, make_schedule(nothing_hot, batch_size, world_size, seed=3), world_size)
    schedules = {
        order: make_schedule(is_hot, batch_size, world_size, order, 3) for order in ("stream", "shuffled")
    }
    assert len({sum(step.hot for step in steps) for steps in schedules.values()}) == 1, "the same hot steps"
    moved = {order: np.abs(_positions(is_hot, steps, world_size) - baseline) / (batch_size * world_size)
             for order, steps in schedules.items()}  # fmt: skip
    assert moved["stream"].mean() < 1 and moved["stream"].max() <= 20
    assert moved["shuffled"].mean() > 30


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize(
    ("num_hot", "num_cold", "batch_size"), [(25, 13, 4), (24, 0, 4), (8, 1, 4), (300, 200, 4), (700, 20, 8)]
)
@pytest.mark.parametrize("warmup", [0.25, 1.0])
def test_warm_up_trains_the_first_blocks_in_cold_steps(world_size, num_hot, num_cold, batch_size, warmup):
    is_hot = _mask(num_hot, num_cold)
    steps = make_schedule(is_hot, batch_size, world_size, "stream", seed=1, warmup=warmup)
    _check_steps(steps, num_hot, num_cold, batch_size, world_size)
    warm = round(warmup * -(-len(is_hot) // (batch_size * world_size)))  # blocks of one step's inputs
    cold = len(steps) - sum(step.hot for step in steps)  # the last cold step runs at the epoch's end
    short = len(is_hot) % (batch_size * world_size) != 0  # a short block among the warm-up's fills none
    assert not any(step.hot for step in steps[: max(min(warm - short, cold - 1), 0)]), (
        "a warm-up block fills a cold step"
    )
    without = make_schedule(is_hot, batch_size, world_size, "stream", seed=1)
    hot, hot_without = sum(step.hot for step in steps), sum(step.hot for step in without)
    assert hot_without - warm - 1 <= hot <= hot_without, "a warm-up block takes at most one hot step"
    if warmup == 1.0:
        assert hot == 0
    later = make_schedule(is_hot, batch_size, world_size, "stream", seed=1, epoch=1, warmup=warmup)
    assert later == make_schedule(is_hot, batch_size, world_size, "stream", seed=1, epoch=1), (
        "first epoch only"
    )


def test_schedule_errors():
    assert make_schedule(np.zeros(0, dtype=bool), 4, 2) == [], "no input, no step"
    with pytest.raises(ValueError, match="2 inputs left for cold steps but 3 ranks"):
        make_schedule(_mask(0, 2), 4, 3)
    assert [s.hot for s in make_schedule(_mask(8, 1), 4, 2)] == [False], "a hot step's inputs make room"
    with pytest.raises(ValueError, match="unknown order 'random'"):
        make_schedule(_mask(1, 1), 1, 1, "random")
    with pytest.raises(
        ValueError, match=r"warm-up \(of the first epoch\) must be a share in \[0, 1\], got 1.5"
    ):
        make_schedule(_mask(1, 1), 1, 1, warmup=1.5)
    with pytest.raises(
        ValueError, match="a warm-up is part of the stream and time orders, not of the 'shuffled' order"
    ):
        make_schedule(_mask(1, 1), 1, 1, "shuffled", warmup=0.1)


def test_partition_in_memory_and_on_disk(data, tmp_path):
    synthetic, hot_set = data
    memory = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    disk = HotColdPartition.write(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES, tmp_path / "part")
    assert len(memory.hot) + len(memory.cold) == 6_000
    assert 0 < len(memory.hot) < 6_000
    everything = SampleBlock.concat(list(synthetic.blocks()))
    assert np.array_equal(memory.is_hot, hot_set.is_hot_input(everything.feature_ids(DEFAULT_CAT_NAMES)))
    assert np.array_equal(disk.is_hot, memory.is_hot)
    assert memory.keys == disk.keys == tuple(DEFAULT_CAT_NAMES), "the batches' feature names travel along"
    assert np.array_equal(memory.hot.dense, everything.dense[memory.is_hot]), "each part in the data's order"
    for part in (HOT, COLD):
        for field in ("dense", "ids", "labels", "part_ids"):
            assert np.array_equal(getattr(memory.part(part), field), getattr(disk.part(part), field))
        # the offline remap: each id as its part numbers it, cold ones as ~id
        block = disk.part(part)
        for column, key in enumerate(DEFAULT_CAT_NAMES):
            is_hot, new_ids = hot_set.remap(hot_set.layout.table_of(key), block.ids[:, column])
            assert np.array_equal(block.part_ids[:, column], np.where(is_hot, new_ids, ~new_ids))
    for part in (memory.hot, memory.cold, disk.hot, disk.cold):  # half of int64's bytes on disk
        assert part.ids.dtype == part.part_ids.dtype == np.int32
    batch = memory.hot.as_part_ids().to_batch(DEFAULT_CAT_NAMES)
    assert batch.sparse_features.values().dtype == torch.int64, "batches in TorchRec's index type"
    np.testing.assert_array_equal(batch.sparse_features.values().numpy(), memory.hot.part_ids.T.reshape(-1))
    assert hot_set.is_hot_input(disk.hot.feature_ids(DEFAULT_CAT_NAMES)).all()
    assert not hot_set.is_hot_input(disk.cold.feature_ids(DEFAULT_CAT_NAMES)).any()
    with pytest.raises(FileNotFoundError, match=r"partition\.json: missing"):
        HotColdPartition.open(tmp_path)
    del disk  # its is_hot is memory-mapped from the file rewritten below
    np.save(tmp_path / "part" / "is_hot.npy", np.roll(memory.is_hot, 1))  # as many hot, other inputs
    HotColdPartition.open(tmp_path / "part")
    np.save(tmp_path / "part" / "is_hot.npy", memory.is_hot[1:])
    with pytest.raises(ValueError, match=r"part: damaged partition: is_hot marks \d+ of 5999 inputs hot"):
        HotColdPartition.open(tmp_path / "part")
    (tmp_path / "part" / "is_hot.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"is_hot\.npy: missing; .* write it again"):
        HotColdPartition.open(tmp_path / "part")
    with pytest.raises(ValueError, match="no inputs to partition"):
        HotColdPartition.write(iter([]), hot_set, DEFAULT_CAT_NAMES, tmp_path / "empty")
    (tmp_path / "part" / "partition.json").write_text('{"ids_per_feature": [1]}')
    with pytest.raises(ValueError, match=r"partition\.json: no feature names; .* write it again"):
        HotColdPartition.open(tmp_path / "part")


@pytest.mark.parametrize("positives", [300, 40])
@pytest.mark.parametrize("balance", [0.0, 0.5, 1.0])
def test_balance_takes_out_a_share_of_the_hot_inputs_of_the_label_they_over_represent(positives, balance):
    # 1,000 inputs, half positive; 400 hot, of which ``positives`` positive (75% or 10%)
    labels = np.zeros(1000, dtype=np.int32)
    labels[:positives] = labels[400 : 900 - positives] = 1
    hot = np.arange(1000) < 400
    kept = balanced(hot, labels, balance, np.random.default_rng(0))
    assert not (kept & ~hot).any(), "only hot inputs go"
    gone = hot & ~kept
    majority = 1 if positives > 200 else 0
    assert (labels[gone] == majority).all()
    excess = abs(positives - (400 - positives))  # at a rate of one half, the rest must be as many
    assert gone.sum() == round(balance * excess)
    assert labels[kept].mean() == pytest.approx((positives - majority * gone.sum()) / (400 - gone.sum()))
    if balance == 1.0:
        assert labels[kept].mean() == 0.5, "the hot part clicks at the data's rate"
    assert np.array_equal(kept, balanced(hot, labels, balance, np.random.default_rng(0))), "seeded"
    assert np.array_equal(balanced(hot, np.ones(1000), 1.0, np.random.default_rng(0)), hot), "no negatives"


def test_balanced_partition_keeps_every_input_and_trains_the_others_cold(data, tmp_path):
    synthetic, hot_set = data
    plain = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    full = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES, balance=1.0, seed=2)
    disk = HotColdPartition.write(
        synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES, tmp_path / "part", balance=1.0, seed=2
    )
    assert np.array_equal(disk.is_hot, full.is_hot) and np.array_equal(disk.cold.labels, full.cold.labels)
    assert len(full.hot) + len(full.cold) == len(plain.is_hot)
    assert not (full.is_hot & ~plain.is_hot).any() and len(full.hot) < len(plain.hot)
    labels = SampleBlock.concat(list(synthetic.blocks())).labels
    assert abs(full.hot.labels.mean() - labels.mean()) < abs(plain.hot.labels.mean() - labels.mean())
    assert abs(full.hot.labels.mean() - labels.mean()) < 0.01
    moved = hot_set.is_hot_input(full.cold.feature_ids(DEFAULT_CAT_NAMES))
    assert moved.sum() == len(plain.hot) - len(full.hot), "the cold part holds the hot inputs taken out"
    other = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES, balance=1.0, seed=3)
    assert not np.array_equal(other.is_hot, full.is_hot), "the seed draws them"
    with pytest.raises(ValueError, match=r"label balance must be a share in \[0, 1\], got 2"):
        HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES, balance=2)


def test_router_serves_each_rank_its_inputs(data):
    synthetic, hot_set = data
    partition = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    routers = [BatchRouter(partition, 64, world_size=2, rank=r, seed=5) for r in range(2)]
    served = [list(router.epoch(0)) for router in routers]
    assert len(served[0]) == len(served[1]) == len(routers[0].schedule(0))
    dense = []
    for first, second in zip(*served, strict=True):
        assert first.hot == second.hot and first.step == second.step
        if first.hot:
            assert hot_set.is_hot_input(first.batch).all() and hot_set.is_hot_input(second.batch).all()
        dense += [first.batch.dense_features.numpy(), second.batch.dense_features.numpy()]
    everything = np.concatenate([partition.hot.dense, partition.cold.dense])
    seen = np.concatenate(dense)
    assert len(seen) == len(everything)
    assert np.array_equal(np.unique(seen, axis=0), np.unique(everything, axis=0))
    resumed = list(routers[0].epoch(0, start_step=3))
    assert [r.step for r in resumed] == [r.step for r in served[0][3:]]
    with pytest.raises(ValueError, match="rank 2 out of range"):
        BatchRouter(partition, 64, world_size=2, rank=2)
    assert BatchRouter(partition, 64, keys=DEFAULT_CAT_NAMES).partition is partition
    with pytest.raises(ValueError, match=r"keys \['cat_1', 'cat_0'.* are not the partition's feature names"):
        BatchRouter(partition, 64, keys=["cat_1", "cat_0", *DEFAULT_CAT_NAMES[2:]])


class _Unread(np.ndarray):
    """An array that no numpy function may read (concatenate, copy, ...); views of it are fine."""

    def __array_function__(self, func, types, args, kwargs):
        raise AssertionError(f"np.{func.__name__} read the original ids")


def test_a_split_router_reads_the_part_ids_only(data):
    """FAE's batches come from the part ids: the original ids of a partition are not read (a memory-
    mapped partition would page them in), even for batches made of several spans."""
    synthetic, hot_set = data
    partition = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    unread = replace(
        partition,
        hot=replace(partition.hot, ids=partition.hot.ids.view(_Unread)),
        cold=replace(partition.cold, ids=partition.cold.ids.view(_Unread)),
    )
    split = FAEEmbeddingBagCollection(synthetic.table_configs(), hot_set, device=torch.device("meta")).split
    served = list(BatchRouter(unread, 64, split=split).epoch(0))
    expected = list(BatchRouter(partition, 64).epoch(0))
    assert any(len(step.spans[0]) > 1 for step in make_schedule(partition.is_hot, 64, 1, "stream", 0, 0))
    for routed, plain in zip(served, expected, strict=True):
        features = routed.batch.sparse_features
        assert features.is_hot == routed.hot == plain.hot
        original = split(plain.batch.sparse_features, plain.hot)
        for part in ("hot", "cold"):
            ours, theirs = getattr(features, part), getattr(original, part)
            assert torch.equal(ours.values(), theirs.values())
            assert torch.equal(ours.lengths(), theirs.lengths())
    with pytest.raises(AssertionError, match="read the original ids"):
        list(BatchRouter(unread, 64).epoch(0))


def _drive(router, feedback_at, start=0, stop=None):
    """Kinds and dense inputs the router serves; at step ``feedback_at`` it hears a worse loss."""
    served = []
    for routed in router.epoch(0, start_step=start):
        served.append((routed.step, routed.hot, routed.batch.dense_features.numpy().copy()))
        if routed.step == 0:
            router.report_validation_loss(0.5)
        if routed.step == feedback_at:
            router.report_validation_loss(0.9)
        if stop is not None and routed.step + 1 == stop:
            break
    return served


def test_adaptive_order_breaks_hot_runs_when_the_loss_worsens(data):
    synthetic, hot_set = data
    partition = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    ranks = [BatchRouter(partition, 16, world_size=2, rank=r, order="adaptive", seed=3) for r in range(2)]
    served = [_drive(router, feedback_at=40) for router in ranks]
    assert [(s, h) for s, h, _ in served[0]] == [(s, h) for s, h, _ in served[1]], "ranks agree"
    assert ranks[0].state_dict()["run"] < max(1, -(-sum(h for _, h, _ in served[0]) // 8)), "runs shortened"
    seen = np.concatenate([d for rank in served for _, _, d in rank])
    everything = np.concatenate([partition.hot.dense, partition.cold.dense])
    assert len(seen) == len(everything)
    assert np.array_equal(np.unique(seen, axis=0), np.unique(everything, axis=0))

    def longest_hot_run(kinds):
        best = current = 0
        for hot in kinds:
            current = current + 1 if hot else 0
            best = max(best, current)
        return best

    kinds = [h for _, h, _ in served[0]]
    assert longest_hot_run(kinds[60:]) < longest_hot_run(kinds[:40])


def test_adaptive_order_resumes_from_the_router_state(data):
    synthetic, hot_set = data
    partition = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    straight = _drive(BatchRouter(partition, 16, order="adaptive", seed=3), feedback_at=40)
    first = BatchRouter(partition, 16, order="adaptive", seed=3)
    head = _drive(first, feedback_at=40, stop=55)
    resumed = BatchRouter(partition, 16, order="adaptive", seed=3)
    with pytest.raises(ValueError, match="load the router state of epoch 0, step 55"):
        next(resumed.epoch(0, start_step=55))
    resumed.load_state_dict(first.state_dict())
    tail = _drive(resumed, feedback_at=-1, start=55)
    assert [(s, h) for s, h, _ in head + tail] == [(s, h) for s, h, _ in straight]
    for (_, _, a), (_, _, b) in zip(head + tail, straight, strict=True):
        assert np.array_equal(a, b)


def test_adaptive_state_saved_right_after_a_worse_loss_resumes_exactly(data):
    synthetic, hot_set = data
    partition = HotColdPartition.of(synthetic.blocks(), hot_set, DEFAULT_CAT_NAMES)
    straight = _drive(BatchRouter(partition, 16, order="adaptive", seed=3), feedback_at=40)
    first = BatchRouter(partition, 16, order="adaptive", seed=3)
    head = _drive(first, feedback_at=40, stop=41)  # the state is taken right after the report at 40
    resumed = BatchRouter(partition, 16, order="adaptive", seed=3)
    resumed.load_state_dict(first.state_dict())
    tail = _drive(resumed, feedback_at=-1, start=41)
    assert [(s, h) for s, h, _ in head + tail] == [(s, h) for s, h, _ in straight]
