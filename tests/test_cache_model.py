"""The cache models of benchmarks/bench_traffic.py against plain reference implementations."""

import numpy as np
import pytest
import torch
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheAlgorithm, CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from benchmarks.common.cache_model import (
    WAYS,
    BatchedKeys,
    SetAssociativeLFU,
    SetAssociativeLRU,
    belady_moves,
    cache_sets,
    murmur_finalizer,
    sampled_rows,
)
from benchmarks.common.plan_traffic import CachePolicy, cache_groups, replay
from fae_torchrec import AccessProfiler
from fae_torchrec.data import SyntheticCriteo
from planner import FAEShardingPlanner
from planner.baseline import default_planner, dry_run


def _set(x, n):
    return int(murmur_finalizer(np.array([x]))[0] % np.uint64(n))


def _reference_lru(batches, num_sets, prefetch_pipeline=False):
    """FBGEMM's lru_cache_insert_kernel, one row at a time: (rows in, rows out) per group. With the
    prefetch pipeline, the ways the previous batch used are locked (its lxu_cache_locking_counter)."""
    keys = {g: [[None] * WAYS for _ in range(n)] for g, n in enumerate(num_sets)}
    stamps = {g: [[0] * WAYS for _ in range(n)] for g, n in enumerate(num_sets)}
    moved_in, moved_out = np.zeros(len(num_sets)), np.zeros(len(num_sets))
    locked: set = set()
    for time, (groups, linear, uses) in enumerate(batches, start=1):
        lookups = dict(zip(zip(groups.tolist(), linear.tolist(), strict=True), uses.tolist(), strict=True))
        misses, used = {}, set()
        for g, x in zip(groups.tolist(), linear.tolist(), strict=True):
            s = _set(x, num_sets[g])
            if x in keys[g][s]:
                stamps[g][s][keys[g][s].index(x)] = time
                used.add((g, s, keys[g][s].index(x)))
            else:
                misses.setdefault((g, s), []).append(x)
        for (g, s), rows in sorted(misses.items()):
            rows, inserted = sorted(rows), 0
            ways = sorted(range(WAYS), key=lambda w, g=g, s=s: stamps[g][s][w])
            for w in ways[: min(len(rows), WAYS)]:
                if prefetch_pipeline and (g, s, w) in locked:
                    continue
                if stamps[g][s][w] == time:
                    break
                moved_in[g] += 1
                moved_out[g] += keys[g][s][w] is not None
                keys[g][s][w], stamps[g][s][w] = rows[inserted], time
                used.add((g, s, w))
                inserted += 1
            for x in rows[inserted:]:  # conflict misses: read at each lookup, then read and written back
                moved_in[g] += lookups[g, x] + 1
                moved_out[g] += 1
        locked = used
    return moved_in, moved_out


def _reference_lfu(batches, num_sets):
    """FBGEMM's lfu_cache_populate, one row at a time: (rows in, rows out) per group."""
    keys = {g: [[None] * WAYS for _ in range(n)] for g, n in enumerate(num_sets)}
    counts: dict = {}
    moved_in, moved_out = np.zeros(len(num_sets)), np.zeros(len(num_sets))
    for groups, linear, uses in batches:
        lookups = dict(zip(zip(groups.tolist(), linear.tolist(), strict=True), uses.tolist(), strict=True))
        for (g, x), u in lookups.items():
            counts[g, x] = counts.get((g, x), 0) + u
        misses, hits, evicted = {}, [], set()
        for g, x in zip(groups.tolist(), linear.tolist(), strict=True):
            s = _set(x, num_sets[g])
            if x in keys[g][s]:
                hits.append((g, x))
            else:
                misses.setdefault((g, s), []).append(x)
        for (g, s), rows in sorted(misses.items()):
            rows = sorted(rows, key=lambda x, g=g: (-counts[g, x], x))
            cost = [-1 if k is None else counts[g, k] for k in keys[g][s]]
            ways = sorted(range(WAYS), key=lambda w, cost=cost: (cost[w], w))
            inserted = 0
            for w, x in zip(ways, rows, strict=False):
                if cost[w] > counts[g, x]:
                    break
                moved_in[g] += 1
                if keys[g][s][w] is not None:
                    moved_out[g] += 1
                    evicted.add((g, keys[g][s][w]))
                keys[g][s][w] = x
                inserted += 1
            for x in rows[inserted:]:  # read in host memory at each lookup, then read and written back
                moved_in[g] += lookups[g, x] + 1
                moved_out[g] += 1
        for g, x in hits:
            if (g, x) in evicted:
                moved_in[g] += lookups[g, x] + 1
                moved_out[g] += 1
    return moved_in, moved_out


def _skewed_batches(rng, num_batches, batch, rows, groups):
    """Batches of distinct (group, linear index) rows, with each row's lookups in the batch."""
    out = []
    for _ in range(num_batches):
        linear = np.minimum(rng.zipf(1.3, batch) - 1, rows - 1)
        group = rng.integers(0, groups, batch)
        pairs, uses = np.unique(np.stack([group, linear], axis=1), axis=0, return_counts=True)
        out.append((pairs[:, 0], pairs[:, 1], uses))
    return out


def _run(cache, batches, num_groups):
    for groups, linear, uses in batches:
        cache.access(groups, linear, linear * num_groups + groups, uses=uses)
    return cache.moves


@pytest.mark.parametrize("prefetch_pipeline", [False, True])
@pytest.mark.parametrize("num_sets", [[1, 3], [2, 1], [5, 1]])
def test_set_associative_lru_matches_a_row_by_row_reference(num_sets, prefetch_pipeline):
    batches = _skewed_batches(np.random.default_rng(sum(num_sets)), 30, 120, 400, len(num_sets))
    moves = _run(SetAssociativeLRU(num_sets, prefetch_pipeline), batches, len(num_sets))
    moved_in, moved_out = _reference_lru(batches, num_sets, prefetch_pipeline)
    np.testing.assert_array_equal(moves.rows_in, moved_in)
    np.testing.assert_array_equal(moves.rows_out, moved_out)


@pytest.mark.parametrize("num_sets", [[1, 3], [2, 1], [5, 1]])
def test_set_associative_lfu_matches_a_row_by_row_reference(num_sets):
    batches = _skewed_batches(np.random.default_rng(sum(num_sets) + 7), 30, 120, 400, len(num_sets))
    moves = _run(SetAssociativeLFU(num_sets, 400 * len(num_sets)), batches, len(num_sets))
    moved_in, moved_out = _reference_lfu(batches, num_sets)
    assert moved_in.sum() > 0
    np.testing.assert_array_equal(moves.rows_in, moved_in)
    np.testing.assert_array_equal(moves.rows_out, moved_out)


def test_an_lfu_hit_loses_its_way_to_a_more_counted_miss():
    """No way is kept for the batch's hits: row 0 is hit, but 32 rows counted more take every way."""
    zeros = np.zeros(33, dtype=np.int64)
    batches = [(zeros[:32], np.arange(32), np.ones(32, dtype=np.int64))]
    batches.append((zeros, np.r_[0, 100:132], np.r_[1, np.full(32, 5)]))
    moves = _run(SetAssociativeLFU([1], 200), batches, 1)
    assert moves.rows_in[0] == 32 + 32 + 2 and moves.rows_out[0] == 32 + 1, "row 0 read twice, written once"
    np.testing.assert_array_equal((moves.rows_in, moves.rows_out), _reference_lfu(batches, [1]))


def test_more_distinct_rows_than_ways_in_one_set_are_conflict_misses():
    cache = SetAssociativeLRU([1])
    uses = np.r_[np.ones(32, dtype=np.int64), np.full(8, 3)]
    cache.access(np.zeros(40, dtype=np.int64), np.arange(40), np.arange(40), uses=uses)
    # 32 cached; 8 read in host memory at each of their 3 lookups and once more, and written back once
    assert cache.moves.rows_in[0] == 32 + 8 * (3 + 1) and cache.moves.rows_out[0] == 8
    cache.access(np.zeros(32, dtype=np.int64), np.arange(32), np.arange(32))
    assert cache.moves.rows_in[0] == 64, "all 32 cached rows hit"


def test_the_prefetch_pipeline_keeps_the_previous_batch_cached():
    cache = SetAssociativeLRU([1], prefetch_pipeline=True)
    for rows in (np.arange(20), np.arange(20, 40)):  # 32 ways: the second batch gets 12 of them
        cache.access(np.zeros(20, dtype=np.int64), rows, rows)
    # 8 rows of the second batch find no way: read in host memory, then read and written back
    assert cache.moves.rows_in[0] == 20 + 12 + 8 * 2 and cache.moves.rows_out[0] == 8


def _reference_belady(batches, capacity):
    """Belady's MIN one row at a time, preloaded (clean) with the rows used soonest."""

    def next_use(row, after):
        return next((c for c in range(after, len(batches)) if row in batches[c]), 10**9)

    rows = sorted(set(np.concatenate(batches).tolist()), key=lambda r: next_use(r, 0))
    dirty = dict.fromkeys(rows[:capacity], False)
    moved_in, moved_out = 0, 0
    for b, batch in enumerate(batches):
        for r in batch.tolist():
            moved_in += r not in dirty
            dirty[r] = True
        while len(dirty) > capacity:
            victim = max(dirty, key=lambda r, b=b: (next_use(r, b + 1), not dirty[r]))
            moved_out += dirty.pop(victim)
    return moved_in, moved_out


def _batched(batches):
    return BatchedKeys.of(
        np.repeat(np.arange(len(batches)), [len(b) for b in batches]), np.concatenate(batches)
    )


@pytest.mark.parametrize("capacity", [0, 5, 12, 40])
def test_belady_matches_a_reference(capacity):
    rng = np.random.default_rng(3)
    batches = [np.unique(np.minimum(rng.zipf(1.2, 15) - 1, 60)) for _ in range(25)]
    moved_in, moved_out = belady_moves(_batched(batches), capacity)
    assert len(moved_in) == len(moved_out) == len(batches)
    assert (int(moved_in.sum()), int(moved_out.sum())) == _reference_belady(batches, capacity)
    assert not any(belady_moves(_batched(batches), 10**6)[0]), "everything preloaded"
    with pytest.raises(ValueError, match="capacity must be non-negative"):
        belady_moves(_batched(batches), -1)


def test_belady_moves_less_than_lru_and_lfu_caches_of_its_capacity():
    """On equal terms: every cache warms up on the first batches (Belady preloaded before them), and
    traffic is counted after them."""
    rng = np.random.default_rng(5)
    stream = [np.unique(np.minimum(rng.zipf(1.2, 60) - 1, 500), return_counts=True) for _ in range(80)]
    lru, lfu = SetAssociativeLRU([1]), SetAssociativeLFU([1], 501)  # 32 rows, fully associative
    for b, (rows, uses) in enumerate(stream):
        for cache in (lru, lfu):
            if b == 20:
                cache.reset_moves()
            cache.access(np.zeros(len(rows), dtype=np.int64), rows, rows, uses=uses)
    belady = sum(m[20:].sum() for m in belady_moves(_batched([rows for rows, _ in stream]), WAYS))
    assert 0 < belady <= min(lru.moves.total(), lfu.moves.total())


@pytest.mark.parametrize("algorithm", [CacheAlgorithm.LRU, CacheAlgorithm.LFU])
def test_row_sampled_replay_estimates_the_full_replay(algorithm):
    """SHARDS: replaying 1/8 of the rows through 1/8 of the sets gives the full replay's traffic."""
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.15, (200, 4000)) - 1, 200_000)
    tables = np.zeros(ids.size, dtype=np.int64)
    batches = np.repeat(np.arange(200), 4000)
    config = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=200_001, feature_names=["f"])
    cached = ParameterConstraints(
        compute_kernels=["fused_uvm_caching"], cache_params=CacheParams(algorithm=algorithm, load_factor=0.05)
    )
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=64 << 20)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints={"t": cached}, stats=[])
    groups = cache_groups(dry_run(planner, [config]).plan)
    assert groups.cached.all() and groups.cache_slots == pytest.approx(0.05 * 200_001)
    assert groups.policies == [CachePolicy(algorithm)] and groups.ranks.tolist() == [0]
    assert groups.busiest_rank_caches == 1
    full = replay(groups, batches, tables, ids.ravel(), {"t": 0}, 1, 50, [200])[0]
    kept = sampled_rows(ids.ravel(), 8)
    sampled = replay(groups, batches[kept], tables[kept], ids.ravel()[kept], {"t": 0}, 8, 50, [200])[0]
    assert full.bytes > 0 and full.busiest_link() == max(full.bytes_in.sum(), full.bytes_out.sum())
    assert sampled.bytes == pytest.approx(full.bytes, rel=0.1)
    early, whole = replay(groups, batches, tables, ids.ravel(), {"t": 0}, 1, 50, [120, 200])
    cut = batches < 120
    alone = replay(groups, batches[cut], tables[cut], ids.ravel()[cut], {"t": 0}, 1, 50, [120])[0]
    assert 0 < early.bytes == alone.bytes < whole.bytes == full.bytes, "one replay, windows from batch 50"
    assert cache_sets(0.05 * 200_001, 8) == round(np.ceil(0.05 * 200_001 / WAYS) / 8)


def test_device_resident_tables_move_nothing():
    config = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=1000, feature_names=["f"])
    plan = dry_run(
        default_planner(Topology(world_size=2, compute_device="cuda", hbm_cap=1 << 30), 512, tables=[config]),
        [config],
    )
    groups = cache_groups(plan.plan)
    assert not groups.shards and groups.busiest_rank_caches == 0
    ids = torch.randint(0, 1000, (500,)).numpy()
    (traffic,) = replay(
        groups, np.arange(500) // 50, np.zeros(500, dtype=np.int64), ids, {"t": 0}, 1, 0, [10]
    )
    assert traffic.bytes == 0 and traffic.busiest_link() == 0


def test_uvm_rows_move_as_fbgemm_reads_and_writes_them():
    """A ``fused_uvm`` table without a cache: in each batch a row is read from host memory at each of
    its lookups and once more by the backward, which writes it back once."""
    config = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=1000, feature_names=["f"])
    uvm = ParameterConstraints(compute_kernels=["fused_uvm"])
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=64 << 20)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints={"t": uvm}, stats=[])
    groups = cache_groups(dry_run(planner, [config]).plan)
    assert groups.policies == [None], "no cache"
    ids, batches = np.array([1, 1, 1, 2, 5, 5]), np.array([0, 0, 0, 0, 1, 1])
    (traffic,) = replay(groups, batches, np.zeros(6, dtype=np.int64), ids, {"t": 0}, 1, 0, [2])
    row = 16 * 4  # fp32 bytes
    assert traffic.bytes_in.sum() == row * ((3 + 1) + (1 + 1) + (2 + 1))
    assert traffic.bytes_out.sum() == row * 3


def test_fae_cold_caches_planned_for_the_prefetch_pipeline_replay_with_its_locking():
    """FAE's planner plans its cold caches for the prefetch pipeline by default; replayed through
    ``replay`` they lock the previous batch's ways, as the row-by-row reference of FBGEMM's LRU insert
    with the pipeline does, and move more than without the locking."""
    data = SyntheticCriteo(60_000, batch_size=1 << 14, scale=0.002, seed=2)
    stats = AccessProfiler(data.table_configs(8), 0.1, seed=0, holdout_size=4000).profile(data)
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=2 << 20)
    planner = FAEShardingPlanner(topology, stats, batch_size=64, hot_budget_bytes=8 << 10)
    plan = planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
    groups = cache_groups(plan, lambda name: name.removesuffix("_cold") if name.endswith("_cold") else None)
    assert groups.policies and all(p == CachePolicy(CacheAlgorithm.LRU, True) for p in groups.policies)
    rng = np.random.default_rng(4)
    cached = sorted({shard.table for shard in groups.shards})
    sizes = {name: max(s.row_end for s in groups.shards if s.table == name) for name in cached}  # cold rows
    table_index = {name: t for t, name in enumerate(cached)}
    # batches of nearly distinct rows, two of them more than the caches hold: the locked ways count
    num_batches, lookups = 12, 6000
    tables = rng.integers(0, len(cached), num_batches * lookups)
    ids = rng.integers(0, np.array([sizes[n] for n in cached])[tables])
    batches = np.repeat(np.arange(num_batches), lookups)
    (traffic,) = replay(groups, batches, tables, ids, table_index, 1, 0, [num_batches])
    # the same lookups, routed to their shard's group and linear index by hand, for the reference
    group, linear = np.full(len(ids), -1), np.full(len(ids), -1)
    for s in groups.shards:
        mine = (tables == table_index[s.table]) & (ids >= s.row_start) & (ids < s.row_end)
        group[mine], linear[mine] = s.group, ids[mine] - s.row_start + s.base
    assert group.min() >= 0, "every lookup has its shard"
    reference_batches = []
    for b in range(num_batches):
        mine = batches == b
        pairs, uses = np.unique(np.stack([group[mine], linear[mine]], axis=1), axis=0, return_counts=True)
        reference_batches.append((pairs[:, 0], pairs[:, 1], uses))
    num_sets = [cache_sets(slots) for slots in groups.slots]
    row = 8 * 4  # dim 8, fp32
    locked = _reference_lru(reference_batches, num_sets, prefetch_pipeline=True)
    np.testing.assert_array_equal(traffic.bytes_in, locked[0] * row)
    np.testing.assert_array_equal(traffic.bytes_out, locked[1] * row)
    assert sum(map(np.sum, locked)) > sum(map(np.sum, _reference_lru(reference_batches, num_sets)))
