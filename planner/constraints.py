"""TorchRec ``ParameterConstraints`` for the two parts of an FAE-split model.

Hot tables may use HBM kernels only (``fused``, or ``dense`` where TorchRec picks data-parallel); cold
tables use ``fused_uvm_caching`` with ``CacheParams`` (a load factor and ``AccessCacheStatistics``), or
the HBM kernels where their load factor is 1 (the whole cold part fits in device memory), and in a
plan of its own where only caches smaller than the budget pays for can be placed, or none,
``fused_uvm`` (no cache) too. On a
CPU topology both parts get TorchRec's CPU kernels and sharding types, so plans execute here. The
sharding type of every part table is left to TorchRec's cost model unless the user constrains it.
TorchRec plans one sharding for both kinds of step, so each part's pooling factor is the ids it looks
up per input averaged over hot and cold steps (``StepPooling``); the planner then prices the chosen
plan at a hot step's and a cold step's own pooling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingType

from fae_torchrec.modules import part_table_name
from fae_torchrec.modules.fae_embedding_bag import HOT_KERNELS, SLOT_KERNEL, SLOT_SHARDING_TYPES
from fae_torchrec.stats import AccessStats, HotSet
from fae_torchrec.stats.hot_set import COLD, HOT
from fae_torchrec.stats.hot_share import holdout_cold_inputs, holdout_rows_hot
from planner.cache_sizing import cold_rows, cold_table_rows, seen_cold_counts
from planner.cache_statistics import AccessCacheStatistics

#: Sharding types of cold tables on CUDA: data-parallel would copy a UVM table to every rank.
CUDA_COLD_SHARDING_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]
CPU_SHARDING_TYPES = [
    ShardingType.DATA_PARALLEL.value,
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]
#: The rule of a cold part held in slots (a planned cold tier's slot table).
SLOTS = "slots"
#: (sharding types, kernels) a part may use, by compute device and rule (the part, or ``SLOTS``); None
#: leaves TorchRec every choice.
ALLOWED = {
    ("cuda", HOT): (None, list(HOT_KERNELS)),
    ("cuda", COLD): (CUDA_COLD_SHARDING_TYPES, [EmbeddingComputeKernel.FUSED_UVM_CACHING.value]),
    ("cuda", SLOTS): (list(SLOT_SHARDING_TYPES), [SLOT_KERNEL]),
    ("cpu", HOT): (CPU_SHARDING_TYPES, list(HOT_KERNELS)),
    ("cpu", COLD): (CPU_SHARDING_TYPES, list(HOT_KERNELS)),
    ("cpu", SLOTS): ([t for t in CPU_SHARDING_TYPES if t in SLOT_SHARDING_TYPES], [SLOT_KERNEL]),
}


@dataclass(frozen=True)
class StepPooling:
    """Per table, ids per input and feature that each part looks up on each kind of step.

    FAE routes whole inputs: a hot step's batch holds entirely-hot inputs, whose ids all fall on hot
    rows, and a cold step's batch holds the other inputs, which carry every cold lookup (``p * (1 -
    s_t) / (1 - share)`` of them for a table of pooling ``p`` and hot access share ``s_t``) and some
    hot ones. Measured on the profile's holdout: the sample chose the hot rows, so its own counts are
    biased towards them.
    """

    hot_input_share: float
    hot_step: np.ndarray
    cold_step_hot: np.ndarray
    cold_step_cold: np.ndarray
    features: np.ndarray

    def ids_per_input(self, pooling: np.ndarray) -> float:
        """Ids an input looks up over all tables, given one of the per-table poolings above."""
        return float(pooling @ self.features)

    @property
    def expected_hot(self) -> np.ndarray:
        """The hot part's pooling averaged over hot and cold steps (what a step looks up on average)."""
        share = self.hot_input_share
        return share * self.hot_step + (1.0 - share) * self.cold_step_hot

    @property
    def expected_cold(self) -> np.ndarray:
        """The cold part's pooling averaged over all steps (it does no lookup on hot steps)."""
        return (1.0 - self.hot_input_share) * self.cold_step_cold


def step_pooling(stats: AccessStats, hot_set: HotSet) -> StepPooling:
    """The pooling of each part on hot and on cold steps, from the holdout (see ``StepPooling``)."""
    holdout = stats.holdout
    n = len(holdout)
    if n == 0:
        raise ValueError("the statistics have no holdout inputs to measure hot and cold batches on")
    tables = stats.layout.table_of_rows(holdout.rows)
    row_hot = holdout_rows_hot(holdout, hot_set)
    cold_input = holdout_cold_inputs(holdout, row_hot)
    on_cold_input = cold_input[holdout.owners]
    num_cold = int(cold_input.sum())
    features = np.array([len(c.feature_names) for c in stats.tables], dtype=np.float64)

    def per_input(lookups: np.ndarray, inputs: int) -> np.ndarray:
        counts = np.bincount(tables[lookups], minlength=len(stats.tables))
        return counts / max(inputs, 1) / features

    return StepPooling(
        hot_input_share=(n - num_cold) / n,
        hot_step=per_input(~on_cold_input, n - num_cold),
        cold_step_hot=per_input(on_cold_input & row_hot, num_cold),
        cold_step_cold=per_input(on_cold_input & ~row_hot, num_cold),
        features=features,
    )


def cold_cache_statistics(
    stats: AccessStats, hot_set: HotSet, global_batch_size: int, pooling: StepPooling | None = None
) -> dict[str, AccessCacheStatistics]:
    """Cache statistics of every table's cold rows, keyed by table name. Caches serve cold steps only,
    so a batch's lookups are a cold step's (``pooling``: ``step_pooling(stats, hot_set)``, computed
    when not given)."""
    pooling = pooling or step_pooling(stats, hot_set)
    lookups = pooling.cold_step_cold * global_batch_size
    return {
        config.name: AccessCacheStatistics.from_seen(
            seen, int(rows), float(n * len(config.feature_names)), table_rows=int(table_rows)
        )
        for config, seen, rows, table_rows, n in zip(
            stats.tables,
            seen_cold_counts(stats, hot_set),
            cold_rows(hot_set),
            cold_table_rows(hot_set),
            lookups,
            strict=True,
        )
        if rows
    }


def merged_cache_params(default: CacheParams, user: CacheParams | None) -> CacheParams:
    """``default`` with every field the ``user`` sets (not None) taken from ``user``."""
    if user is None:
        return default
    return replace(default, **{f.name: v for f in fields(user) if (v := getattr(user, f.name)) is not None})


def check_cache_params(params: CacheParams, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` where ``params`` pipeline the prefetches of a cache that is
    not LRU: FBGEMM pipelines LRU caches only (its TBE asserts it)."""
    if params.prefetch_pipeline and params.algorithm not in (None, CacheAlgorithm.LRU):
        raise ValueError(
            f"{what}: {params.algorithm.name} caches with prefetch_pipeline=True; FBGEMM pipelines the "
            "prefetches of LRU caches only: give prefetch_pipeline=False, or the LRU algorithm"
        )


def fae_constraints(
    stats: AccessStats,
    hot_set: HotSet,
    compute_device: str,
    caches: Mapping[str, tuple[float | None, AccessCacheStatistics]],
    user: dict[str, ParameterConstraints] | None = None,
    uncached: bool = False,
    torchrec_choice: bool = False,
    pooling: StepPooling | None = None,
    cache_params: CacheParams | None = None,
    slots: bool = False,
) -> dict[str, ParameterConstraints]:
    """Constraints keyed by part table name (``t_hot``, ``t_cold``) for every part that has rows.

    ``caches`` gives each cold table's load factor and statistics (used on CUDA; a load factor of 1
    puts the cold part in HBM, as a hot part; None only where ``caches`` is not used). ``cache_params`` are
    the cold caches' other ``CacheParams`` (algorithm, ``prefetch_pipeline``; FBGEMM's defaults when
    None), under any field a user's constraint sets. ``user`` constraints are keyed by original table name
    and apply to both parts; their kernels and sharding types are intersected with the part's allowed
    ones (an empty intersection is an error naming the table). With ``uncached`` a cold part may also
    live in UVM without a cache (``fused_uvm``, where TorchRec cannot fit its cache; TorchRec's perf
    model prices a cache by its load factor, not its hit rate, so it would prefer no cache to a small
    one that hits often). With ``torchrec_choice`` only the
    pooling factors and the user's constraints are set: kernels, sharding types and caches are
    TorchRec's choice, as in its own plan of the unsplit model (``caches`` is not used). With ``slots``
    the cold parts are a planned cold tier's slot tables: whole-row shards on the ``fused`` kernel
    (``caches`` is not used). ``pooling`` is ``step_pooling(stats, hot_set)``, computed when not given.
    """
    user = user or {}
    pooling = pooling or step_pooling(stats, hot_set)
    constraints = {}
    for t, config in enumerate(stats.tables):
        base = user.get(config.name, ParameterConstraints())
        cold_cache = merged_cache_params(cache_params or CacheParams(), base.cache_params)
        per_part: dict[str, tuple[float, CacheParams | None, str]] = {}
        if len(hot_set.hot_ids[t]):
            per_part[HOT] = (pooling.expected_hot[t], base.cache_params, HOT)
        if len(hot_set.hot_ids[t]) < config.num_embeddings:
            cache, rule = _cold_cache(
                config.name, base, cold_cache, compute_device, caches, torchrec_choice, slots
            )
            per_part[COLD] = (pooling.expected_cold[t], cache, rule)
        for part, (part_pooling, part_cache, rule) in per_part.items():
            allowed_types, allowed_kernels = (
                (None, None) if torchrec_choice else ALLOWED[compute_device, rule]
            )
            if uncached and compute_device == "cuda" and rule == COLD and allowed_kernels is not None:
                allowed_kernels = [*allowed_kernels, EmbeddingComputeKernel.FUSED_UVM.value]
            constraints[part_table_name(config.name, part)] = replace(
                base,
                sharding_types=_allowed(
                    config.name, part, "sharding types", allowed_types, base.sharding_types
                ),
                compute_kernels=_allowed(config.name, part, "kernels", allowed_kernels, base.compute_kernels),
                pooling_factors=[float(part_pooling)] * len(config.feature_names),
                cache_params=part_cache,
            )
    return constraints


def _cold_cache(
    table: str,
    base: ParameterConstraints,
    cold_cache: CacheParams,
    compute_device: str,
    caches: Mapping[str, tuple[float | None, AccessCacheStatistics]],
    torchrec_choice: bool,
    slots: bool,
) -> tuple[CacheParams | None, str]:
    """A cold part's cache and the rule of its kernels (:func:`fae_constraints`' ``caches``,
    ``torchrec_choice`` and ``slots``): a planned tier's slots have none; TorchRec's choice may cache (on
    CUDA) with the cold caches' params; else the knob's load factor, whole (1) meaning in HBM."""
    if slots:
        return None, SLOTS
    if torchrec_choice:
        if compute_device == "cpu" or cold_cache == CacheParams():
            return base.cache_params, COLD
        return cold_cache, COLD
    load_factor, cache_stats = caches[table]
    if load_factor is None:
        raise ValueError(f"table {table}: its cold part has no load factor (caches)")
    in_hbm = load_factor >= 1.0
    if compute_device == "cpu" or in_hbm:
        return None, HOT if in_hbm else COLD
    return replace(cold_cache, load_factor=load_factor, stats=cache_stats), COLD


def _allowed(
    table: str, part: str, what: str, allowed: list[str] | None, requested: list[str] | None
) -> list[str] | None:
    """``requested`` within ``allowed`` (None: no limit); an empty result is an error naming the table."""
    if requested is None:
        return None if allowed is None else list(allowed)
    if allowed is None:
        return list(requested)
    chosen = [x for x in requested if x in allowed]
    if not chosen:
        raise ValueError(
            f"table {table}: its {part} part may use {what} {allowed}, the constraints allow only {requested}"
        )
    return chosen
