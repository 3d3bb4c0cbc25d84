"""``FAEShardingPlanner``: TorchRec's ``EmbeddingShardingPlanner`` driven by FAE access statistics.

The planner works on models whose embedding bags are a ``FAEEmbeddingBagCollection``. For the part
tables it writes ``ParameterConstraints`` (HBM kernels for hot rows, ``fused_uvm_caching`` with cache
statistics for cold rows, planned for TorchRec's prefetch pipeline unless told otherwise; CPU kernels on a
CPU topology), sizes the cold caches from the device memory TorchRec's storage reservation leaves, and
lets TorchRec's enumerator, proposers, partitioner and perf model do the rest: one run of TorchRec's planner
per hot set, whose ``SizingProposer`` tries smaller caches where larger ones do not place
(``planner.sizing_proposer``); with no hot rows TorchRec's own configurations
(``planner.torchrec_configs``) are candidates too.

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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeAlias

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PlannerError,
    Proposer,
    ShardingOption,
    Topology,
)
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan, ShardingPlanner
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from fae_torchrec.modules import FAEEmbeddingBagCollection, part_table_name
from fae_torchrec.stats import COLD, HOT, AccessStats, HotSet
from fae_torchrec.torchrec_compat import best_plan
from fae_torchrec.units import format_bytes
from planner.cache_sizing import ColdCacheSizing, smallest_load_factors
from planner.cache_statistics import AccessCacheStatistics
from planner.constraints import (
    StepPooling,
    check_cache_params,
    cold_cache_statistics,
    fae_constraints,
    merged_cache_params,
    step_pooling,
)
from planner.enumerator import OrderedEnumerator
from planner.report import FAEPlanReport, RankTotals, expected_step, in_hbm, part_paths
from planner.sizing_proposer import (
    SearchSpace,
    Sizing,
    SizingProposer,
    SizingSearch,
    cold_sizing_search,
    least_storage,
)
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
#: What the knob's plan at one budget came to: its report and sizing, or TorchRec's error.
BudgetOutcome: TypeAlias = tuple[FAEPlanReport, Sizing] | PlannerError
#: The work of the knob's plan at one budget: the seconds of each run of TorchRec's planner, the cold
#: sizings tried and whether each placed.
BudgetWork: TypeAlias = tuple[list[float], list[tuple[Sizing, bool]]]
#: A plan of one sizing: TorchRec's plan, its sharding options, the enumerator that priced them.
TorchRecPlan: TypeAlias = tuple[ShardingPlan, list[ShardingOption], Enumerator]
#: A candidate plan of a hot set: TorchRec's plan of one sizing, and that sizing.
Candidate: TypeAlias = tuple[ShardingPlan, list[ShardingOption], Enumerator, Sizing]


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


def _plan_in_worker(budget: float) -> tuple[BudgetWork, BudgetOutcome]:
    """The inherited planner's plan at ``budget`` (nothing of the planner is pickled per task)."""
    assert _worker_planner is not None  # set by _start_worker
    return _worker_planner._plan_budget(budget)


def _placed(
    failures: list[PlannerError], plan: Callable[[], TorchRecPlan], sizing: Sizing
) -> list[Candidate]:
    """``plan()`` as a candidate of ``sizing``, or none where TorchRec raises (kept in ``failures``)."""
    try:
        return [(*plan(), sizing)]
    except PlannerError as error:
        failures.append(error)
        return []


def _part_poolings(pooling: StepPooling) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per part, its pooling in a hot step (the hot part only) and in a cold step (both parts)."""
    return {HOT: pooling.hot_step}, {HOT: pooling.cold_step_hot, COLD: pooling.cold_step_cold}


@dataclass
class ColdSetting:
    """What the plans of one hot set start from: its steps' pooling, its cold caches' statistics, the
    device memory TorchRec's reservation leaves and the cold parts' share of it, FAE's ranking of its
    cold rows, and what ``fae_constraints`` needs besides a sizing."""

    stats: AccessStats
    hot_set: HotSet
    compute_device: str
    user: dict[str, ParameterConstraints] | None
    cache_params: CacheParams
    pooling: StepPooling
    caches: dict[str, AccessCacheStatistics]
    memory: np.ndarray
    cache_budget: float
    cold: ColdCacheSizing
    #: The plans (or errors) of TorchRec's configurations with TorchRec's choice of sharding types.
    unconstrained: dict[TorchRecConfig, tuple | PlannerError] = field(default_factory=dict)

    def constraints(
        self, load_factors: dict[str, float], cache_params: CacheParams | None = None, **options: bool
    ) -> dict[str, ParameterConstraints]:
        """``fae_constraints`` of the cold sizing ``load_factors`` with kernel ``options``."""
        sized = {name: (load_factors.get(name), cache) for name, cache in self.caches.items()}
        return fae_constraints(
            self.stats,
            self.hot_set,
            self.compute_device,
            sized,
            self.user,
            pooling=self.pooling,
            cache_params=cache_params or self.cache_params,
            **options,
        )


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
        #: once per budget, and without hot rows once or twice per TorchRec configuration): where
        #: planning time goes.
        self.torchrec_runs: list[float] = []
        #: The cold sizings FAE's search has tried so far (``SizingProposer``), and whether TorchRec
        #: placed each: those ``fits`` rules out take no proposal.
        self.sizings_tried: list[tuple[Sizing, bool]] = []
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
        for budget, ((runs, sizings), outcome) in zip(budgets, self._plan_budgets(budgets), strict=True):
            self.torchrec_runs += runs
            self.sizings_tried += sizings
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

    def _plan_budgets(self, budgets: list[float]) -> Iterator[tuple[BudgetWork, BudgetOutcome]]:
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

    def _plan_budget(self, budget: float) -> tuple[BudgetWork, BudgetOutcome]:
        """The work of the knob's plan at ``budget`` (taken out of ``torchrec_runs`` and
        ``sizings_tried`` again) and what the plan came to."""
        hot_set = self._ranking.hot_set(int(budget))
        start, tried = len(self.torchrec_runs), len(self.sizings_tried)
        try:
            _, report, sizing = self._plan(self.meta_module(hot_set), hot_set, get_default_sharders())
            outcome: BudgetOutcome = (report, sizing)
        except PlannerError as error:
            outcome = error
        runs, sizings = self.torchrec_runs[start:], self.sizings_tried[tried:]
        del self.torchrec_runs[start:], self.sizings_tried[tried:]
        return (runs, sizings), outcome

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
        places, and on a CPU topology, where no cache is sized (the plan's own search is the one the meta
        module's would be, a run of TorchRec's planner less)."""
        chosen = self._chosen
        if chosen and all(map(np.array_equal, chosen[0].hot_ids, hot_set.hot_ids)):
            return chosen[1]
        if self.topology.compute_device != "cuda":
            return None
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

    def _cold_setting(self, module: nn.Module, hot_set: HotSet) -> ColdSetting:
        """What the plans of ``module`` split by ``hot_set`` start from; the cold parts may take
        ``CACHE_SHARE`` of what the hot rows leave of ``device_memory``."""
        world = self.topology.world_size
        pooling = step_pooling(self.stats, hot_set)
        caches = cold_cache_statistics(self.stats, hot_set, self.batch_size * world, pooling)
        memory = self.device_memory(module)
        left = max(float(memory.sum()) - hot_set.hot_bytes(self.optimizer_class), 0.0)
        return ColdSetting(
            self.stats,
            hot_set,
            self.topology.compute_device,
            self.constraints,
            self.cache_params,
            pooling,
            caches,
            memory,
            CACHE_SHARE * left,
            ColdCacheSizing(self.stats, hot_set, caches, self.optimizer_class),
        )

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

        Else FAE's cold sizings (``cold_sizing_search``: whole cold parts in HBM, caches from the whole
        budget, the largest smaller caches that place, ``fused_uvm``) are searched in one run of TorchRec's
        planner (``SizingProposer``), and without hot rows TorchRec's own configurations are candidates
        too (``_torchrec_configs``: on CUDA its default and scale-up planners, with every sharding choice
        of ``planner.torchrec_configs``, for the cold caches' pipeline). Of the plans placed, the one
        TorchRec's perf model prices fastest for FAE's steps is kept: so the knob, which always tries
        the empty hot set, finds a plan wherever TorchRec's planner does, and never predicts a slower
        one than those configurations; the report names the configuration where it keeps one.

        A ``known`` sizing (the knob's, for the hot set it chose) is planned alone when TorchRec places
        it: ``plan`` then repeats none of the knob's search (the model's dense part only takes memory).
        """
        setting = self._cold_setting(module, hot_set)
        failures: list[PlannerError] = []
        candidates = self._candidates(module, sharders, setting, known, slots, failures)
        if not candidates:
            raise self._no_plan(module, sharders, setting, slots, failures[-1]) from failures[-1]
        steps = [
            self._steps(options, enumerator, fae_path, setting.pooling)
            for _, options, enumerator, _ in candidates
        ]
        share = setting.pooling.hot_input_share
        best = min(range(len(candidates)), key=lambda i: expected_step(share, *steps[i]))
        plan, options, enumerator, sized = candidates[best]
        report = self._report(options, enumerator, fae_path, hot_set, setting.pooling, sized, steps[best])
        return plan, report, sized

    def _candidates(
        self,
        module: nn.Module,
        sharders: list,
        setting: ColdSetting,
        known: Sizing | None,
        slots: bool,
        failures: list[PlannerError],
    ) -> list[Candidate]:
        """The plans ``_plan`` chooses from: of a planned cold tier's slot tables, or of FAE's cold
        sizings and, without hot rows, of TorchRec's configurations; the ``known`` sizing's alone where
        it places. TorchRec's errors go to ``failures``."""
        if slots:
            constraints = setting.constraints({}, slots=True)
            plan = partial(self._torchrec_plan, module, sharders, constraints, copied=self._slot_copies())
            return _placed(failures, plan, ({}, {"slots": True}))
        config = known[1].get("config") if known else None
        if config is not None:  # the knob kept a TorchRec configuration's plan
            plan = partial(self._plan_config, module, sharders, config, setting)
            candidates = _placed(failures, plan, ({}, {"config": config}))
            if candidates:
                return candidates
            known = None
        candidates = self._sized_plans(module, sharders, setting, known, failures)
        if known is not None and candidates and candidates[0][3] is known:
            return candidates
        for config in self._torchrec_configs() if not setting.hot_set.total_hot else ():
            plan = partial(self._plan_config, module, sharders, config, setting)
            candidates += _placed(failures, plan, ({}, {"config": config}))
        return candidates

    def _no_plan(
        self, module: nn.Module, sharders: list, setting: ColdSetting, slots: bool, failure: PlannerError
    ) -> PlannerError:
        """The error where nothing places: how much device memory the smallest plan needs against what
        the devices offer, or TorchRec's last ``failure`` where that is not the reason."""
        full = self._load_factors(setting.cold, setting.cache_budget, whole_parts=False)
        smallest = setting.constraints({}, slots=True) if slots else setting.constraints(full, uncached=True)
        needed = self._smallest_storage(module, sharders, smallest)
        message = self._too_small_message(needed, float(setting.memory.sum()), failure)
        return PlannerError(message, failure.error_type)

    def _sized_plans(
        self,
        module: nn.Module,
        sharders: list,
        setting: ColdSetting,
        known: Sizing | None,
        failures: list[PlannerError],
    ) -> list[Candidate]:
        """The best plan of each cold sizing TorchRec places, by TorchRec's rating: FAE's search of
        sizings run by a ``SizingProposer`` inside one run of TorchRec's planner."""
        search = self._sizing_search(setting, known)
        first = next(search)
        constraints = setting.constraints(first[0], **first[1])

        def enumerator(sizing: Sizing, storage_only: bool = False) -> OrderedEnumerator:
            return self._enumerator(setting.constraints(sizing[0], **sizing[1]), storage_only=storage_only)

        def search_space(sizing: Sizing) -> SearchSpace:
            priced = enumerator(sizing)
            return priced.enumerate(module, sharders), priced

        try:  # the planner's own reservation, which raises where nothing is left
            capacity = default_reservation().reserve(
                self.topology, self.batch_size, module, sharders, constraints
            )
        except PlannerError as error:
            failures.append(error)
            return []
        proposer = SizingProposer(
            search,
            first,
            lambda sizing: enumerator(sizing, storage_only=True).enumerate(module, sharders),
            search_space,
            capacity,
        )
        try:
            self._torchrec_plan(
                module, sharders, constraints, proposer=proposer, enumerator=enumerator(first, True)
            )
        except PlannerError as error:
            failures.append(error)
        self.sizings_tried += proposer.tried
        return [
            (to_sharding_plan(placed.plan, self.topology), placed.plan, placed.enumerator, placed.sizing)
            for placed in proposer.placed
        ]

    def _sizing_search(self, setting: ColdSetting, known: Sizing | None) -> SizingSearch:
        """``cold_sizing_search`` over the sizings of ``setting``'s cache budget."""
        cold, budget = setting.cold, setting.cache_budget
        full = self._load_factors(cold, budget, whole_parts=False)
        whole = self._load_factors(cold, budget, whole_parts=True)
        smaller = self._smaller_sizings(cold, budget, full)
        return cold_sizing_search(known, whole, full, smaller, cold.asks_at_least)

    def _enumerator(
        self,
        constraints: dict[str, ParameterConstraints],
        copied: dict[str, float] | None = None,
        storage_only: bool = False,
    ) -> OrderedEnumerator:
        """The enumerator of a run of TorchRec's planner with ``constraints``: TorchRec's estimators,
        and with ``copied``, slot tables' copies per cold step priced by ``SlotCopyEstimator``; with
        ``storage_only``, TorchRec's storage estimator alone (the options' perf stays unset)."""
        estimators = None
        if storage_only:
            estimators = [EmbeddingStorageEstimator(self.topology, constraints)]
        elif copied:  # TorchRec's own estimators, then the copies on the perfs they set
            estimators = [
                EmbeddingPerfEstimator(self.topology, constraints),
                EmbeddingStorageEstimator(self.topology, constraints),
                SlotCopyEstimator(self.topology, constraints, copied),
            ]
        return OrderedEnumerator(self.topology, self.batch_size, constraints, estimator=estimators)

    def _torchrec_plan(
        self,
        module: nn.Module,
        sharders: list,
        constraints: dict[str, ParameterConstraints],
        scaleup: bool = False,
        copied: dict[str, float] | None = None,
        proposer: Proposer | None = None,
        enumerator: Enumerator | None = None,
    ) -> TorchRecPlan:
        """TorchRec's ``EmbeddingShardingPlanner`` run with ``constraints`` (and with ``scaleup``, its
        ``EmbeddingOffloadScaleupProposer`` growing the caches; with ``copied``, see ``_enumerator``; with
        ``proposer`` and ``enumerator``, those): the plan, its sharding options and the enumerator that
        priced them. Raises TorchRec's ``PlannerError``."""
        enumerator = enumerator or self._enumerator(constraints, copied)
        if scaleup:
            proposer = EmbeddingOffloadScaleupProposer()
        planner = EmbeddingShardingPlanner(
            topology=self.topology,
            batch_size=self.batch_size,
            constraints=constraints,
            enumerator=enumerator,
            storage_reservation=default_reservation(),
            proposer=proposer,
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
        self, module: nn.Module, sharders: list, config: TorchRecConfig, setting: ColdSetting
    ) -> TorchRecPlan:
        """The parts planned as TorchRec's ``config`` plans the unsplit tables: its default planner's
        own choice of kernels, sharding types and caches, or its scale-up caches (the smallest caches,
        grown by ``EmbeddingOffloadScaleupProposer``, as ``planner.baseline.scaleup_planner`` plans
        them), with the configuration's ``CacheParams`` and sharding types. ``setting.unconstrained``
        keeps the plans (or errors) made with TorchRec's choice of sharding types, for the
        configurations that start from one."""
        scaleup = config.planner == "scale-up"
        # the configuration's algorithm and pipeline over the planner's other cache settings
        params = replace(
            self.cache_params, algorithm=config.algorithm, prefetch_pipeline=config.prefetch_pipeline
        )
        if scaleup:
            smallest = self._with_user_load_factors(smallest_load_factors(setting.caches))
            given = setting.constraints(smallest, params)
        else:
            given = setting.constraints({}, params, torchrec_choice=True)
        unconstrained = setting.unconstrained
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
        enumerator: Enumerator,
        fae_path: str,
        hot_set: HotSet,
        pooling: StepPooling,
        sizing: Sizing,
        steps: tuple[float, float],
    ) -> FAEPlanReport:
        """The report of a plan whose hot and cold ``steps`` (``_steps``) are priced."""
        _, cold_step = _part_poolings(pooling)
        config = sizing[1].get("config")
        return FAEPlanReport.from_options(
            options,
            fae_path,
            self.topology,
            hot_budget_bytes=hot_set.hot_bytes(self.optimizer_class),
            hot_input_share=pooling.hot_input_share,
            load_factors=sizing[0],
            torchrec_config=config.name if config else None,
            hot_step=steps[0],
            cold_step=steps[1],
            cold_step_in_hbm=self._price(enumerator, in_hbm(options), fae_path, cold_step, transfers=False),
            pooling=pooling,
        )

    def _steps(
        self, options: list[ShardingOption], enumerator: Enumerator, fae_path: str, pooling: StepPooling
    ) -> tuple[float, float]:
        """The plan's predicted hot step (the hot part at the pooling of entirely-hot batches, no cold
        part) and cold step (both parts at the pooling of the other inputs' batches)."""
        hot_step, cold_step = _part_poolings(pooling)
        return (
            self._price(enumerator, options, fae_path, hot_step),
            self._price(enumerator, options, fae_path, cold_step),
        )

    def _price(
        self,
        enumerator: Enumerator,
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
        (TorchRec's own storage estimates, without its perf estimates), summed."""
        options = self._enumerator(constraints, storage_only=True).enumerate(module, sharders)
        kind = 0 if self.topology.compute_device == "cuda" else 1  # HBM, or DDR on a CPU topology
        return float(sum(least[kind] for least in least_storage(options).values()))

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
