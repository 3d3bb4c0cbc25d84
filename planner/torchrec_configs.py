"""The TorchRec configurations a user reaches with a setting or two: what FAE is measured against.

A ``TorchRecConfig`` is

- a planner: TorchRec's default ``EmbeddingShardingPlanner`` ("default"), or the same with
  ``EmbeddingOffloadScaleupProposer`` sizing UVM caches from access statistics ("scale-up",
  ``planner.baseline.scaleup_planner``);
- whether UVM caches are planned for the prefetch pipeline (``CacheParams(prefetch_pipeline=True)``,
  which ``PrefetchTrainPipelineSparseDist`` needs);
- the sharding types: TorchRec's choice ("any"), ``ParameterConstraints(sharding_types=[table_wise,
  column_wise, table_column_wise])`` on the tables the configuration offloads to UVM ("offloaded": those
  its constraints cache, for the scale-up planner; those its unconstrained plan offloads, for the
  default one), or on every table ("all"). TorchRec's scale-up proposer keeps one
  sharding option per table and takes row-wise for every cached table at 8 GPUs, whose step costs 4.5x
  table-wise's even with every row in HBM: one constraint away for a user;
- the cache algorithm: LRU or LFU (FBGEMM pipelines the prefetches of LRU caches only, so LFU goes
  without the prefetch pipeline).

``torchrec_configs`` is every combination: 18 configurations. ``plan_with_sharding`` applies a
configuration's sharding types to any planning function, so that FAE's knob (on the split model) and the
baselines (on the unsplit one) try the same grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import product
from typing import TypeVar

from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingPlan, ShardingType

from planner.report import UVM_KERNELS

#: The planners: TorchRec's default, and its scale-up caches.
PLANNERS = ("default", "scale-up")
#: Where the sharding types are constrained: nowhere, on the tables the plan offloads, on every table.
SHARDINGS = ("any", "offloaded", "all")
#: The sharding types a constrained table may take: TorchRec's layouts other than row-wise and
#: data-parallel (a UVM table copied to every rank would not save memory).
NOT_ROW_WISE = [
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]
#: How each sharding shows in a configuration's name.
_SHARDING_NAMES = {"any": "", "offloaded": "tw-uvm", "all": "tw-all"}

T = TypeVar("T")


@dataclass(frozen=True)
class TorchRecConfig:
    """One TorchRec configuration: planner, prefetch pipeline, sharding types and cache algorithm."""

    planner: str = "default"
    prefetch_pipeline: bool = False
    sharding: str = "any"
    algorithm: CacheAlgorithm = CacheAlgorithm.LRU

    def __post_init__(self) -> None:
        if self.planner not in PLANNERS:
            raise ValueError(f"planner {self.planner!r}: one of {PLANNERS}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding {self.sharding!r}: one of {SHARDINGS}")
        if self.prefetch_pipeline and self.algorithm != CacheAlgorithm.LRU:
            raise ValueError("FBGEMM pipelines the prefetches of LRU caches only")

    @property
    def name(self) -> str:
        """A short name: ``default``, ``scale-up pp tw-uvm``, ``default tw-all LFU``..."""
        words = [
            self.planner,
            "pp" if self.prefetch_pipeline else "",
            _SHARDING_NAMES[self.sharding],
            "LFU" if self.algorithm == CacheAlgorithm.LFU else "",
        ]
        return " ".join(word for word in words if word)

    @property
    def cache_params(self) -> CacheParams:
        """The ``CacheParams`` of the configuration's UVM caches (their load factors are the planner's)."""
        return CacheParams(algorithm=self.algorithm, prefetch_pipeline=self.prefetch_pipeline)


def torchrec_configs(
    prefetch_pipeline: bool | None = None, algorithm: CacheAlgorithm | None = None
) -> list[TorchRecConfig]:
    """The grid of configurations, default planner first; only those with ``prefetch_pipeline`` and
    ``algorithm`` where given."""
    configs = []
    for planner, pipeline, sharding, lfu in product(PLANNERS, (False, True), SHARDINGS, (False, True)):
        config_algorithm = CacheAlgorithm.LFU if lfu else CacheAlgorithm.LRU
        if (pipeline and lfu) or prefetch_pipeline not in (None, pipeline):
            continue
        if algorithm not in (None, config_algorithm):
            continue
        configs.append(TorchRecConfig(planner, pipeline, sharding, config_algorithm))
    return configs


def offloaded_tables(plan: ShardingPlan) -> set[str]:
    """The tables a plan keeps in host memory (``fused_uvm_caching`` or ``fused_uvm``)."""
    return {
        name
        for module_plan in plan.plan.values()
        for name, sharding in module_plan.items()
        if sharding.compute_kernel in UVM_KERNELS
    }


def not_row_wise(
    constraints: dict[str, ParameterConstraints], tables: Iterable[str]
) -> dict[str, ParameterConstraints]:
    """``constraints`` with the sharding types of ``tables`` limited to ``NOT_ROW_WISE`` (within those
    a constraint already allows). A table whose constraint allows none of them keeps it: a user's own
    choice of sharding types wins, as a user's load factor does."""
    limited = dict(constraints)
    for table in tables:
        given = limited.get(table, ParameterConstraints())
        allowed = NOT_ROW_WISE if given.sharding_types is None else given.sharding_types
        if kept := [t for t in NOT_ROW_WISE if t in allowed]:
            limited[table] = replace(given, sharding_types=kept)
    return limited


def uvm_constrained(constraints: dict[str, ParameterConstraints]) -> set[str]:
    """The tables whose constraints allow UVM kernels only: those the user put in host memory (as
    ``scaleup_planner`` caches every table one global batch's rows do not cover)."""
    return {
        name
        for name, constraint in constraints.items()
        if constraint.compute_kernels and set(constraint.compute_kernels) <= set(UVM_KERNELS)
    }


def plan_with_sharding(
    sharding: str,
    constraints: dict[str, ParameterConstraints],
    tables: Iterable[str],
    plan: Callable[[dict[str, ParameterConstraints]], T],
    offloaded: Callable[[T], set[str]],
    unconstrained: T | PlannerError | None = None,
) -> T:
    """``plan(constraints)`` with ``sharding``'s types: as given ("any"), limited on every one of
    ``tables`` ("all"), or limited on the offloaded tables ("offloaded"): those the constraints put in
    UVM (``uvm_constrained``) or, where they put none there, those that the plan with the constraints as
    given offloads (``offloaded(planned)``; that plan itself where it offloads none). ``unconstrained``
    is that plan, or TorchRec's error for it, where already made: an error is raised again for
    "offloaded" (no plan, no offloaded tables), as ``plan`` raises TorchRec's ``PlannerError``."""
    if sharding == "all":
        return plan(not_row_wise(constraints, tables))
    if sharding == "offloaded" and (cached := uvm_constrained(constraints)):
        return plan(not_row_wise(constraints, cached))
    if isinstance(unconstrained, PlannerError):
        raise unconstrained
    planned = plan(constraints) if unconstrained is None else unconstrained
    if sharding == "any" or not (moved := offloaded(planned)):
        return planned
    return plan(not_row_wise(constraints, moved))
