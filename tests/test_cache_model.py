"""The cache models of benchmarks/bench_traffic.py against plain reference implementations."""

import numpy as np
import pytest
import torch
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from benchmarks.common.cache_model import (
    WAYS,
    SetAssociativeLRU,
    belady_traffic,
    cache_sets,
    murmur_finalizer,
    sampled_rows,
)
from benchmarks.common.plan_traffic import cache_groups, replay
from planner.baseline import default_planner, dry_run


def _reference_lru(batches, num_sets):
    """FBGEMM's LRU insert, one row at a time: (rows in, rows out) per group."""
    keys = {g: [[None] * WAYS for _ in range(n)] for g, n in enumerate(num_sets)}
    stamps = {g: [[0] * WAYS for _ in range(n)] for g, n in enumerate(num_sets)}
    moved_in, moved_out = np.zeros(len(num_sets)), np.zeros(len(num_sets))
    for time, (groups, linear) in enumerate(batches, start=1):
        misses = {}
        for g, x in zip(groups.tolist(), linear.tolist(), strict=True):
            if num_sets[g] == 0:
                moved_in[g] += 1
                moved_out[g] += 1
                continue
            s = int(murmur_finalizer(np.array([x]))[0] % np.uint64(num_sets[g]))
            if x in keys[g][s]:
                stamps[g][s][keys[g][s].index(x)] = time
            else:
                misses.setdefault((g, s), []).append(x)
        for (g, s), rows in sorted(misses.items()):
            ways = sorted(range(WAYS), key=lambda w, g=g, s=s: stamps[g][s][w])
            free = [w for w in ways if stamps[g][s][w] < time]
            for i, x in enumerate(sorted(rows)):
                moved_in[g] += 1
                if i < len(free):
                    moved_out[g] += keys[g][s][free[i]] is not None
                    keys[g][s][free[i]], stamps[g][s][free[i]] = x, time
                else:
                    moved_out[g] += 1  # a conflict miss goes to host memory and back
    return moved_in, moved_out


def _skewed_batches(rng, num_batches, batch, rows, groups):
    out = []
    for _ in range(num_batches):
        linear = np.minimum(rng.zipf(1.3, batch) - 1, rows - 1)
        group = rng.integers(0, groups, batch)
        pairs = np.unique(np.stack([group, linear], axis=1), axis=0)
        out.append((pairs[:, 0], pairs[:, 1]))
    return out


@pytest.mark.parametrize("num_sets", [[1, 3], [2, 0], [5, 1]])
def test_set_associative_lru_matches_a_row_by_row_reference(num_sets):
    batches = _skewed_batches(np.random.default_rng(sum(num_sets)), 30, 120, 400, len(num_sets))
    cache = SetAssociativeLRU(num_sets)
    for groups, linear in batches:
        cache.access(groups, linear)
    moved_in, moved_out = _reference_lru(batches, num_sets)
    np.testing.assert_array_equal(cache.moves.rows_in, moved_in)
    np.testing.assert_array_equal(cache.moves.rows_out, moved_out)


def test_more_distinct_rows_than_ways_in_one_set_are_conflict_misses():
    cache = SetAssociativeLRU([1])
    cache.access(np.zeros(40, dtype=np.int64), np.arange(40))
    assert cache.moves.rows_in[0] == 40 and cache.moves.rows_out[0] == 8  # 32 cached, 8 both ways
    cache.access(np.zeros(32, dtype=np.int64), np.arange(32))
    assert cache.moves.rows_in[0] == 40, "all 32 cached rows hit"


def _reference_belady(batches, capacity):
    cache, moved_in, moved_out = set(), 0, 0
    for b, rows in enumerate(batches):
        for r in rows.tolist():
            if r not in cache:
                cache.add(r)
                moved_in += 1
        while len(cache) > capacity:
            later = {
                r: next((c for c in range(b + 1, len(batches)) if r in batches[c]), 10**9) for r in cache
            }
            cache.remove(max(sorted(cache), key=lambda r, later=later: later[r]))
            moved_out += 1
    return moved_in, moved_out


def test_belady_matches_a_reference_and_never_moves_more_than_lru():
    rng = np.random.default_rng(3)
    batches = [np.unique(np.minimum(rng.zipf(1.2, 15) - 1, 60)) for _ in range(25)]
    assert belady_traffic(batches, 12) == _reference_belady(batches, 12)
    lru = SetAssociativeLRU([1])  # 32 rows, fully associative
    for rows in batches:
        lru.access(np.zeros(len(rows), dtype=np.int64), rows)
    assert sum(belady_traffic(batches, WAYS)) <= lru.moves.total()
    assert belady_traffic(batches, 10**6) == (len(np.unique(np.concatenate(batches))), 0)
    with pytest.raises(ValueError, match="capacity must be non-negative"):
        belady_traffic(batches, -1)


def test_row_sampled_replay_estimates_the_full_replay():
    """SHARDS: replaying 1/8 of the rows through 1/8 of the sets gives the full replay's traffic."""
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.15, (200, 4000)) - 1, 200_000)
    tables = np.zeros(ids.size, dtype=np.int64)
    batches = np.repeat(np.arange(200), 4000)
    config = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=200_001, feature_names=["f"])
    cached = ParameterConstraints(
        compute_kernels=["fused_uvm_caching"], cache_params=CacheParams(load_factor=0.05)
    )
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=64 << 20)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints={"t": cached}, stats=[])
    groups = cache_groups(dry_run(planner, [config]).plan)
    assert groups.cached.all() and groups.cache_slots == pytest.approx(0.05 * 200_001)
    full = replay(groups, batches, tables, ids.ravel(), {"t": 0}, 1, 50, 64)
    kept = sampled_rows(ids.ravel(), 8)
    sampled = replay(groups, batches[kept], tables[kept], ids.ravel()[kept], {"t": 0}, 8, 50, 64)
    assert full.bytes > 0
    assert sampled.bytes == pytest.approx(full.bytes, rel=0.1)
    assert cache_sets(0.05 * 200_001, 8) == round(np.ceil(0.05 * 200_001 / WAYS) / 8)


def test_device_resident_tables_move_nothing():
    config = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=1000, feature_names=["f"])
    plan = dry_run(
        default_planner(Topology(world_size=2, compute_device="cuda", hbm_cap=1 << 30), 512), [config]
    )
    groups = cache_groups(plan.plan)
    assert not groups.shards
    ids = torch.randint(0, 1000, (500,)).numpy()
    traffic = replay(groups, np.arange(500) // 50, np.zeros(500, dtype=np.int64), ids, {"t": 0}, 1, 0, 64)
    assert traffic.bytes == 0
