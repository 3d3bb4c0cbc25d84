"""``FAEShardingPlanner``: TorchRec's ``EmbeddingShardingPlanner`` driven by FAE access statistics.

The planner works on models whose embedding bags are a ``FAEEmbeddingBagCollection``. For the part
tables it writes ``ParameterConstraints`` (HBM kernels for hot rows, ``fused_uvm_caching`` with cache
statistics for cold rows, planned for TorchRec's prefetch pipeline unless told otherwise; CPU kernels on a
CPU topology), sizes the cold caches from the device memory TorchRec's storage reservation leaves, and
lets TorchRec's enumerator, proposers, partitioner and perf model do the rest; with no hot rows TorchRec's
own configurations (``planner.torchrec_configs``) are candidates too.

``choose_hot_set`` is FAE's knob: without a budget it tries budgets from none up to the bytes of the
rows seen in the sample (a row never seen is never hot), within the device memory, plus the whole model
when it fits, and keeps the one with the shortest predicted step, ``share x hot step + (1 - share) x
cold step``: TorchRec's perf model prices the chosen plan twice, a
hot step (the hot part at the pooling of entirely-hot batches, no cold part) and a cold step (both
parts at the pooling of the other inputs' batches), both measured on the profile's holdout.

As with TorchRec's planner, call ``apply_optimizer_in_backward`` on the model before planning so that
optimizer state counts in the storage estimates; the knob's own candidate modules get
``optimizer_class`` attached that way.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from copy import deepcopy
from dataclasses import replace
from typing import Any, TypeAlias

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, ShardingOption, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan, ShardingPlanner
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from fae_torchrec.modules import FAEEmbeddingBagCollection, part_table_name
from fae_torchrec.stats import COLD, HOT, AccessStats, HotSet
from fae_torchrec.torchrec_compat import best_plan
from fae_torchrec.units import format_bytes
from planner.cache_sizing import ColdCacheSizing, smallest_load_factors
from planner.constraints import (
    StepPooling,
    check_cache_params,
    cold_cache_statistics,
    fae_constraints,
    merged_cache_params,
    step_pooling,
)
from planner.enumerator import OrderedEnumerator
from planner.report import FAEPlanReport, RankTotals, in_hbm, part_paths
from planner.slot_copies import SlotCopyEstimator
from planner.torchrec_configs import TorchRecConfig, offloaded_tables, plan_with_sharding, torchrec_configs

logger = logging.getLogger(__name__)

#: Share of the device memory TorchRec's default storage reservation keeps free.
RESERVED_PERCENTAGE = 0.15
#: Share of the memory left for embeddings that the cold caches may take (headroom for rounding).
CACHE_SHARE = 0.9
#: Shares of that cache budget the caches are sized from when TorchRec cannot place the caches sized from
#: all of it (its storage estimates add buffers that the sizing does not count); a bounded number of plans.
SMALLER_CACHE_SHARES = (0.75, 0.5, 0.25, 0.125, 0.0625, 0.03125)
#: A plan's cold sizing: load factors by table, and the kernel options of ``fae_constraints`` (booleans)
#: or, for a TorchRec configuration's plan, that configuration (``config``).
Sizing: TypeAlias = tuple[dict[str, float], dict[str, Any]]
#: What the knob's plan at one budget came to: its report and sizing, or TorchRec's error.
BudgetOutcome: TypeAlias = tuple[FAEPlanReport, Sizing] | PlannerError


def default_reservation() -> HeuristicalStorageReservation:
    """TorchRec's default storage reservation, the one ``EmbeddingShardingPlanner`` makes when given none,
    so that FAE's plans and TorchRec's reserve alike. Made without the ``FutureWarning`` TorchRec raises
    on every construction (it recommends a fixed percentage for dry runs): the choice is deliberate here,
    and the warning would name this module on every plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "HeuristicalStorageReservation is known to cause issues", FutureWarning
        )
        return HeuristicalStorageReservation(percentage=RESERVED_PERCENTAGE)


#: In a knob worker, the planner whose budgets it plans (the parent's, inherited at the fork).
_worker_planner: FAEShardingPlanner | None = None


def _start_worker(planner: FAEShardingPlanner) -> None:
    """Keep the parent's planner; one intra-op thread, as in PyTorch's forked DataLoader workers."""
    global _worker_planner
    _worker_planner = planner
    torch.set_num_threads(1)


def _plan_in_worker(budget: float) -> tuple[list[float], BudgetOutcome]:
    """The inherited planner's plan at ``budget`` (nothing of the planner is pickled per task)."""
    assert _worker_planner is not None  # set by _start_worker
    return _worker_planner._plan_budget(budget)


def place_largest(sizings: list[dict[str, float]], place: Callable[[dict[str, float]], bool]) -> bool:
    """Whether ``place`` places one of ``sizings`` (ordered from the largest caches to the smallest),
    the largest it places: tried first, then the smallest, then by bisection between them, so at
    most ``2 + log2(len(sizings))`` runs of TorchRec's planner, where trying each in turn took one
    per sizing (at 128 GPUs x 64 MiB none of them places, and a failed run takes 5 to 15 s). Assumes
    that TorchRec places smaller caches wherever it places larger ones."""
    if not sizings:
        return False
    if place(sizings[0]):
        return True
    if len(sizings) == 1 or not place(sizings[-1]):
        return False
    failed, placed = 0, len(sizings) - 1
    while placed - failed > 1:
        middle = (failed + placed) // 2
        if place(sizings[middle]):
            placed = middle
        else:
            failed = middle
    return True


class FAEShardingPlanner(ShardingPlanner):
    """Plans FAE-split models for ``DistributedModelParallel``.

    Args:
        topology: the devices (CUDA for HBM and UVM caching, CPU to execute here).
        stats: the access statistics the split was made from (the same tables).
        batch_size: per-rank batch size.
        constraints: user ``ParameterConstraints`` keyed by original table name.
        hot_budget_bytes: fix the hot-row budget instead of searching for it.
        optimizer_class: embedding optimizer, for the row cost of hot rows and caches.
        num_candidates: budgets the knob tries besides none (and the whole model).
        processes: budgets the knob plans at once, each in a forked worker process (budgets are
            independent, so the choice is the same); 1 plans them one after another here.
        cache_params: the ``CacheParams`` of the cold parts' UVM caches (the planner sets their load
            factors and statistics; a user's per-table ``CacheParams`` override it): by default
            TorchRec's strongest, LRU caches for ``PrefetchTrainPipelineSparseDist``
            (``FAEPrefetchTrainPipeline``), ``CacheParams(prefetch_pipeline=True)``; give
            ``CacheParams(prefetch_pipeline=False)`` to train with another pipeline, or another
            ``CacheAlgorithm``. Unused on a CPU topology, which has no cache.
    """

    def __init__(
        self,
        topology: Topology,
        stats: AccessStats,
        batch_size: int = 512,
        constraints: dict[str, ParameterConstraints] | None = None,
        hot_budget_bytes: int | None = None,
        optimizer_class: type[torch.optim.Optimizer] | None = None,
        num_candidates: int = 6,
        processes: int = 1,
        cache_params: CacheParams | None = None,
    ) -> None:
        if hot_budget_bytes is not None and hot_budget_bytes < 0:
            raise ValueError(f"hot budget must be non-negative, got {hot_budget_bytes} bytes")
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        if not len(stats.holdout):
            raise ValueError(
                "the statistics have no holdout inputs (profiled with the sample fraction 1, --sample 1, or "
                "no holdout, --holdout 0): the planner estimates the hot-input share and the cold parts' "
                "traffic on inputs left out of the sample, since in-sample counts make every seen row hot; "
                "profile with a sample fraction below 1 and a holdout"
            )
        unknown = sorted(set(constraints or {}) - set(stats.layout.names))
        if unknown:
            raise ValueError(f"constraints for unknown tables {unknown} (tables: {stats.layout.names})")
        self.topology = topology
        self.stats = stats
        self.batch_size = batch_size
        self.constraints = constraints
        self.hot_budget_bytes = hot_budget_bytes
        self.optimizer_class = optimizer_class
        self.num_candidates = num_candidates
        self.processes = processes
        self.cache_params = CacheParams(prefetch_pipeline=True) if cache_params is None else cache_params
        check_cache_params(self.cache_params, "cache_params")
        for name, constraint in (constraints or {}).items():
            merged = merged_cache_params(self.cache_params, constraint.cache_params)
            check_cache_params(merged, f"table {name} (its constraints over the planner's cache_params)")
        self.report: FAEPlanReport | None = None
        #: Seconds of each run of TorchRec's planner so far, failed ones included (the knob runs it
        #: once or more per budget): where planning time goes.
        self.torchrec_runs: list[float] = []
        self._ranking = stats.ranking(optimizer_class)
        #: The last hot set sized (the knob's choice, or ``plan``'s) and the cold sizing of its plan (load
        #: factors, kernel options), which ``plan`` tries first for that hot set.
        self._chosen: tuple[HotSet, Sizing] | None = None
        #: Per table, the bytes a planned cold tier's slot plan copies in and back per cold step (with
        #: optimizer state): ``plan`` prices them on the slot tables (``SlotCopyEstimator``). Set by the
        #: one who sizes the slots, before ``plan``; none by default.
        self.slot_copies: dict[str, float] = {}

    def choose_hot_set(self) -> HotSet:
        """The hot set to build the model with: the given budget's, or the knob's choice.

        Raises ``PlannerError`` when no candidate budget gives a plan that fits.
        """
        if self.hot_budget_bytes is not None:
            return self._ranking.hot_set(self.hot_budget_bytes)
        memory = float(self.device_memory(self.meta_module(self._ranking.hot_set(0))).sum())
        seen_bytes = float(self._ranking.cumulative_bytes[-1]) if len(self._ranking.rows) else 0.0
        top = min(seen_bytes, memory)
        budgets = [0.0]
        if top > 0:
            budgets += np.geomspace(top / 2 ** (self.num_candidates - 1), top, self.num_candidates).tolist()
        if self._ranking.total_bytes <= memory:
            budgets.append(float(self._ranking.total_bytes))  # the whole model fits: every row hot
        best: tuple[float, HotSet] | None = None
        failure: PlannerError | None = None
        for budget, (runs, outcome) in zip(budgets, self._plan_budgets(budgets), strict=True):
            self.torchrec_runs += runs
            if isinstance(outcome, PlannerError):
                logger.info("hot budget %s: no plan fits", format_bytes(budget))
                failure = failure or outcome
                continue
            report, sizing = outcome
            logger.info(
                "hot budget %s: predicted step %.3f ms (%d runs of TorchRec's planner so far)",
                format_bytes(budget),
                report.step,
                len(self.torchrec_runs),
            )
            if best is None or report.step < best[0]:
                hot_set = self._ranking.hot_set(int(budget))
                best, self.report, self._chosen = (report.step, hot_set), report, (hot_set, sizing)
        if best is None:
            assert failure is not None  # every budget's plan failed
            raise PlannerError(str(failure).split("\n")[0], failure.error_type)
        return best[1]

    def _plan_budgets(self, budgets: list[float]) -> Iterator[tuple[list[float], BudgetOutcome]]:
        """``_plan_budget`` of each budget, in order, as each is done: here, or in ``processes``
        forked workers, which share this planner's statistics instead of copying them (hundreds of MiB
        at Kaggle sizes) and this process's logging and warning filters. A worker plans meta modules
        only: it touches no device, process group or thread of this process, and exits without
        running any finalizer of them."""
        if self.processes == 1 or len(budgets) == 1:
            yield from map(self._plan_budget, budgets)
            return
        workers = min(self.processes, len(budgets))
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            workers, mp_context=context, initializer=_start_worker, initargs=(self,)
        ) as pool:
            yield from pool.map(_plan_in_worker, budgets)

    def _plan_budget(self, budget: float) -> tuple[list[float], BudgetOutcome]:
        """The seconds of the runs of TorchRec's planner that the knob's plan at ``budget`` makes
        (taken out of ``torchrec_runs`` again) and what the plan came to."""
        hot_set = self._ranking.hot_set(int(budget))
        start = len(self.torchrec_runs)
        try:
            _, report, sizing = self._plan(self.meta_module(hot_set), hot_set, get_default_sharders())
            outcome: BudgetOutcome = (report, sizing)
        except PlannerError as error:
            outcome = error
        runs = self.torchrec_runs[start:]
        del self.torchrec_runs[start:]
        return runs, outcome

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """The sharding plan of ``module`` (containing one ``FAEEmbeddingBagCollection``)."""
        fae = [(n, m) for n, m in module.named_modules() if isinstance(m, FAEEmbeddingBagCollection)]
        if len(fae) != 1:
            raise ValueError(f"expected one FAEEmbeddingBagCollection in the model, found {len(fae)}")
        path, split = fae[0]
        hot_set = split.hot_set()
        if hot_set.layout.describe() != self.stats.layout.describe():
            raise ValueError("the statistics are for other tables than the model's FAEEmbeddingBagCollection")
        if split.cold_slots is not None:  # a planned cold tier: no cache to size
            plan, self.report, _ = self._plan(module, hot_set, sharders, path, slots=True)
        else:
            plan, self.report, _ = self._plan(module, hot_set, sharders, path, self._sizing(hot_set))
        logger.info("%s", self.report)
        return plan

    def _sizing(self, hot_set: HotSet) -> Sizing | None:
        """The cold sizing of ``hot_set`` as the knob plans it (on its meta module, without the model's
        dense part), kept for the next call: ``plan`` starts from it whether ``choose_hot_set`` ran before
        or not, so the plan of a model does not depend on the order of the calls. None where no sizing
        places."""
        chosen = self._chosen
        if chosen and all(map(np.array_equal, chosen[0].hot_ids, hot_set.hot_ids)):
            return chosen[1]
        try:
            _, _, sizing = self._plan(self.meta_module(hot_set), hot_set, get_default_sharders())
        except PlannerError:
            return None
        self._chosen = (hot_set, sizing)
        return sizing

    def _slot_copies(self) -> dict[str, float]:
        """``slot_copies`` by the slot tables' names (the cold parts')."""
        return {part_table_name(table, COLD): copied for table, copied in self.slot_copies.items()}

    def cold_slot_budget(self, hot_set: HotSet) -> float | None:
        """The device memory (bytes, all devices together) that a planned cold tier's slot rows may take
        beside ``hot_set``'s hot rows: what TorchRec's storage reservation leaves, less TorchRec's own
        storage estimate of every part (hot rows, slot tables of one row each, their input and output
        buffers) in its least option. A slot is a plain row (no cache rounding or bookkeeping), so no
        headroom is kept beyond TorchRec's. None on a CPU topology, which has no device memory to fill."""
        if self.topology.compute_device != "cuda":
            return None
        tables = zip(self.stats.tables, hot_set.hot_ids, strict=True)
        one_slot = {config.name: 1 for config, hot in tables if len(hot) < config.num_embeddings}
        module = self.meta_module(hot_set, cold_slots=one_slot)
        constraints = fae_constraints(
            self.stats, hot_set, "cuda", {}, self.constraints, cache_params=self.cache_params, slots=True
        )
        taken = self._smallest_storage(module, get_default_sharders(), constraints)
        return max(float(self.device_memory(module).sum()) - taken, 0.0)

    def _cache_budget(self, memory: np.ndarray, hot_set: HotSet) -> float:
        """The device memory the cold parts may take: ``CACHE_SHARE`` of what the hot rows leave of
        ``memory`` (``device_memory``)."""
        return CACHE_SHARE * max(float(memory.sum()) - hot_set.hot_bytes(self.optimizer_class), 0.0)

    def collective_plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 and broadcast the plan to every rank of ``pg``; when rank 0 cannot plan,
        every rank raises its error (none waits for a plan that never comes)."""
        pg = pg if pg is not None else dist.GroupMember.WORLD
        outcome = invoke_on_rank_and_broadcast_result(
            pg, 0, self._plan_or_error, module, sharders or get_default_sharders()
        )
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _plan_or_error(self, module: nn.Module, sharders: list) -> ShardingPlan | Exception:
        try:
            return self.plan(module, sharders)
        except (PlannerError, ValueError) as error:
            return error

    def _plan(
        self,
        module: nn.Module,
        hot_set: HotSet,
        sharders: list,
        fae_path: str = "",
        known: Sizing | None = None,
        slots: bool = False,
    ) -> tuple[ShardingPlan, FAEPlanReport, Sizing]:
        """The plan of ``module`` split by ``hot_set``, its report and the cold sizing it has.

        With ``slots`` the cold parts are a planned cold tier's slot tables (``cold_slots``), planned
        as they are, whole rows on the ``fused`` kernel (``fae_constraints``).

        The cold parts go whole into HBM where the cache budget pays for them, else into caches sized
        from the whole budget; where TorchRec places neither, into the largest of the smaller caches
        (``_smaller_sizings``) that it places, and they may also live in UVM without a cache
        (``fused_uvm``), in a plan of its own. Without hot rows TorchRec's own configurations are
        candidates too (``_torchrec_configs``: on CUDA its default and scale-up planners, with every
        sharding choice of ``planner.torchrec_configs``, for the cold caches' pipeline). Of the plans
        placed, the one TorchRec's perf model prices fastest is kept: so the knob, which always tries
        the empty hot set, finds a plan wherever TorchRec's planner does, and never predicts a slower
        one than those configurations; the report names the configuration where it keeps one.

        A ``known`` sizing (the knob's, for the hot set it chose) is planned alone when TorchRec places
        it: ``plan`` then repeats none of the knob's search (the model's dense part only takes memory).
        """
        world = self.topology.world_size
        pooling = step_pooling(self.stats, hot_set)
        caches = cold_cache_statistics(self.stats, hot_set, self.batch_size * world, pooling)
        memory = self.device_memory(module)
        cache_budget = self._cache_budget(memory, hot_set)
        device = self.topology.compute_device
        candidates: list[tuple[ShardingPlan, list[ShardingOption], OrderedEnumerator, Sizing]] = []
        failures: list[PlannerError] = []

        def constraints(
            load_factors: dict[str, float], cache_params: CacheParams | None = None, **options: bool
        ) -> dict[str, ParameterConstraints]:
            sized = {name: (load_factors.get(name), cache) for name, cache in caches.items()}
            return fae_constraints(
                self.stats,
                hot_set,
                device,
                sized,
                self.constraints,
                pooling=pooling,
                cache_params=cache_params or self.cache_params,
                **options,
            )

        cold = ColdCacheSizing(self.stats, hot_set, caches, self.optimizer_class)
        unplaced: list[dict[str, float]] = []  # the sizings TorchRec did not place
        unconstrained: dict[TorchRecConfig, tuple | PlannerError] = {}  # configurations as given

        def place(
            load_factors: dict[str, float], config: TorchRecConfig | None = None, **options: bool
        ) -> bool:
            """Whether TorchRec places the parts with these cold sizes (the plan becomes a candidate).
            A sizing (no kernel options) that asks at least as much as one it did not place
            (``ColdCacheSizing.asks_at_least``) is not planned. With a TorchRec ``config`` the parts are
            planned as that configuration plans the unsplit tables (``load_factors`` unused)."""
            sized = not options and config is None
            if sized and any(cold.asks_at_least(load_factors, other) for other in unplaced):
                return False
            try:
                if config is None:
                    copied = self._slot_copies() if options.get("slots") else None
                    planned = self._torchrec_plan(
                        module, sharders, constraints(load_factors, **options), copied=copied
                    )
                else:
                    planned = self._plan_config(module, sharders, config, caches, constraints, unconstrained)
            except PlannerError as error:
                failures.append(error)
                if sized:
                    unplaced.append(load_factors)
                return False
            sizing: Sizing = ({}, {"config": config}) if config else (load_factors, options)
            candidates.append((*planned, sizing))
            return True

        whole = self._load_factors(cold, cache_budget, whole_parts=True)
        full = self._load_factors(cold, cache_budget, whole_parts=False)
        if slots:
            place({}, slots=True)
        elif not (known and place(known[0], **known[1])):
            if not (place(whole) or (full != whole and place(full))):
                place_largest(self._smaller_sizings(cold, cache_budget, full), place)
                place(full, uncached=True)
            for config in self._torchrec_configs() if not hot_set.total_hot else ():
                place({}, config)
        if not candidates:
            failure = failures[-1]
            smallest = constraints({}, slots=True) if slots else constraints(full, uncached=True)
            needed = self._smallest_storage(module, sharders, smallest)
            raise PlannerError(
                self._too_small_message(needed, float(memory.sum()), failure), failure.error_type
            ) from failure
        planned = [
            (plan, self._report(options, enumerator, fae_path, hot_set, pooling, sized), sized)
            for plan, options, enumerator, sized in candidates
        ]
        return min(planned, key=lambda planned: planned[1].step)

    def _torchrec_plan(
        self,
        module: nn.Module,
        sharders: list,
        constraints: dict[str, ParameterConstraints],
        scaleup: bool = False,
        copied: dict[str, float] | None = None,
    ) -> tuple[ShardingPlan, list[ShardingOption], OrderedEnumerator]:
        """TorchRec's ``EmbeddingShardingPlanner`` run with ``constraints`` (and with ``scaleup``, its
        ``EmbeddingOffloadScaleupProposer`` growing the caches; with ``copied``, slot tables' copies per
        cold step priced by ``SlotCopyEstimator``): the plan, its sharding options and the enumerator
        that priced them. Raises TorchRec's ``PlannerError``."""
        estimators = None
        if copied:  # TorchRec's own estimators, then the copies on the perfs they set
            estimators = [
                EmbeddingPerfEstimator(self.topology, constraints),
                EmbeddingStorageEstimator(self.topology, constraints),
                SlotCopyEstimator(self.topology, constraints, copied),
            ]
        enumerator = OrderedEnumerator(self.topology, self.batch_size, constraints, estimator=estimators)
        planner = EmbeddingShardingPlanner(
            topology=self.topology,
            batch_size=self.batch_size,
            constraints=constraints,
            enumerator=enumerator,
            storage_reservation=default_reservation(),
            proposer=[EmbeddingOffloadScaleupProposer()] if scaleup else None,
            stats=[],
            debug=False,
        )
        started = time.perf_counter()
        try:
            plan = planner.plan(module, sharders)
        finally:
            self.torchrec_runs.append(time.perf_counter() - started)
        return plan, best_plan(planner), enumerator

    def _torchrec_configs(self) -> list[TorchRecConfig]:
        """TorchRec's configurations the knob tries with no hot rows: on CUDA the grid of them
        (``torchrec_configs``) that trains with the cold caches' pipeline and algorithm (both
        algorithms where none is given); on a CPU topology, which has no cache, TorchRec's default."""
        if self.topology.compute_device != "cuda":
            return [TorchRecConfig()]
        return torchrec_configs(bool(self.cache_params.prefetch_pipeline), self.cache_params.algorithm)

    def _plan_config(
        self,
        module: nn.Module,
        sharders: list,
        config: TorchRecConfig,
        caches: dict,
        constraints: Callable[..., dict[str, ParameterConstraints]],
        unconstrained: dict[TorchRecConfig, tuple | PlannerError],
    ) -> tuple[ShardingPlan, list[ShardingOption], OrderedEnumerator]:
        """The parts planned as TorchRec's ``config`` plans the unsplit tables: its default planner's
        own choice of kernels, sharding types and caches, or its scale-up caches (the smallest caches,
        grown by ``EmbeddingOffloadScaleupProposer``, as ``planner.baseline.scaleup_planner`` plans
        them), with the configuration's ``CacheParams`` and sharding types. ``unconstrained`` keeps the
        plans (or errors) made with TorchRec's choice of sharding types, for the configurations that
        start from one."""
        scaleup = config.planner == "scale-up"
        # the configuration's algorithm and pipeline over the planner's other cache settings
        params = replace(
            self.cache_params, algorithm=config.algorithm, prefetch_pipeline=config.prefetch_pipeline
        )
        if scaleup:
            given = constraints(self._with_user_load_factors(smallest_load_factors(caches)), params)
        else:
            given = constraints({}, params, torchrec_choice=True)
        try:
            planned = plan_with_sharding(
                config.sharding,
                given,
                list(given),
                lambda limited: self._torchrec_plan(module, sharders, limited, scaleup),
                lambda planned: offloaded_tables(planned[0]),
                unconstrained.get(replace(config, sharding="any")),
            )
        except PlannerError as error:
            if config.sharding == "any":
                unconstrained[config] = error
            raise
        if config.sharding == "any":
            unconstrained[config] = planned
        return planned

    def _report(
        self,
        options: list[ShardingOption],
        enumerator: OrderedEnumerator,
        fae_path: str,
        hot_set: HotSet,
        pooling: StepPooling,
        sizing: Sizing,
    ) -> FAEPlanReport:
        cold_step: dict[str, np.ndarray] = {HOT: pooling.cold_step_hot, COLD: pooling.cold_step_cold}
        hot_step: dict[str, np.ndarray] = {HOT: pooling.hot_step}
        config = sizing[1].get("config")
        return FAEPlanReport.from_options(
            options,
            fae_path,
            self.topology,
            hot_budget_bytes=hot_set.hot_bytes(self.optimizer_class),
            hot_input_share=pooling.hot_input_share,
            load_factors=sizing[0],
            torchrec_config=config.name if config else None,
            hot_step=self._price(enumerator, options, fae_path, hot_step),
            cold_step=self._price(enumerator, options, fae_path, cold_step),
            cold_step_in_hbm=self._price(enumerator, in_hbm(options), fae_path, cold_step, transfers=False),
            pooling=pooling,
        )

    def _price(
        self,
        enumerator: OrderedEnumerator,
        options: list[ShardingOption],
        fae_path: str,
        pooling: Mapping[str, np.ndarray],
        *,
        transfers: bool = True,
    ) -> float:
        """TorchRec's predicted step of the plan ``options`` with each FAE part at ``pooling[part]``
        (ids per input and feature, per table); parts missing from ``pooling`` do not run. Without
        ``transfers`` no shard prefetches (a cache's, or a planned cold tier's copies)."""
        parts = part_paths(fae_path)
        table_index = {c.name: t for t, c in enumerate(self.stats.tables)}
        priced = []
        for option in options:
            part = parts.get(option.path)
            if part is not None and part not in pooling:
                continue
            option = deepcopy(option)
            if part is not None:
                t = table_index[option.name.removesuffix(f"_{part}")]
                option.input_lengths = [float(pooling[part][t])] * len(option.input_lengths)
            priced.append(option)
        enumerator.populate_estimates(priced)
        if not transfers:
            for shard in (shard for option in priced for shard in option.shards):
                shard.perf = replace(shard.perf, prefetch_compute=0.0)
        return RankTotals.of(priced, self.topology.world_size).step

    def _smaller_sizings(
        self, cold: ColdCacheSizing, cache_budget: float, full: dict[str, float]
    ) -> list[dict[str, float]]:
        """Cold load factors from ``SMALLER_CACHE_SHARES`` of the cache budget, largest caches first,
        until every cache is at its floor: TorchRec's storage estimates add input and output buffers
        that the sizing does not count, and a small cache that fits beats none."""
        sizings = [full]
        for share in SMALLER_CACHE_SHARES:
            load_factors = self._load_factors(cold, share * cache_budget, whole_parts=False)
            if load_factors == sizings[-1]:
                break
            sizings.append(load_factors)
        return sizings[1:]

    def _load_factors(
        self, cold: ColdCacheSizing, cache_budget: float, whole_parts: bool
    ) -> dict[str, float]:
        """Cold tables' load factors (a user's load factor wins)."""
        return self._with_user_load_factors(cold.load_factors(cache_budget, whole_parts))

    def _with_user_load_factors(self, load_factors: dict[str, float]) -> dict[str, float]:
        """``load_factors`` with a user's load factor where the constraints give one."""
        for name, constraint in (self.constraints or {}).items():
            if name in load_factors and constraint.cache_params and constraint.cache_params.load_factor:
                load_factors[name] = constraint.cache_params.load_factor
        return load_factors

    def device_memory(self, module: nn.Module) -> np.ndarray:
        """Per device, the memory TorchRec's storage reservation leaves for embeddings.

        Raises ``PlannerError`` (``topology too small: ...``) when the reservation takes it all.
        """
        kind = "hbm" if self.topology.compute_device == "cuda" else "ddr"
        try:
            reserved = default_reservation().reserve(
                self.topology, self.batch_size, module, get_default_sharders()
            )
        except PlannerError as error:
            cap = getattr(self.topology.devices[0].storage, kind)
            raise PlannerError(
                f"topology too small: TorchRec's reservations ({RESERVED_PERCENTAGE:.0%} of device memory, "
                f"the dense modules and the inputs of a batch of {self.batch_size} per rank) take more "
                f"than the {format_bytes(cap)} per device; nothing is left for embedding rows",
                error.error_type,
            ) from error
        return np.array([getattr(d.storage, kind) for d in reserved.devices], dtype=np.float64)

    def _smallest_storage(self, module: nn.Module, sharders: list, constraints: dict) -> float:
        """Device memory the plan needs at least: per table, its option using the least of it
        (TorchRec's own storage estimates), summed."""
        enumerator = OrderedEnumerator(self.topology, self.batch_size, constraints)
        kind = "hbm" if self.topology.compute_device == "cuda" else "ddr"
        smallest: dict[str, float] = {}
        for option in enumerator.enumerate(module, sharders):
            total = float(sum(getattr(shard.storage, kind) for shard in option.shards))
            smallest[option.fqn] = min(smallest.get(option.fqn, total), total)
        return sum(smallest.values())

    @staticmethod
    def _too_small_message(needed: float, memory: float, error: PlannerError) -> str:
        summary = (
            f"hot rows and the smallest cold caches need {format_bytes(needed)}, the devices offer "
            f"{format_bytes(memory)} after TorchRec's reservations"
        )
        if needed > memory:
            return f"topology too small: {summary}; missing {format_bytes(needed - memory)}"
        return f"no plan fits although {summary}: TorchRec could not place the shards\n{error}"

    def meta_module(
        self, hot_set: HotSet, cold_slots: Mapping[str, int] | None = None
    ) -> FAEEmbeddingBagCollection:
        """For dry runs: the statistics' tables split by ``hot_set`` on the meta device (the cold parts
        slot tables of ``cold_slots``, when given), with ``optimizer_class`` applied in backward so that
        its state counts in storage estimates."""
        module = FAEEmbeddingBagCollection(
            self.stats.tables, hot_set, device=torch.device("meta"), cold_slots=cold_slots
        )
        if self.optimizer_class is not None:
            apply_optimizer_in_backward(self.optimizer_class, module.parameters(), {"lr": 0.01})
        return module
