"""The knob prices a hot step and a cold step as TorchRec would price the chosen plan on real hot and
real cold batches: each part at the pooling of the batches the router makes, measured here on inputs
disjoint from the profile, and priced by TorchRec's own enumerator and perf model."""

import numpy as np
import pytest
import torch
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection, HotSet
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.stats import COLD, HOT
from planner import FAEShardingPlanner
from planner.report import UVM_KERNELS

SEED = 3
PROFILED_CHUNKS = 4  # chunks of 65,536 inputs; the measured batches come from the chunks after them


@pytest.fixture(scope="module")
def planned():
    data = SyntheticCriteo(PROFILED_CHUNKS << 16, batch_size=1 << 16, scale=0.05, seed=SEED)
    stats = AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=30_000).profile(data)
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=24 << 20)
    # caches without the prefetch pipeline, priced by their load factor (with it, a cold lookup is
    # priced at HBM speed plus a prefetch, and the comparison below of cold lookups does not apply)
    planner = FAEShardingPlanner(
        topology,
        stats,
        batch_size=2048,
        hot_budget_bytes=2 << 20,
        cache_params=CacheParams(prefetch_pipeline=False),
    )
    hot_set = planner.choose_hot_set()
    module = FAEEmbeddingBagCollection(stats.tables, hot_set, device=torch.device("meta"))
    plan = planner.plan(module, get_default_sharders())
    return planner, hot_set, module, plan


def _routed_pooling(hot_set: HotSet) -> dict[str, dict[str, np.ndarray]]:
    """Per kind of step and part, ids per input of each table, counted on the batches FAE would
    make of 400k inputs the profile never saw."""
    later = SyntheticCriteo((PROFILED_CHUNKS + 6) << 16, batch_size=1 << 16, scale=0.05, seed=SEED)
    blocks = [later.chunk(i) for i in range(PROFILED_CHUNKS, PROFILED_CHUNKS + 6)]
    ids = np.concatenate([b.ids for b in blocks])
    row_hot = np.stack([hot_set.hot_mask(t)[ids[:, t]] for t in range(ids.shape[1])], axis=1)
    hot_input = row_hot.all(axis=1)
    cold_rows = row_hot[~hot_input]
    return {
        "hot": {HOT: np.ones(ids.shape[1])},  # single-hot: a hot input looks up one hot row per table
        "cold": {HOT: cold_rows.mean(axis=0), COLD: (~cold_rows).mean(axis=0)},
    }


def _torchrec_step(planner, module, plan, pooling: dict[str, np.ndarray], in_hbm: bool = False) -> float:
    """TorchRec's predicted step of ``plan`` with each part pinned to its planned sharding type,
    kernel, cache and ranks, looking up ``pooling[part]`` ids per input; other parts do not run. With
    ``in_hbm`` the UVM parts are pinned to ``fused`` instead, without a cache."""
    constraints = {}
    for part, tables in plan.plan.items():
        if part not in pooling:
            continue
        for name, sharding in tables.items():
            table = DEFAULT_CAT_NAMES.index(name.removeprefix("t_").removesuffix(f"_{part}"))
            moved = in_hbm and sharding.compute_kernel in UVM_KERNELS
            constraints[name] = ParameterConstraints(
                sharding_types=[sharding.sharding_type],
                compute_kernels=["fused" if moved else sharding.compute_kernel],
                pooling_factors=[float(pooling[part][table])],
                cache_params=None if moved else sharding.cache_params,
            )
    enumerator = EmbeddingEnumerator(planner.topology, planner.batch_size, constraints)
    options = [o for o in enumerator.enumerate(module, get_default_sharders()) if o.name in constraints]
    assert len(options) == len(constraints)
    per_rank = np.zeros(planner.topology.world_size)
    for option in options:
        ranks = plan.plan[option.path][option.name].ranks
        for shard, rank in zip(option.shards, ranks, strict=True):
            per_rank[rank] += shard.perf.total
    return float(per_rank.max())


def test_cold_and_hot_steps_are_priced_at_their_own_batches(planned):
    planner, hot_set, module, plan = planned
    report = planner.report
    pooling = _routed_pooling(hot_set)
    assert 0.1 < report.hot_input_share < 0.9, "the test needs both kinds of step"
    cold_step = _torchrec_step(planner, module, plan, pooling["cold"])
    hot_step = _torchrec_step(planner, module, plan, pooling["hot"])
    assert report.cold_step == pytest.approx(cold_step, rel=0.02)
    assert report.hot_step == pytest.approx(hot_step, rel=0.02)
    # the same cold step with the cold parts' rows in HBM: the layout's step without transfers
    assert report.cold_step_in_hbm == pytest.approx(
        _torchrec_step(planner, module, plan, pooling["cold"], in_hbm=True), rel=0.02
    )
    assert report.cold_step_in_hbm < report.cold_step
    share = report.hot_input_share
    averaged = {
        HOT: share * pooling["hot"][HOT] + (1 - share) * pooling["cold"][HOT],
        COLD: (1 - share) * pooling["cold"][COLD],
    }
    assert report.cold_step > _torchrec_step(planner, module, plan, averaged), (
        "a cold batch looks up more cold rows than the average input: pricing a cold step at the "
        "pooling averaged over all inputs undercounts it"
    )


def test_the_report_says_what_each_step_looks_up(planned):
    planner, hot_set, *_ = planned
    text = str(planner.report)
    assert "hot step" in text and "cold step" in text and "own batches' pooling" in text
    hot_ids, cold_hot_ids, cold_cold_ids = planner.report.step_ids
    assert hot_ids == pytest.approx(26.0)  # single-hot: every table once
    assert cold_hot_ids + cold_cold_ids == pytest.approx(26.0)
    assert cold_cold_ids == pytest.approx(_routed_pooling(hot_set)["cold"][COLD].sum(), rel=0.03)
