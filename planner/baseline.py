"""TorchRec's own planners for the unsplit model: what FAE is compared against.

- ``default_planner``: TorchRec's ``EmbeddingShardingPlanner`` as users get it (tables that do not fit
  go to ``fused_uvm`` or ``fused_uvm_caching`` with the default load factor 0.2);
- ``scaleup_planner``: the strongest TorchRec offload, every table that a cache cannot hold whole
  ``fused_uvm_caching`` with ``CacheParams`` holding ``AccessCacheStatistics`` of the whole table (built
  from the same access statistics FAE uses) and ``EmbeddingOffloadScaleupProposer`` growing the caches
  into the free HBM;
- ``hbm_planner``: every table in HBM (``fused`` or data-parallel ``dense``), the speed limit; give it a
  topology whose HBM holds the model.

``dry_run`` plans the unsplit tables on the meta device and returns the plan with its predictions
(its step as planned, and as if every table were in HBM).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, ShardingOption, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from tqdm import tqdm

from fae_torchrec.stats import AccessStats
from fae_torchrec.stats.hot_set import COLD
from fae_torchrec.torchrec_compat import best_plan, planner_enumerator, planner_topology
from planner.cache_sizing import smallest_load_factors
from planner.constraints import check_cache_params, cold_cache_statistics, fae_constraints, step_pooling
from planner.enumerator import OrderedEnumerator
from planner.report import RankTotals, in_hbm
from planner.torchrec_configs import TorchRecConfig, offloaded_tables, plan_with_sharding


@dataclass(frozen=True)
class BaselinePlan:
    """A TorchRec plan of the unsplit tables, its sharding options and per-rank predictions."""

    plan: ShardingPlan
    options: list[ShardingOption]
    totals: RankTotals
    #: The predicted step of the plan's layout with every UVM table priced as in HBM: its step without
    #: host-device transfers, which a traffic model adds.
    step_in_hbm: float

    @property
    def kernels(self) -> Counter[str]:
        """How many tables each compute kernel got."""
        return Counter(option.compute_kernel for option in self.options)


def per_feature_pooling(
    tables: Sequence[EmbeddingBagConfig], constraints: dict[str, ParameterConstraints] | None = None
) -> dict[str, ParameterConstraints]:
    """``constraints`` with TorchRec's default pooling factor for every feature of each table.

    Without ``pooling_factors`` TorchRec prices a table as one feature (``[POOLING_FACTOR]``), whatever
    the number of features that read it: TBSM's tables, read by 21 features each, would be priced and
    given buffers for a 21st of their lookups. A user's own pooling factors stay."""
    constraints = dict(constraints or {})
    for config in tables:
        given = constraints.get(config.name, ParameterConstraints())
        if given.pooling_factors == [POOLING_FACTOR] and len(config.feature_names) > 1:
            pooling = [POOLING_FACTOR] * len(config.feature_names)
            constraints[config.name] = replace(given, pooling_factors=pooling)
    return constraints


def default_planner(
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    *,
    tables: Sequence[EmbeddingBagConfig],
    cache_params: CacheParams | None = None,
) -> EmbeddingShardingPlanner:
    """(a) TorchRec's default planner (with the enumerator's choices in a fixed order) for ``tables``,
    with the user's ``constraints`` if any and every feature of a table priced (``per_feature_pooling``).
    ``cache_params`` go to every table whose constraints give none: the algorithm of the UVM caches
    TorchRec may choose, and ``CacheParams(prefetch_pipeline=True)`` to plan them for TorchRec's prefetch
    pipeline (``PrefetchTrainPipelineSparseDist`` needs it)."""
    constraints = default_constraints(tables, cache_params, constraints)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=OrderedEnumerator(topology, batch_size, constraints),
        constraints=constraints,
        stats=[],
        debug=False,
    )


def default_constraints(
    tables: Sequence[EmbeddingBagConfig],
    cache_params: CacheParams | None = None,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> dict[str, ParameterConstraints]:
    """The default planner's constraints: ``constraints`` with every feature priced, and
    ``cache_params`` (none where they are FBGEMM's defaults) on every table whose constraint gives none."""
    constraints = per_feature_pooling(tables, constraints)
    if cache_params is None or cache_params == CacheParams(CacheAlgorithm.LRU, prefetch_pipeline=False):
        return constraints
    for config in tables:
        given = constraints.get(config.name, ParameterConstraints())
        if given.cache_params is None:
            constraints[config.name] = replace(given, cache_params=cache_params)
    return constraints


def scaleup_planner(
    topology: Topology,
    stats: AccessStats,
    batch_size: int,
    *,
    algorithm: CacheAlgorithm = CacheAlgorithm.LRU,
    prefetch_pipeline: bool = False,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> EmbeddingShardingPlanner:
    """(b) UVM caches sized by ``EmbeddingOffloadScaleupProposer`` from statistics of the whole tables.

    Every cache starts at one global batch's distinct rows (the smallest that does not thrash within
    a step) and the proposer scales the caches up; a table that such a cache would hold whole stays in
    HBM, where TorchRec may also make it data-parallel. ``algorithm`` and ``prefetch_pipeline`` go to
    the caches' ``CacheParams`` (FBGEMM pipelines prefetches of LRU caches only; the proposer's
    miss-rate curves are LRU's, and it logs an error for LFU but sizes the caches the same). Tables are
    priced at the pooling measured on the profile's holdout, as FAE's planner prices them, which plans
    this same offload of the whole tables among its own candidates. On a CPU topology there is no cache
    to size, and this is TorchRec's default planner with those pooling factors. ``constraints``
    replace ``scaleup_constraints``' (to limit their sharding types, say).
    """
    if constraints is None:
        params = CacheParams(algorithm=algorithm, prefetch_pipeline=prefetch_pipeline)
        constraints = scaleup_constraints(topology, stats, batch_size, params)
    proposer = [] if topology.compute_device == "cpu" else [EmbeddingOffloadScaleupProposer()]
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        constraints=constraints,
        enumerator=OrderedEnumerator(topology, batch_size, constraints),
        proposer=proposer or None,
        stats=[],
        debug=False,
    )


def scaleup_constraints(
    topology: Topology, stats: AccessStats, batch_size: int, cache_params: CacheParams
) -> dict[str, ParameterConstraints]:
    """The scale-up planner's constraints of the unsplit tables (see ``scaleup_planner``)."""
    no_hot_rows = stats.hot_set(0)
    pooling = step_pooling(stats, no_hot_rows)
    if topology.compute_device == "cpu":
        return {
            config.name: ParameterConstraints(pooling_factors=[float(ids)] * len(config.feature_names))
            for config, ids in zip(stats.tables, pooling.cold_step_cold, strict=True)
        }
    caches = cold_cache_statistics(stats, no_hot_rows, batch_size * topology.world_size, pooling)
    sized = {name: (factor, caches[name]) for name, factor in smallest_load_factors(caches).items()}
    check_cache_params(cache_params, "scaleup_planner")
    parts = fae_constraints(stats, no_hot_rows, "cuda", sized, pooling=pooling, cache_params=cache_params)
    return {name.removesuffix(f"_{COLD}"): constraint for name, constraint in parts.items()}


def hbm_planner(
    topology: Topology, tables: Sequence[EmbeddingBagConfig], batch_size: int
) -> EmbeddingShardingPlanner:
    """(c) Every table in device memory (raises ``PlannerError`` where the model does not fit)."""
    kernels = [EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value]
    constraints = per_feature_pooling(
        tables, {config.name: ParameterConstraints(compute_kernels=kernels) for config in tables}
    )
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        constraints=constraints,
        enumerator=OrderedEnumerator(topology, batch_size, constraints),
        stats=[],
        debug=False,
    )


def dry_run(
    planner: EmbeddingShardingPlanner,
    tables: Sequence[EmbeddingBagConfig],
    optimizer_class: type[torch.optim.Optimizer] | None = None,
) -> BaselinePlan:
    """Plan an EBC of ``tables`` on the meta device (optimizer state counted when given)."""
    module = EmbeddingBagCollection(list(tables), device=torch.device("meta"))
    if optimizer_class is not None:
        apply_optimizer_in_backward(optimizer_class, module.parameters(), {"lr": 0.01})
    plan = planner.plan(module, get_default_sharders())
    options, world_size = best_plan(planner), planner_topology(planner).world_size
    hbm = in_hbm(options)
    planner_enumerator(planner).populate_estimates(hbm)
    return BaselinePlan(
        plan, options, RankTotals.of(options, world_size), RankTotals.of(hbm, world_size).step
    )


def plan_configs(
    configs: Sequence[TorchRecConfig],
    topology: Topology,
    stats: AccessStats,
    batch_size: int,
    optimizer_class: type[torch.optim.Optimizer] | None = None,
    known: dict[TorchRecConfig, BaselinePlan] | None = None,
    progress: bool = False,
) -> dict[TorchRecConfig, BaselinePlan | PlannerError]:
    """Each configuration's dry-run plan of the unsplit tables, or TorchRec's error where it places none
    (a configuration whose sharding is "offloaded" starts from its unconstrained plan, made once);
    ``known``: configurations already planned so, not planned again; ``progress`` draws a bar over
    the configurations."""
    tables = stats.tables
    names = [config.name for config in tables]
    made: dict[TorchRecConfig, BaselinePlan | PlannerError] = dict(known or {})
    ordered = sorted(configs, key=lambda c: c.sharding != "any")  # unconstrained plans first
    for config in tqdm(
        ordered, desc="TorchRec's configurations", unit="plan", leave=False, disable=not progress
    ):
        if config in made:
            continue
        if config.planner == "default":
            base = default_constraints(tables, config.cache_params)

            def make(constraints: dict) -> EmbeddingShardingPlanner:
                return default_planner(topology, batch_size, constraints, tables=tables)
        else:
            base = scaleup_constraints(topology, stats, batch_size, config.cache_params)

            def make(constraints: dict) -> EmbeddingShardingPlanner:
                return scaleup_planner(topology, stats, batch_size, constraints=constraints)

        def run(constraints: dict, make: Callable[[dict], EmbeddingShardingPlanner] = make) -> BaselinePlan:
            return dry_run(make(constraints), tables, optimizer_class)

        try:
            made[config] = plan_with_sharding(
                config.sharding,
                base,
                names,
                run,
                lambda planned: offloaded_tables(planned.plan),
                made.get(replace(config, sharding="any")),
            )
        except PlannerError as error:
            made[config] = error
    return {config: made[config] for config in configs}


def torchrec_default_plan(
    tables: Sequence[EmbeddingBagConfig], topology: Topology, batch_size: int
) -> tuple[ShardingPlan, RankTotals, Counter[str]]:
    """TorchRec's default plan of ``tables`` (a dry run): the plan, its per-rank predictions, and how
    many tables each compute kernel got."""
    result = dry_run(default_planner(topology, batch_size, tables=tables), tables)
    return result.plan, result.totals, result.kernels
