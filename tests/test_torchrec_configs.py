"""TorchRec's configurations a user sets (``planner.torchrec_configs``): the grid, the sharding limits, and
real dry runs of TorchRec's planners with them, by the baselines and by FAE's knob."""

import pytest
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheAlgorithm, ShardingType

from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.stats import AccessProfiler
from planner import FAEShardingPlanner
from planner.baseline import plan_configs
from planner.torchrec_configs import (
    NOT_ROW_WISE,
    TorchRecConfig,
    not_row_wise,
    offloaded_tables,
    torchrec_configs,
    uvm_constrained,
)


def test_the_grid_is_every_configuration_a_user_sets():
    """2 planners x prefetch pipeline or not x 3 sharding choices x LRU or LFU, without LFU under the
    prefetch pipeline (FBGEMM pipelines LRU caches only): 18, each named once."""
    grid = torchrec_configs()
    assert len(grid) == 18 and len({c.name for c in grid}) == 18
    assert not [c for c in grid if c.prefetch_pipeline and c.algorithm == CacheAlgorithm.LFU]
    assert grid[0] == TorchRecConfig() and grid[0].name == "default"
    assert TorchRecConfig("scale-up", True, "offloaded").name == "scale-up pp tw-uvm"
    assert len(torchrec_configs(prefetch_pipeline=True)) == 6
    assert {c.algorithm for c in torchrec_configs(False, CacheAlgorithm.LRU)} == {CacheAlgorithm.LRU}
    with pytest.raises(ValueError, match="LRU caches only"):
        TorchRecConfig(prefetch_pipeline=True, algorithm=CacheAlgorithm.LFU)
    with pytest.raises(ValueError, match="sharding 'rows'"):
        TorchRecConfig(sharding="rows")


def test_not_row_wise_limits_the_named_tables_within_what_they_allow():
    """Limited within what each table's constraint allows; a user's own row-wise-only choice is kept."""
    given = {
        "a": ParameterConstraints(
            sharding_types=[ShardingType.ROW_WISE.value, ShardingType.TABLE_WISE.value]
        ),
        "b": ParameterConstraints(pooling_factors=[2.0]),
    }
    limited = not_row_wise(given, ["a", "c"])
    assert limited["a"].sharding_types == [ShardingType.TABLE_WISE.value]
    assert limited["c"].sharding_types == NOT_ROW_WISE and limited["b"] is given["b"]
    pinned = {"d": ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])}
    assert not_row_wise(pinned, ["d"]) == pinned, "a user's own row-wise choice wins"
    caching, fused = EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.FUSED.value
    kernels = {"a": [caching], "b": [fused, caching], "c": None}
    assert uvm_constrained({n: ParameterConstraints(compute_kernels=k) for n, k in kernels.items()}) == {"a"}


@pytest.fixture(scope="module")
def small_stats():
    """Statistics of synthetic Criteo-like data at 1% of Kaggle's table sizes (26 tables)."""
    data = SyntheticCriteo(50_000, batch_size=1 << 16, scale=0.01, seed=0)
    return AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=2000).profile(data)


def test_each_configuration_plans_what_it_names(small_stats):
    """Real dry runs on 8 GPUs of 16 MiB, where TorchRec's default plan offloads tables: the configurations
    that limit sharding types do so on the tables they name and no others, and keep their
    ``CacheParams``; the scale-up planner's smallest caches do not fit here, so it places none."""
    topology = Topology(world_size=8, compute_device="cuda", hbm_cap=16 << 20)
    configs = [
        TorchRecConfig(),
        TorchRecConfig(sharding="offloaded"),
        TorchRecConfig(sharding="all"),
        TorchRecConfig(prefetch_pipeline=True, sharding="all"),
        TorchRecConfig("scale-up", True),
        TorchRecConfig("scale-up", True, "offloaded"),
    ]
    made = plan_configs(configs, topology, small_stats, 2048)
    assert list(made) == configs
    default, offloaded, every, pipelined, scaleup, scaleup_offloaded = made.values()
    assert isinstance(scaleup, PlannerError)
    if not isinstance(scaleup_offloaded, PlannerError):  # its cached tables are its constraints' own
        cached = [s for s in scaleup_offloaded.plan.plan[""].values() if s.cache_params is not None]
        assert all(s.sharding_type in NOT_ROW_WISE for s in cached)
    moved = offloaded_tables(default.plan)
    assert moved, "TorchRec must offload tables here"
    types = {name: s.sharding_type for name, s in offloaded.plan.plan[""].items()}
    limited = offloaded_tables(default.plan)
    assert all(types[name] in NOT_ROW_WISE for name in limited)
    assert {s.sharding_type for s in every.plan.plan[""].values()} <= set(NOT_ROW_WISE)
    cached = [s for s in pipelined.plan.plan[""].values() if s.cache_params is not None]
    assert cached and all(s.cache_params.prefetch_pipeline for s in cached)


def test_the_knob_is_never_predicted_slower_than_the_configurations_of_its_pipeline(small_stats):
    """FAE's knob tries TorchRec's configurations that train with its cold caches' pipeline (the prefetch
    pipeline by default): by TorchRec's perf model its choice is no slower than any of them, and where
    it keeps no hot rows and one of them is fastest, its report names it."""
    topology = Topology(world_size=8, compute_device="cuda", hbm_cap=16 << 20)
    grid = torchrec_configs(prefetch_pipeline=True)
    steps = {c.name: p.totals.step for c, p in plan_configs(grid, topology, small_stats, 2048).items()
             if not isinstance(p, PlannerError)}  # fmt: skip
    knob = FAEShardingPlanner(topology, small_stats, batch_size=2048, hot_budget_bytes=0)
    knob.plan(knob.meta_module(knob.choose_hot_set()), get_default_sharders())
    assert knob.report.step <= min(steps.values()) * (1 + 1e-4), (knob.report.step, steps)
    assert knob.report.torchrec_config in steps, knob.report.torchrec_config
