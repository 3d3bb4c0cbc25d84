"""The planned cold tier: a cold part whose rows live in host memory and whose device tables are plain
slots, filled ahead of each cold step by the slot plan of the epoch's schedule (issue 48).

A split module built with ``cold_slots`` gives each cold table ``S`` slots in place of its cold rows;
planned with the ``fused`` kernel, a slot table is an ordinary FBGEMM table in HBM: no cache lookup, no
LRU, no locking. :class:`PlannedColdTier` keeps the cold rows and their optimizer state in host memory
and, because the router fixes an epoch's steps before training, plans for every cold step which rows
sit in which slots (``plan_slots``: Belady's rule over the whole epoch or a look-ahead window). The
router routes each cold step's batch through :meth:`PlannedColdTier.route`, which rewrites its cold
ids to slot ids and queues the copies of the cold step ``ahead`` steps later; just before the cold
part's lookup of that step (a forward pre-hook, so TorchRec's train pipelines need no change) the
queued copies are issued (``CopyEngine``: inline on CPU, on a side stream on CUDA): evicted rows are
written back with their optimizer state, then the later step's new rows copied in. Hot steps skip the
cold part and copy nothing. The next epoch's plans can be made in a background thread during the
epoch before (:meth:`PlannedColdTier.plan_ahead`).

Every value is copied, none recomputed, and FBGEMM's fused optimizers update only the rows a batch
looks up, so the trained model is the one the cold rows would give in a table of their own.

Each row-wise shard of a slot table (the whole table when it is table-wise) is a slot group: it holds
a fixed share of the table's cold rows, in proportion to its slots. Each rank plans and copies the
groups of the shards it holds, and gathers the others' rows of each step with their slots (the remap of
its batches needs every group's). A rank's groups whose slots lie one after another
in memory (FBGEMM keeps the tables of one kernel in one buffer) form a run: a step's copies of a run
are one index operation per tensor and direction, not one per table. On CUDA the host rows are pinned.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from itertools import pairwise

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import trace
from fae_torchrec.collectives import all_gathered
from fae_torchrec.modules.fae_embedding_bag import (
    SLOT_KERNEL,
    SLOT_SHARDING_TYPES,
    FAEEmbeddingBagCollection,
    part_key,
    part_table_name,
)
from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.modules.state import assemble_full_tensor, initial_blocks
from fae_torchrec.stats.hot_set import COLD, HOT, HotSet
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.copy_engine import CopyEngine
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.schedule import Step
from fae_torchrec.train.slot_plan import SlotPlan, copied_before, min_slots, plan_slots
from fae_torchrec.train.step import find_fae_module


@dataclass(frozen=True)
class SlotGroup:
    """Slots ``slot_start:slot_stop`` of cold table ``table`` (original name), one row-wise shard of its
    slot table, hold cold rows ``row_start:row_stop`` of it (ids of the cold part)."""

    table: str
    slot_start: int
    slot_stop: int
    row_start: int
    row_stop: int

    @property
    def num_slots(self) -> int:
        return self.slot_stop - self.slot_start


@dataclass
class _Run:
    """Slot groups of this rank whose device slots lie one after another in memory (FBGEMM keeps the
    tables of one kernel in one buffer), so that a step's copies of all of them are one index operation
    per tensor and direction: their slots as one view per name (weights, and each per-row optimizer
    state), their rows in host memory one after another likewise, which host row of the run each slot
    holds (-1: none), and each group's first slot and first row in the run (a last entry: the run's
    slots and rows) and its rows' initial optimizer state (the slots' when the tier was made)."""

    groups: list[SlotGroup]
    slot_starts: np.ndarray
    row_starts: np.ndarray
    slots: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]
    held: np.ndarray
    initial: list[dict[str, torch.Tensor]]

    def group_rows(self, index: int, name: str) -> torch.Tensor:
        """The host rows of the run's group ``index`` (a view), of weights or optimizer state ``name``."""
        return self.rows[name][self.row_starts[index] : self.row_starts[index + 1]]

    def group_held(self, index: int) -> np.ndarray:
        """The row of its own group that each slot of group ``index`` holds (-1: none)."""
        held = self.held[self.slot_starts[index] : self.slot_starts[index + 1]]
        return np.where(held >= 0, held - self.row_starts[index], -1)


@dataclass(frozen=True)
class _StepRows:
    """Every slot group's rows of each cold step as row keys (a table's offset + its cold row) and their
    slot keys (a table's offset in all slots + its slot), step ``s``'s at ``bounds[s]:bounds[s + 1]``."""

    keys: np.ndarray
    slots: np.ndarray
    bounds: np.ndarray


@dataclass(frozen=True)
class _RunCopies:
    """A run's copies of every cold step of an epoch's plans, in its slots and host rows: before step
    ``s``, the slots ``evicted_slots`` and their rows ``evicted_rows`` at ``evicted_bounds[s]:[s + 1]``
    go back, then the rows ``loaded_rows`` come into ``loaded_slots`` at ``loaded_bounds[s]:[s + 1]``."""

    evicted_slots: np.ndarray
    evicted_rows: np.ndarray
    evicted_bounds: np.ndarray
    loaded_rows: np.ndarray
    loaded_slots: np.ndarray
    loaded_bounds: np.ndarray

    def moves(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step ``step``'s evicted slots, their rows, loaded rows and their slots."""
        evicted = slice(self.evicted_bounds[step], self.evicted_bounds[step + 1])
        loaded = slice(self.loaded_bounds[step], self.loaded_bounds[step + 1])
        return (
            self.evicted_slots[evicted],
            self.evicted_rows[evicted],
            self.loaded_rows[loaded],
            self.loaded_slots[loaded],
        )


@dataclass(frozen=True)
class _Copies:
    """The copies before cold step ``step``: whether every held row goes back first (a new epoch's plan
    starts from empty slots), then for each of the steps ``targets`` (``step`` and the steps ``ahead``,
    ``slot_plan.copied_before``), per run, (evicted slots, their rows, loaded rows, their slots)."""

    step: int
    flush_first: bool
    targets: tuple[int, ...]
    moves: tuple[tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...], ...]


@dataclass(frozen=True)
class _Planned:
    """An epoch's plans: every group's slot plan, every group's rows of each step with their slots (for
    the remap), and each of this rank's runs' copies."""

    plans: dict[SlotGroup, SlotPlan]
    step_rows: _StepRows
    copies: list[_RunCopies]


class PlannedColdTier:
    """The host rows, slot plans and copies of a model's planned cold tier.

    Args:
        model: a DMP model holding an ``FAEEmbeddingBagCollection`` built with ``cold_slots``, its slot
            tables planned with the ``fused`` kernel, table-wise or row-wise, with a fused optimizer.
        window: look-ahead of the slot plans in cold steps (None: the whole epoch).
        ahead: cold steps before its own that a step's copies run (``plan_slots``' ``ahead``): they
            overlap the steps between (on CUDA on a side stream, ``CopyEngine``), and the slots hold
            the rows of ``ahead + 1`` cold steps at once.

    Set the cold rows' initial weights (:meth:`load_initial_tables`, or :meth:`load_ebc_state_dict`),
    give the tier to the router (``BatchRouter(..., cold_tier=tier)``), evaluate within
    :meth:`evaluating`, and :meth:`flush` before reading the cold rows (:meth:`gather_cold_state`).
    ``rows_in``/``rows_out`` and ``bytes_in``/``bytes_out`` count this rank's copies (weights and
    optimizer state) host to device and back; ``plan_seconds`` the time of :meth:`plan_epoch`,
    ``route_seconds`` that of :meth:`route` (the remap to slots and the plans' copies looked up),
    ``plan_ahead_seconds`` that of the plans made ahead in a background thread (:meth:`plan_ahead`),
    ``copy_seconds`` that of the ``copied_steps`` steps' copies (evaluations' aside), of which
    ``write_back_seconds`` issuing the write-backs and ``load_seconds`` the loads. Each rank plans
    the groups it holds, reading into memory the part ids of the epoch's cold steps (8 bytes each) and
    a step and a row per cold id of its tables; every rank then holds every group's rows of each step
    with their slots (16 bytes each), gathered from the others, to remap its own batches.
    """

    def __init__(self, model: nn.Module, window: int | None = None, ahead: int = 0) -> None:
        fae = find_fae_module(model)
        if fae is None or fae.cold_slots is None or fae.cold is None:
            raise ValueError(
                "a planned cold tier needs an FAEEmbeddingBagCollection built with cold_slots, with cold rows"
            )
        if ahead < 0:
            raise ValueError(f"ahead must be at least 0 cold steps, got {ahead}")
        self.fae, self.window, self.ahead = fae, window, ahead
        #: Slots per cold table.
        self.slots: dict[str, int] = fae.cold_slots
        self.groups = _slot_groups(fae, fae.cold, self.slots)
        # every cold row as one key (its table's offset + its row): the groups' rows in ascending ranges
        starts = np.cumsum([0, *(fae.cold_rows[t] for t in fae.cold_slots)])
        self._offsets = dict(zip(fae.cold_slots, starts[:-1].tolist(), strict=True))
        # every slot as one key too (its table's offset in all slots + its slot)
        slot_starts = np.cumsum([0, *fae.cold_slots.values()])
        self._slot_offsets = dict(zip(fae.cold_slots, slot_starts[:-1].tolist(), strict=True))
        # per cold row key, its slot key in the batch last remapped (4 bytes each, stale for other rows);
        # per slot key, the row key it held there (so that a stale slot is told from a held one)
        self._slot_of = np.zeros(starts[-1], dtype=np.int32)
        self._key_at = np.full(slot_starts[-1], -1, dtype=np.int64)
        self._runs = _runs(fae.cold, self.groups)
        self._held = [group for run in self._runs for group in run.groups]  # the groups planned here
        # each rank plans the groups it holds and gathers the others' step rows over a process group of
        # the plans' own, from the planning thread alone: every rank plans the same epochs in one order
        self._planning_group = (
            dist.new_group(backend="gloo") if dist.is_initialized() and dist.get_world_size() > 1 else None
        )
        devices = [run.slots["weight"].device for run in self._runs]
        self._engine = CopyEngine(devices[0] if devices else torch.device("cpu"))
        self.reset_rows()
        self._features = {
            f: c.name
            for c in fae.embedding_bag_configs()
            for f in c.feature_names
            if c.name in fae.cold_slots
        }  # the table of each feature the tier's tables read
        #: The current epoch's slot plan of each group this rank holds.
        self.plans: dict[SlotGroup, SlotPlan] = {}
        self._remap = _StepRows(*(np.zeros(n, dtype=np.int64) for n in (0, 0, 1)))  # of self.plans
        self._copies: list[_RunCopies] = []  # each run's copies by self.plans
        self._num_steps = self._routed = 0  # cold steps of the epoch planned, and routed so far
        self._flush_next = False  # the next routed step writes every held row back first
        self._queue: deque[_Copies] = deque()
        self._evaluating = False
        self._resumed: int | None = None  # the cold steps of the epoch a loaded state was saved after
        self.rows_in = self.rows_out = self.bytes_in = self.bytes_out = 0
        self.plan_seconds = self.route_seconds = self.copy_seconds = self.plan_ahead_seconds = 0.0
        self.write_back_seconds = self.load_seconds = 0.0
        self._planner: ThreadPoolExecutor | None = None  # makes every plan (plan_epoch, plan_ahead)
        self._closed = False
        # an epoch's plans made ahead: its partition, its key and the plans to come
        self._made_ahead: tuple[HotColdPartition, Hashable, Future] | None = None
        self.copied_steps = 0
        fae.cold.register_forward_pre_hook(self._before_lookup)

    @property
    def keys(self) -> dict[str, str]:
        """The cold part's weights in the split module's state dict (its slot tables), by their table."""
        return {part_key(t, COLD): t for t in self.slots}

    def load_ebc_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Set the cold rows this rank holds from weights in the original layout (a plain EBC's
        ``state_dict``), their optimizer state to the slots' initial one; the slots are emptied."""
        parts = self.fae.split_state(state)
        self.load_cold_state({"weight": {key: parts[key] for key in self.keys}})

    def load_cold_state(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Set the cold rows this rank holds from full tensors of every cold table's rows, by name and
        key as :meth:`gather_cold_state` gives them (an optimizer state left out: the slots' initial
        one); the slots are emptied."""
        self.reset_rows()
        for name, tensors in state.items():
            for key, table in self.keys.items():
                self.set_rows(table, 0, tensors[key], name)

    def load_initial_tables(self, tables: Sequence[EmbeddingBagConfig], seed: int) -> None:
        """Set the cold rows this rank holds to their initial weights, drawn a block at a time as
        ``load_initial_tables`` draws every other row (the same tables as the baseline's), their
        optimizer state to the slots' initial one; the slots are emptied."""
        self.reset_rows()
        for config, start, rows in initial_blocks(tables, seed):
            for name, first, chosen in self.fae.row_ranges(config.name, start, start + len(rows)):
                if name.startswith(COLD):
                    self.set_rows(config.name, first, rows[chosen])

    def reset_rows(self) -> None:
        """Empty the slots; every host row's optimizer state the slots' initial one."""
        self._engine.settle()
        with torch.no_grad():
            for run in self._runs:
                for index, initial in enumerate(run.initial):
                    for name, value in initial.items():
                        rows = run.group_rows(index, name)
                        rows.copy_(value.expand_as(rows))
                run.held[:] = -1

    def set_rows(self, table: str, first: int, rows: torch.Tensor, name: str = "weight") -> None:
        """Set cold rows ``first:first + len(rows)`` of ``table`` (their weights, or the optimizer state
        ``name``), those in this rank's groups."""
        with torch.no_grad():
            for run, index, group in self._mine():
                begin, end = max(first, group.row_start), min(first + len(rows), group.row_stop)
                if group.table == table and begin < end:
                    run.group_rows(index, name)[begin - group.row_start : end - group.row_start] = rows[
                        begin - first : end - first
                    ]

    def held_rows(self) -> Iterator[tuple[str, int, dict[str, torch.Tensor]]]:
        """This rank's host rows (:meth:`flush` first), a slot group at a time: its table, its first
        cold row and, per name (weights, and each per-row optimizer state), its rows (views)."""
        for run, index, group in self._mine():
            yield group.table, group.row_start, {name: run.group_rows(index, name) for name in run.rows}

    def _mine(self) -> Iterator[tuple[_Run, int, SlotGroup]]:
        """This rank's slot groups: each one's run, its index in the run, and the group."""
        for run in self._runs:
            for index, group in enumerate(run.groups):
                yield run, index, group

    def plan_epoch(
        self,
        partition: HotColdPartition,
        cold_steps: Sequence[Step],
        start: int = 0,
        *,
        key: Hashable | None = None,
    ) -> None:
        """Plan the slots of every group over ``cold_steps`` (an epoch's cold steps of ``partition``, in
        order, as every rank schedules them; a collective): the rows of a step are those of every rank's
        inputs (each rank reads those of its groups' tables from the partition). The rows held from an
        earlier epoch are written back before the first of them. ``start``: the cold steps already
        trained, when resuming mid-epoch from a state (:meth:`load_state_dict`) saved after them.
        ``key``: the epoch's name, as :meth:`plan_ahead` was given it, whose plans, made ahead, are
        taken. ``ValueError`` on every rank where a group's slots are too few for its steps."""
        if start and self._resumed != start:
            raise ValueError(
                f"resuming at cold step {start} of the epoch: load the tier's state saved there first "
                f"(the loaded one: {self._resumed})"
            )
        if partition.hot_set_digest != self.fae.hot_set_digest:
            raise ValueError("the partition was made with another hot set than the model's split module")
        started = time.perf_counter()
        made, self._made_ahead = self._made_ahead, None
        if made is not None and made[0] is partition and key is not None and made[1] == key:
            planned = made[2].result()
        else:
            planned = self._plans_thread().submit(self._planned, partition, list(cold_steps)).result()
        self.plans, self._remap, self._copies = planned.plans, planned.step_rows, planned.copies
        self._num_steps, self._routed = len(cold_steps), start
        self._engine.forget()
        # rows an earlier epoch left in the slots (none: nothing to write); mid-epoch, the plan's own
        self._flush_next = not start
        self._resumed = None
        self.plan_seconds += time.perf_counter() - started

    def plan_ahead(self, partition: HotColdPartition, cold_steps: Sequence[Step], key: Hashable) -> None:
        """Plan another epoch's slots (as :meth:`plan_epoch` would) in a background thread, during the
        epoch before it: ``plan_epoch(..., key=key)`` takes them. The thread's time goes to
        ``plan_ahead_seconds``; the two epochs' plans are held at once while it runs. Every rank calls
        it alike (its plans gather the ranks' step rows)."""
        self._made_ahead = (
            partition,
            key,
            self._plans_thread().submit(self._plans_ahead, partition, list(cold_steps)),
        )

    def close(self) -> None:
        """Stop planning (a plan made ahead is waited for and dropped) and free the process group of the
        plans: on every rank, when the tier is done with (a re-plan's new model has its own)."""
        if self._planner is not None:
            self._planner.shutdown(wait=True)
        self._planner, self._made_ahead, self._closed = None, None, True
        if self._planning_group is not None:
            dist.destroy_process_group(self._planning_group)
            self._planning_group = None

    def _plans_thread(self) -> ThreadPoolExecutor:
        """The one thread that makes the plans: their collectives run in the order every rank asks."""
        if self._closed:
            raise ValueError("the planned cold tier was closed: it plans no more epochs")
        if self._planner is None:
            self._planner = ThreadPoolExecutor(1, thread_name_prefix="fae-slot-plans")
        return self._planner

    def _plans_ahead(self, partition: HotColdPartition, cold_steps: list[Step]) -> _Planned:
        started = time.perf_counter()
        try:
            return self._planned(partition, cold_steps)
        finally:
            self.plan_ahead_seconds += time.perf_counter() - started

    def _planned(self, partition: HotColdPartition, cold_steps: Sequence[Step]) -> _Planned:
        """The slot plans over ``cold_steps`` of ``partition`` of the groups this rank holds and each
        run's copies; every group's rows of each step as row keys with their slots, step after step
        (one slice a step), gathered from the ranks holding them (a collective). ``ValueError`` on every
        rank where any rank's plan failed."""
        problem, plans = None, {}
        try:
            plans = self._plans(partition, cold_steps)
        except ValueError as error:
            problem = str(error)
        held = [g for g in self._held if g in plans]
        (keys, slots), bounds = _step_major(
            [np.diff(plans[g].bounds) for g in held],
            [
                [plans[g].rows + self._offsets[g.table] + g.row_start for g in held],
                [plans[g].slots + self._slot_offsets[g.table] + g.slot_start for g in held],
            ],
            len(cold_steps),
        )
        if self._planning_group is not None:
            problems = all_gathered(problem, self._planning_group)
            problem = next((found for found in problems if found is not None), None)
        if problem is not None:
            raise ValueError(problem)
        if self._planning_group is not None:
            everyone = _all_gathered([np.diff(bounds), keys, slots], self._planning_group)
            (keys, slots), bounds = _step_major(
                [counts for counts, _, _ in everyone],
                [[k for _, k, _ in everyone], [s for _, _, s in everyone]],
                len(cold_steps),
            )
        return _Planned(
            plans, _StepRows(keys, slots, bounds), [_run_copies(run, plans) for run in self._runs]
        )

    def _plans(self, partition: HotColdPartition, cold_steps: Sequence[Step]) -> dict[SlotGroup, SlotPlan]:
        """The slot plans over ``cold_steps`` of ``partition`` of the groups this rank holds."""
        tables = {group.table for group in self._held}
        features = {feature: table for feature, table in self._features.items() if table in tables}
        ids = cold_step_rows(partition, cold_steps, features)
        bounds_of = np.arange(len(cold_steps) + 1)
        plans = {}
        for group in self._held:
            steps, rows = ids.get(group.table, (np.zeros(0, dtype=np.int64),) * 2)
            inside = (rows >= group.row_start) & (rows < group.row_stop)
            steps, rows = steps[inside], rows[inside]
            try:
                plan = plan_slots(
                    rows - group.row_start,
                    np.searchsorted(steps, bounds_of),
                    group.num_slots,
                    self.window,
                    self.ahead,
                )
            except ValueError as error:
                raise ValueError(
                    f"cold table {group.table}, slots {group.slot_start}:{group.slot_stop}: {error}; give "
                    "the table more cold_slots"
                ) from error
            plans[group] = plan
        return plans

    def route(self, features: SplitFeatures) -> SplitFeatures:
        """The next cold step's ``features`` with its cold ids turned into slot ids; queues the step's
        copies, made before the cold part's lookup of it."""
        step = self._routed
        if step >= self._num_steps:
            raise ValueError(
                f"cold step {step} was not planned: plan the epoch's cold steps first (plan_epoch)"
            )
        self._routed += 1
        started = time.perf_counter()
        with record_function(trace.COLD_TIER):
            targets = tuple(copied_before(step, self.ahead, self._num_steps))
            moves = tuple(tuple(copies.moves(target) for copies in self._copies) for target in targets)
            self._queue.append(_Copies(step, self._flush_next, targets, moves))
            self._flush_next = False
            cold = features.cold
            if cold is not None:
                span = slice(self._remap.bounds[step], self._remap.bounds[step + 1])
                cold = self._slot_ids(
                    cold, self._remap.keys[span], self._remap.slots[span], f"cold step {step}"
                )
        self.route_seconds += time.perf_counter() - started
        return SplitFeatures(features.hot, cold, False)

    def flush(self) -> None:
        """Write every row held in a slot back to host memory (the slots keep them): call it between
        steps, with no routed step waiting, before reading the cold rows."""
        if self._queue:
            raise ValueError(f"{len(self._queue)} routed cold steps have not run yet: flush after them")
        with self._engine.copying():
            for run in self._runs:
                self._write_back(run, np.flatnonzero(run.held >= 0))
        self._engine.settle()

    def state_dict(self) -> dict:
        """This rank's part of the tier between steps, for a checkpoint beside the model's (whose slot
        tables hold the held rows): its host rows with their optimizer state, which row each slot holds,
        and the cold steps of the epoch routed so far."""
        if self._queue:
            raise ValueError(f"{len(self._queue)} routed cold steps have not run yet: save after them")
        self._engine.settle()
        return {
            "ahead": self.ahead,
            "routed": self._routed,
            "groups": [
                {
                    "group": astuple(group),
                    "rows": {name: run.group_rows(index, name) for name in run.rows},
                    "held": run.group_held(index),
                }
                for run, index, group in self._mine()
            ],
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict` (with the model's state saved beside it); the epoch's plan is made
        again when its router resumes it (``plan_epoch(..., start=)``). ``ValueError`` for the state of
        other slot groups, or of copies run another number of steps ahead (the slots hold other rows)."""
        self.check_state(state)
        self._engine.settle()
        with torch.no_grad():
            for (run, index, _), saved in zip(self._mine(), state["groups"], strict=True):
                for name in run.rows:
                    run.group_rows(index, name).copy_(saved["rows"][name])
                held = np.asarray(saved["held"])
                slots = slice(run.slot_starts[index], run.slot_starts[index + 1])
                run.held[slots] = np.where(held >= 0, held + run.row_starts[index], -1)
        self._resumed = state["routed"]

    def check_state(self, state: Mapping) -> None:
        """``ValueError`` unless :meth:`load_state_dict` can restore ``state`` (its rows not looked at)."""
        groups = [tuple(saved["group"]) for saved in state["groups"]]
        mine = [astuple(group) for _, _, group in self._mine()]
        if groups != mine:
            raise ValueError(f"the cold tier's state holds slot groups {groups}, this rank's are {mine}")
        if state["ahead"] != self.ahead:
            raise ValueError(
                f"the cold tier's state was saved copying {state['ahead']} cold steps ahead, this tier "
                f"copies {self.ahead} ahead"
            )

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Within it the cold part looks up any batch (an evaluation's, not routed): before each lookup
        the cold rows of every rank's batch are copied into the first slots of their groups (a
        collective: every rank looks up as many batches). The held rows are written back first and
        copied into their slots again after (counted as copies)."""
        self.flush()
        where = [(run, np.flatnonzero(run.held >= 0)) for run in self._runs]
        held = [(run, slots, run.held[slots].copy()) for run, slots in where]
        self._evaluating = True
        try:
            yield
        finally:
            self._evaluating = False
            with self._engine.copying():
                for run, slots, rows in held:
                    run.held[:] = -1
                    self._load(run, rows, slots)

    def gather_cold_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every cold table's rows, on every rank (a collective; :meth:`flush` first): per name (``weight``,
        and each per-row optimizer state such as FBGEMM's ``momentum1``), full tensors keyed as the cold
        part's weights in the split module's state dict (:attr:`keys`)."""
        mine = {name: (tuple(t.shape[1:]), t.dtype) for run in self._runs for name, t in run.rows.items()}
        everyone = all_gathered(mine)
        shapes = {name: held[name] for held in everyone for name in sorted(held)}
        return {
            name: {
                key: assemble_full_tensor(
                    (self.fae.cold_rows[table], *shape),
                    dtype,
                    [
                        ((slice(group.row_start, group.row_stop),), run.group_rows(index, name))
                        for run, index, group in self._mine()
                        if group.table == table
                    ],
                )
                for key, table in self.keys.items()
            }
            for name, (shape, dtype) in shapes.items()
        }

    def _slot_ids(
        self, cold: KeyedJaggedTensor, keys: np.ndarray, slots: np.ndarray, what: str
    ) -> KeyedJaggedTensor:
        """``cold`` (ids of the cold part) with every id replaced by its slot, the batch's rows given as
        row keys (``keys``) and their slot keys (``slots``), written into an array by row key that the
        batch's ids then read. ``ValueError`` naming ``what`` where an id is not among them."""
        np.put(self._slot_of, keys, slots)
        np.put(self._key_at, slots, keys)
        ids = cold.values().cpu().numpy()
        tables = [self._features[feature] for feature in cold.keys()]
        lengths = cold.length_per_key()
        wanted = ids + np.repeat([self._offsets[t] for t in tables], lengths)
        held = np.take(self._slot_of, wanted)
        found = np.take(self._key_at, held) == wanted
        if not found.all():
            missing = ids[~found][:5].tolist()
            raise ValueError(f"{what} does not look up cold rows {missing} (ids of the cold part)")
        return _with_values(cold, held - np.repeat([self._slot_offsets[t] for t in tables], lengths))

    def _before_lookup(self, module: nn.Module, args: tuple) -> tuple | None:
        """The cold part's forward pre-hook: the queued copies of the step about to look up, or in
        :meth:`evaluating` the batch's rows and its slot ids."""
        if self._evaluating:
            return (self._evaluation_slots(args[0]), *args[1:])
        if not self._queue:
            raise RuntimeError(
                "the cold part of a planned cold tier was looked up on a batch the tier did not route: "
                "give the tier to the BatchRouter (cold_tier=) and train on its batches, and evaluate "
                "within the tier's evaluating()"
            )
        started = time.perf_counter()
        copies = self._queue.popleft()
        self._engine.collect()
        with self._engine.copying(copies.targets):
            if copies.flush_first:
                for run in self._runs:
                    self._write_back(run, np.flatnonzero(run.held >= 0))
                    run.held[:] = -1
            for moves in copies.moves:
                for run, (evicted_slots, evicted_rows, loaded_rows, loaded_slots) in zip(
                    self._runs, moves, strict=True
                ):
                    if np.any(run.held[evicted_slots] != evicted_rows):
                        raise RuntimeError(
                            f"cold tables {sorted({g.table for g in run.groups})}: the slots hold other "
                            "rows than planned"
                        )
                    tick = time.perf_counter()
                    self._write_back(run, evicted_slots)
                    run.held[evicted_slots] = -1
                    tock = time.perf_counter()
                    self._load(run, loaded_rows, loaded_slots)
                    self.write_back_seconds += tock - tick
                    self.load_seconds += time.perf_counter() - tock
        self._engine.wait(copies.step)
        self.copy_seconds += time.perf_counter() - started
        self.copied_steps += 1
        return None

    def _evaluation_slots(self, cold: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``cold`` (ids of the cold part) as slot ids, once the distinct rows of every rank's batch
        fill the first slots of their groups, in row order (a collective)."""
        ids = cold.values().cpu().numpy()
        ends = np.cumsum([0, *cold.length_per_key()])
        mine: dict[str, list[np.ndarray]] = {}
        for feature, start, stop in zip(cold.keys(), ends[:-1], ends[1:], strict=True):
            mine.setdefault(self._features[feature], []).append(ids[start:stop])
        everyone = all_gathered(mine)
        rows_of = {}
        for group in self.groups:
            rows = np.unique(
                np.concatenate([ids[:0]] + [a for e in everyone for a in e.get(group.table, [])])
            )
            rows = rows[(rows >= group.row_start) & (rows < group.row_stop)] - group.row_start
            if len(rows) > group.num_slots:
                raise ValueError(
                    f"cold table {group.table}: an evaluation batch looks up {len(rows)} rows of slots "
                    f"{group.slot_start}:{group.slot_stop}, more than they hold: evaluate smaller batches"
                )
            rows_of[group] = rows
        with self._engine.copying():
            for run in self._runs:
                run.held[:] = -1
                self._load(
                    run,
                    np.concatenate([rows_of[g] + run.row_starts[i] for i, g in enumerate(run.groups)]),
                    np.concatenate(
                        [np.arange(len(rows_of[g])) + run.slot_starts[i] for i, g in enumerate(run.groups)]
                    ),
                )
        keys = [self._offsets[g.table] + g.row_start + rows_of[g] for g in self.groups]
        slots = [self._slot_offsets[g.table] + g.slot_start + np.arange(len(rows_of[g])) for g in self.groups]
        return self._slot_ids(cold, np.concatenate(keys), np.concatenate(slots), "an evaluation batch")

    def _write_back(self, run: _Run, slots: np.ndarray) -> None:
        """Copy ``slots`` of ``run`` (with their optimizer state) to the host rows they hold."""
        if not len(slots):
            return
        rows = torch.from_numpy(run.held[slots])
        index = self._engine.index(slots)
        with torch.no_grad():
            for name, device_slots in run.slots.items():
                values = device_slots.index_select(0, index)
                self._engine.to_host(run.rows[name], rows, values)
                self.bytes_out += values.nbytes
        self.rows_out += len(slots)

    def _load(self, run: _Run, rows: np.ndarray, slots: np.ndarray) -> None:
        """Copy host ``rows`` of ``run`` (with their optimizer state) into its ``slots``."""
        if not len(rows):
            return
        index = torch.from_numpy(rows)
        targets = self._engine.index(slots)
        with torch.no_grad():
            for name, device_slots in run.slots.items():
                self._engine.to_device(device_slots, targets, run.rows[name], index)
                self.bytes_in += len(rows) * run.rows[name][0].nbytes
        run.held[slots] = rows
        self.rows_in += len(rows)


def check_cold_tier(model: nn.Module, cold_tier: PlannedColdTier | None) -> None:
    """``ValueError`` unless ``cold_tier`` is given exactly where ``model`` has a planned cold tier (its
    cold rows live in host memory, outside the model's state), and is that tier."""
    fae = find_fae_module(model)
    slotted = fae is not None and fae.cold_slots is not None
    if slotted and cold_tier is None:
        raise ValueError(
            "the model has a planned cold tier, whose cold rows live in host memory outside the model's "
            "state: give its PlannedColdTier (cold_tier=)"
        )
    if cold_tier is not None and (not slotted or cold_tier.fae is not fae):
        raise ValueError("cold_tier: the planned cold tier of another model")


def _with_values(features: KeyedJaggedTensor, values: np.ndarray) -> KeyedJaggedTensor:
    """``features`` with other ``values`` (on its values' device)."""
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=torch.from_numpy(values).to(features.values().device),
        lengths=features.lengths(),
        weights=features.weights_or_none(),
        stride=features.stride(),
        length_per_key=features.length_per_key(),
    )


def _slot_groups(
    fae: FAEEmbeddingBagCollection, cold: ShardedModule, slots: dict[str, int]
) -> list[SlotGroup]:
    """The slot groups of every cold table: one per row-wise shard of its slot table in the sharding
    plan, each given the table's cold rows in proportion to its slots. ``ValueError`` for a slot table
    sharded otherwise or on another kernel than ``fused``."""
    plan = getattr(cold, "module_sharding_plan", None)
    if plan is None:
        raise ValueError("the cold part is not sharded: shard the model with DistributedModelParallel first")
    groups = []
    for table, num_slots in slots.items():
        sharding = plan[part_table_name(table, COLD)]
        if sharding.sharding_type not in SLOT_SHARDING_TYPES or sharding.compute_kernel != SLOT_KERNEL:
            raise ValueError(
                f"cold table {table}: a planned cold tier's slot table must be sharded "
                f"{'/'.join(SLOT_SHARDING_TYPES)} on the fused kernel, not {sharding.sharding_type} on "
                f"{sharding.compute_kernel} (constrain {part_table_name(table, COLD)})"
            )
        starts = sorted({shard.shard_offsets[0] for shard in sharding.sharding_spec.shards})
        rows = fae.cold_rows[table]
        bounds = [*starts, num_slots]
        groups += [
            SlotGroup(table, a, b, a * rows // num_slots, b * rows // num_slots) for a, b in pairwise(bounds)
        ]
    return groups


def _runs(cold: ShardedModule, groups: list[SlotGroup]) -> list[_Run]:
    """This rank's slot groups in runs (``_Run``): the local shards of the slot tables' weights and
    per-row fused optimizer state, a group joining the run before it where each of its tensors starts
    where that run's ends, and host rows for each run (pinned on CUDA)."""
    weights = cold.state_dict()
    optimizer_state = cold.fused_optimizer.state_dict()["state"]
    local = []
    for group in groups:
        key = f"embedding_bags.{part_table_name(group.table, COLD)}.weight"
        tensors = {"weight": weights[key], **optimizer_state.get(key, {})}
        slots = {}
        for name, tensor in tensors.items():
            shards = [
                s.tensor
                for s in (tensor.local_shards() if isinstance(tensor, ShardedTensor) else [])
                if s.metadata.shard_offsets[0] == group.slot_start
            ]
            if shards:
                if shards[0].shape[0] != group.num_slots:
                    raise ValueError(f"cold table {group.table}: optimizer state {name} is not kept per row")
                slots[name.rsplit(".", 1)[-1]] = shards[0]
        if slots:  # else another rank's shard
            local.append((group, slots))
    local.sort(key=lambda member: member[1]["weight"].data_ptr())
    runs: list[list[tuple[SlotGroup, dict[str, torch.Tensor]]]] = []
    for member in local:
        if runs and _follows(runs[-1][-1][1], member[1]):
            runs[-1].append(member)
        else:
            runs.append([member])
    return [_run(members) for members in runs]


def _follows(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> bool:
    """Whether each of ``after``'s tensors starts in memory where ``before``'s of that name ends, both
    contiguous with the same rows (one view spans them)."""
    return before.keys() == after.keys() and all(
        a.is_contiguous()
        and b.is_contiguous()
        and (a.dtype, a.shape[1:], a.device) == (b.dtype, b.shape[1:], b.device)
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and b.data_ptr() == a.data_ptr() + a.nbytes
        for a, b in ((before[name], after[name]) for name in before)
    )


def _run(members: list[tuple[SlotGroup, dict[str, torch.Tensor]]]) -> _Run:
    """The run of ``members`` (each group and its slots, one after another in memory)."""
    groups = [group for group, _ in members]
    slot_starts = np.cumsum([0, *(g.num_slots for g in groups)])
    row_starts = np.cumsum([0, *(g.row_stop - g.row_start for g in groups)])
    slots = {
        name: t.as_strided((int(slot_starts[-1]), *t.shape[1:]), t.stride())
        for name, t in members[0][1].items()
    }
    pin = slots["weight"].device.type == "cuda"
    rows = {
        name: torch.zeros((int(row_starts[-1]), *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
        for name, t in slots.items()
    }
    initial = [
        {name: t[:1].clone() for name, t in tensors.items() if name != "weight"} for _, tensors in members
    ]
    held = np.full(int(slot_starts[-1]), -1, dtype=np.int64)
    return _Run(groups, slot_starts, row_starts, slots, rows, held, initial)


def _run_copies(run: _Run, plans: Mapping[SlotGroup, SlotPlan]) -> _RunCopies:
    """``run``'s copies of every step of ``plans``, in its slots and host rows."""
    ordered = [plans[group] for group in run.groups]
    slot_starts, row_starts = run.slot_starts[:-1], run.row_starts[:-1]
    num_steps = ordered[0].num_steps
    (evicted_slots, evicted_rows), evicted_bounds = _step_major(
        [plan.evictions_per_step() for plan in ordered],
        [
            [plan.evicted_slots + start for plan, start in zip(ordered, slot_starts, strict=True)],
            [plan.evicted_rows + start for plan, start in zip(ordered, row_starts, strict=True)],
        ],
        num_steps,
    )
    (loaded_rows, loaded_slots), loaded_bounds = _step_major(
        [plan.loads_per_step() for plan in ordered],
        [
            [plan.rows[plan.loaded] + start for plan, start in zip(ordered, row_starts, strict=True)],
            [plan.slots[plan.loaded] + start for plan, start in zip(ordered, slot_starts, strict=True)],
        ],
        num_steps,
    )
    return _RunCopies(evicted_slots, evicted_rows, evicted_bounds, loaded_rows, loaded_slots, loaded_bounds)


def _all_gathered(arrays: Sequence[np.ndarray], group: dist.ProcessGroup) -> list[list[np.ndarray]]:
    """Every rank's ``arrays`` (1-d, int64) on every rank of ``group`` (a collective): their lengths, then
    each rank's arrays end to end in one tensor padded to the longest (no pickling)."""
    lengths = torch.tensor([len(a) for a in arrays], dtype=torch.int64)
    all_lengths = [torch.empty_like(lengths) for _ in range(dist.get_world_size(group))]
    dist.all_gather(all_lengths, lengths, group=group)
    size = max(int(n.sum()) for n in all_lengths)
    mine = torch.zeros(size, dtype=torch.int64)
    mine[: int(lengths.sum())] = torch.from_numpy(
        np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays])
    )
    gathered = [torch.empty(size, dtype=torch.int64) for _ in all_lengths]
    dist.all_gather(gathered, mine, group=group)
    return [
        np.split(values.numpy(), np.cumsum(n.numpy()))[: len(arrays)]
        for values, n in zip(gathered, all_lengths, strict=True)
    ]


def _step_major(
    counts: Sequence[np.ndarray], columns: Sequence[Sequence[np.ndarray]], num_steps: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Groups' entries merged step after step, each step's groups in order: per column, the groups'
    arrays ``columns[c][g]`` (group ``g``'s entries step after step, ``counts[g][s]`` of step ``s``) as
    one; and each step's bounds in them."""
    table = np.stack(counts) if len(counts) else np.zeros((0, num_steps), dtype=np.int64)
    starts = np.cumsum(np.r_[0, table.T.ravel()])  # of each (step, group), step after step
    merged = [np.empty(starts[-1], dtype=np.int64) for _ in columns]
    for index, group_counts in enumerate(table):
        firsts = starts[index : -1 : len(table)] - np.r_[0, np.cumsum(group_counts)[:-1]]
        where = np.repeat(firsts, group_counts) + np.arange(group_counts.sum())
        for out, column in zip(merged, columns, strict=True):
            out[where] = column[index]
    return merged, starts[:: len(table)] if len(table) else np.zeros(num_steps + 1, dtype=np.int64)


def min_cold_slots(
    partition: HotColdPartition, steps: Sequence[Step], hot_set: HotSet, ahead: int = 0
) -> dict[str, int]:
    """Per table with cold rows of ``hot_set``, the most distinct cold rows ``ahead + 1`` cold steps in a
    row among ``steps`` (an epoch's schedule of ``partition``, ``BatchRouter.schedule``) look up over all
    ranks, at least 1: the fewest slots of a table-wise slot table (``cold_slots``) whose copies run
    ``ahead`` cold steps early (another epoch's schedule may need more)."""
    pools = cold_step_pools(partition, steps, hot_set)
    return {table: min_slots(*pool, ahead) for table, pool in pools.items()}


def cold_step_pools(
    partition: HotColdPartition, steps: Sequence[Step], hot_set: HotSet
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per table with cold rows of ``hot_set``, the cold rows (ids of the cold part) that the cold steps
    among ``steps`` (an epoch's schedule of ``partition``) look up over all ranks, as ``plan_slots`` takes
    them: the rows step after step, and each step's bounds in them."""
    features = {f: c.name for c in hot_set.tables for f in c.feature_names}
    cold_steps = [step for step in steps if not step.hot]
    looked_up = cold_step_rows(partition, cold_steps, features)
    bounds = np.arange(len(cold_steps) + 1)
    pools = {}
    for config, hot in zip(hot_set.tables, hot_set.hot_ids, strict=True):
        if len(hot) < config.num_embeddings:
            step, rows = looked_up.get(config.name, (np.zeros(0, dtype=np.int64),) * 2)
            pools[config.name] = (rows, np.searchsorted(step, bounds))
    return pools


def cold_step_rows(
    partition: HotColdPartition, cold_steps: Sequence[Step], features: Mapping[str, str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per table (``features``: the table of each feature to read), the cold step (ascending, an index
    of ``cold_steps``) and the cold row (id of the cold part) of every cold id of those steps on every
    rank."""
    spans = [
        (ordinal, part, start, stop)
        for ordinal, step in enumerate(cold_steps)
        for rank_spans in step.spans
        for part, start, stop in rank_spans
    ]
    pieces = []
    for part in (HOT, COLD):
        mine = [(o, a, b) for o, p, a, b in spans if p == part]
        if not mine:
            continue
        ordinal, start, stop = (np.array(x, dtype=np.int64) for x in zip(*mine, strict=True))
        rows = np.repeat(start - np.cumsum(np.r_[0, (stop - start)[:-1]]), stop - start) + np.arange(
            int((stop - start).sum())
        )
        part_ids = partition.part(part).part_ids
        assert part_ids is not None  # a partition's parts hold them
        pieces.append((np.repeat(ordinal, stop - start), part_ids[rows]))
    step = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    ids = (
        np.concatenate([p[1] for p in pieces])
        if pieces
        else np.zeros((0, sum(partition.hot.ids_per_feature)), dtype=np.int64)
    )
    column_bounds = np.cumsum([0, *partition.hot.ids_per_feature])
    per_table: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for index, feature in enumerate(partition.keys):
        if feature not in features:
            continue
        columns = ids[:, column_bounds[index] : column_bounds[index + 1]]
        cold = columns < 0
        per_table.setdefault(features[feature], []).append(
            (np.broadcast_to(step[:, None], columns.shape)[cold], ~columns[cold])
        )
    result = {}
    for table, found in per_table.items():
        steps = np.concatenate([s for s, _ in found])
        order = np.argsort(steps, kind="stable")
        result[table] = (steps[order], np.concatenate([r for _, r in found])[order])
    return result
