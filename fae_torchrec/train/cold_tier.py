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
a fixed share of the table's cold rows, in proportion to its slots, so every rank plans all groups
alike and copies only those of the shards it holds. On CUDA the host rows are pinned.
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
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec.modules.fae_embedding_bag import (
    SLOT_KERNEL,
    SLOT_SHARDING_TYPES,
    FAEEmbeddingBagCollection,
    part_table_name,
)
from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.modules.state import assemble_full_tensor, initial_blocks
from fae_torchrec.stats.hot_set import COLD, HOT, HotSet
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.copy_engine import CopyEngine
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.schedule import Step
from fae_torchrec.train.slot_plan import SlotPlan, min_slots, plan_slots
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
class _HostRows:
    """This rank's copy of a slot group: the device slots (views of FBGEMM's weights and per-row
    optimizer state of the shard), the group's rows in host memory, which row each slot holds, and a
    row's initial optimizer state (the slots' when the tier was made)."""

    group: SlotGroup
    slots: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]
    held: np.ndarray
    initial: dict[str, torch.Tensor]


@dataclass(frozen=True)
class _StepRows:
    """Every slot group's rows of each cold step as row keys (a table's offset + its cold row) and their
    slot keys (a table's offset in all slots + its slot), step ``s``'s at ``bounds[s]:bounds[s + 1]``."""

    keys: np.ndarray
    slots: np.ndarray
    bounds: np.ndarray


@dataclass(frozen=True)
class _Copies:
    """The copies before cold step ``step``: whether every held row goes back first (a new epoch's plan
    starts from empty slots), then for each of the steps ``targets`` (``step`` and the steps ``ahead``,
    ``SlotPlan.copied_before``), per local group, (evicted slots, their rows, loaded rows, their slots)."""

    step: int
    flush_first: bool
    targets: tuple[int, ...]
    moves: tuple[tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...], ...]


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
    ``copy_seconds`` that of the ``copied_steps`` steps' copies (evaluations' aside). Every rank plans
    every group, reading into memory the part ids of the epoch's cold steps (8 bytes each) and a step
    and a row per cold id.
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
        self.groups = _slot_groups(fae)
        # every cold row as one key (its table's offset + its row): the groups' rows in ascending ranges
        starts = np.cumsum([0, *(fae.num_cold[t] for t in fae.cold_slots)])
        self._offsets = dict(zip(fae.cold_slots, starts[:-1].tolist(), strict=True))
        # every slot as one key too (its table's offset in all slots + its slot)
        slot_starts = np.cumsum([0, *fae.cold_slots.values()])
        self._slot_offsets = dict(zip(fae.cold_slots, slot_starts[:-1].tolist(), strict=True))
        # per cold row key, its slot key in the batch last remapped (4 bytes each, stale for other rows);
        # per slot key, the row key it held there (so that a stale slot is told from a held one)
        self._slot_of = np.zeros(starts[-1], dtype=np.int32)
        self._key_at = np.full(slot_starts[-1], -1, dtype=np.int64)
        self._local = _host_rows(fae, self.groups)
        devices = [local.slots["weight"].device for local in self._local]
        self._engine = CopyEngine(devices[0] if devices else torch.device("cpu"))
        self._reset()
        self._features = {
            f: c.name
            for c in fae.embedding_bag_configs()
            for f in c.feature_names
            if c.name in fae.cold_slots
        }  # the table of each feature the tier's tables read
        #: The current epoch's slot plan of every group.
        self.plans: dict[SlotGroup, SlotPlan] = {}
        self._remap = _StepRows(*(np.zeros(n, dtype=np.int64) for n in (0, 0, 1)))  # of self.plans
        self._num_steps = self._routed = 0  # cold steps of the epoch planned, and routed so far
        self._flush_next = False  # the next routed step writes every held row back first
        self._queue: deque[_Copies] = deque()
        self._evaluating = False
        self._resumed: int | None = None  # the cold steps of the epoch a loaded state was saved after
        self.rows_in = self.rows_out = self.bytes_in = self.bytes_out = 0
        self.plan_seconds = self.route_seconds = self.copy_seconds = self.plan_ahead_seconds = 0.0
        self._planner: ThreadPoolExecutor | None = None  # plans epochs ahead (plan_ahead)
        # an epoch's plans made ahead: its partition, its key and the plans (with their _StepRows) to come
        self._made_ahead: tuple[HotColdPartition, Hashable, Future] | None = None
        self.copied_steps = 0
        fae.cold.register_forward_pre_hook(self._before_lookup)

    @property
    def keys(self) -> dict[str, str]:
        """The cold part's weights in the split module's state dict (its slot tables), by their table."""
        return {f"{COLD}.embedding_bags.{part_table_name(t, COLD)}.weight": t for t in self.fae.cold_slots}

    def load_ebc_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Set the cold rows this rank holds from weights in the original layout (a plain EBC's
        ``state_dict``), their optimizer state to the slots' initial one; the slots are emptied."""
        parts = self.fae.split_state(state)
        self.load_cold_state({"weight": {key: parts[key] for key in self.keys}})

    def load_cold_state(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Set the cold rows this rank holds from full tensors of every cold table's rows, by name and
        key as :meth:`gather_cold_state` gives them (an optimizer state left out: the slots' initial
        one); the slots are emptied."""
        self._reset()
        for name, tensors in state.items():
            for key, table in self.keys.items():
                self._set_rows(table, 0, tensors[key], name)

    def load_initial_tables(self, tables: Sequence[EmbeddingBagConfig], seed: int) -> None:
        """Set the cold rows this rank holds to their initial weights, drawn a block at a time as
        ``load_initial_tables`` draws every other row (the same tables as the baseline's), their
        optimizer state to the slots' initial one; the slots are emptied."""
        self._reset()
        for config, start, rows in initial_blocks(tables, seed):
            for name, first, chosen in self.fae.row_ranges(config.name, start, start + len(rows)):
                if name.startswith(COLD):
                    self._set_rows(config.name, first, rows[chosen])

    def _reset(self) -> None:
        """Empty the slots; every host row's optimizer state the slots' initial one."""
        self._engine.settle()
        with torch.no_grad():
            for local in self._local:
                for name, initial in local.initial.items():
                    local.rows[name].copy_(initial.expand_as(local.rows[name]))
                local.held[:] = -1

    def _set_rows(self, table: str, first: int, rows: torch.Tensor, name: str = "weight") -> None:
        """Set cold rows ``first:first + len(rows)`` of ``table`` (their weights, or the optimizer state
        ``name``), those in this rank's groups."""
        with torch.no_grad():
            for local in self._local:
                group = local.group
                begin, end = max(first, group.row_start), min(first + len(rows), group.row_stop)
                if group.table == table and begin < end:
                    local.rows[name][begin - group.row_start : end - group.row_start] = rows[
                        begin - first : end - first
                    ]

    def plan_epoch(
        self,
        partition: HotColdPartition,
        cold_steps: Sequence[Step],
        start: int = 0,
        *,
        key: Hashable | None = None,
    ) -> None:
        """Plan the slots of every group over ``cold_steps`` (an epoch's cold steps of ``partition``, in
        order, as every rank schedules them): the rows of a step are those of every rank's inputs (every
        rank reads them from the partition). The rows held from an earlier epoch are written back
        before the first of them. ``start``: the cold steps already trained, when resuming mid-epoch
        from a state (:meth:`load_state_dict`) saved after them. ``key``: the epoch's name, as
        :meth:`plan_ahead` was given it, whose plans, made ahead, are taken."""
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
            self.plans, self._remap = made[2].result()
        else:
            self.plans, self._remap = self._planned(partition, cold_steps)
        self._num_steps, self._routed = len(cold_steps), start
        self._engine.forget()
        # rows an earlier epoch left in the slots (none: nothing to write); mid-epoch, the plan's own
        self._flush_next = not start
        self._resumed = None
        self.plan_seconds += time.perf_counter() - started

    def plan_ahead(self, partition: HotColdPartition, cold_steps: Sequence[Step], key: Hashable) -> None:
        """Plan another epoch's slots (as :meth:`plan_epoch` would) in a background thread, during the
        epoch before it: ``plan_epoch(..., key=key)`` takes them. The thread's time goes to
        ``plan_ahead_seconds``; the two epochs' plans are held at once while it runs."""
        if self._planner is None:
            self._planner = ThreadPoolExecutor(1, thread_name_prefix="fae-slot-plans")
        self._made_ahead = (
            partition,
            key,
            self._planner.submit(self._plans_ahead, partition, list(cold_steps)),
        )

    def _plans_ahead(
        self, partition: HotColdPartition, cold_steps: list[Step]
    ) -> tuple[dict[SlotGroup, SlotPlan], _StepRows]:
        started = time.perf_counter()
        try:
            return self._planned(partition, cold_steps)
        finally:
            self.plan_ahead_seconds += time.perf_counter() - started

    def _planned(
        self, partition: HotColdPartition, cold_steps: Sequence[Step]
    ) -> tuple[dict[SlotGroup, SlotPlan], _StepRows]:
        """Every group's slot plan over ``cold_steps`` of ``partition``, and every group's rows of each
        step as row keys with their slots, step after step (one slice a step for the remap)."""
        plans = self._plans(partition, cold_steps)
        counts = np.stack([np.diff(plans[g].bounds) for g in self.groups])  # (group, step)
        starts = np.cumsum(np.r_[0, counts.T.ravel()])  # of (step, group), step after step
        keys = np.empty(starts[-1], dtype=np.int64)
        slots = np.empty(starts[-1], dtype=np.int64)
        for index, group in enumerate(self.groups):
            plan = plans[group]
            firsts = starts[index : -1 : len(self.groups)] - plan.bounds[:-1]  # where each step's rows go
            where = np.repeat(firsts, counts[index]) + np.arange(len(plan.rows))
            keys[where] = self._offsets[group.table] + group.row_start + plan.rows
            slots[where] = self._slot_offsets[group.table] + group.slot_start + plan.slots
        return plans, _StepRows(keys, slots, starts[:: len(self.groups)])

    def _plans(self, partition: HotColdPartition, cold_steps: Sequence[Step]) -> dict[SlotGroup, SlotPlan]:
        """Every group's slot plan over ``cold_steps`` of ``partition``."""
        ids = cold_step_rows(partition, cold_steps, self._features)
        bounds_of = np.arange(len(cold_steps) + 1)
        plans = {}
        for group in self.groups:
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
        targets = tuple(self.plans[self.groups[0]].copied_before(step))
        moves = tuple(
            tuple(
                (*self.plans[local.group].evictions(target)[::-1], *self.plans[local.group].loads(target))
                for local in self._local
            )
            for target in targets
        )
        self._queue.append(_Copies(step, self._flush_next, targets, moves))
        self._flush_next = False
        cold = features.cold
        if cold is not None:
            span = slice(self._remap.bounds[step], self._remap.bounds[step + 1])
            cold = self._slot_ids(cold, self._remap.keys[span], self._remap.slots[span], f"cold step {step}")
        self.route_seconds += time.perf_counter() - started
        return SplitFeatures(features.hot, cold, False)

    def flush(self) -> None:
        """Write every row held in a slot back to host memory (the slots keep them): call it between
        steps, with no routed step waiting, before reading the cold rows."""
        if self._queue:
            raise ValueError(f"{len(self._queue)} routed cold steps have not run yet: flush after them")
        with self._engine.copying():
            for local in self._local:
                self._write_back(local, np.flatnonzero(local.held >= 0))
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
                {"group": astuple(local.group), "rows": dict(local.rows), "held": local.held.copy()}
                for local in self._local
            ],
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict` (with the model's state saved beside it); the epoch's plan is made
        again when its router resumes it (``plan_epoch(..., start=)``). ``ValueError`` for the state of
        other slot groups, or of copies run another number of steps ahead (the slots hold other rows)."""
        groups = [tuple(saved["group"]) for saved in state["groups"]]
        mine = [astuple(local.group) for local in self._local]
        if groups != mine:
            raise ValueError(f"the cold tier's state holds slot groups {groups}, this rank's are {mine}")
        if state["ahead"] != self.ahead:
            raise ValueError(
                f"the cold tier's state was saved copying {state['ahead']} cold steps ahead, this tier "
                f"copies {self.ahead} ahead"
            )
        self._engine.settle()
        with torch.no_grad():
            for local, saved in zip(self._local, state["groups"], strict=True):
                for name, rows in local.rows.items():
                    rows.copy_(saved["rows"][name])
                local.held[:] = saved["held"]
        self._resumed = state["routed"]

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Within it the cold part looks up any batch (an evaluation's, not routed): before each lookup
        the cold rows of every rank's batch are copied into the first slots of their groups (a
        collective: every rank looks up as many batches). The held rows are written back first and
        copied into their slots again after (counted as copies)."""
        self.flush()
        held = [(local, np.flatnonzero(local.held >= 0)) for local in self._local]
        held = [(local, slots, local.held[slots].copy()) for local, slots in held]
        self._evaluating = True
        try:
            yield
        finally:
            self._evaluating = False
            with self._engine.copying():
                for local, slots, rows in held:
                    local.held[:] = -1
                    self._load(local, rows, slots)

    def gather_cold_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every cold table's rows, on every rank (a collective; :meth:`flush` first): per name (``weight``,
        and each per-row optimizer state such as FBGEMM's ``momentum1``), full tensors keyed as the cold
        part's weights in the split module's state dict (:attr:`keys`)."""
        mine = {
            name: (tuple(t.shape[1:]), t.dtype) for local in self._local for name, t in local.rows.items()
        }
        everyone = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:  # a rank may hold no group
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        shapes = {name: held[name] for held in everyone for name in sorted(held)}
        return {
            name: {
                key: assemble_full_tensor(
                    (self.fae.num_cold[table], *shape),
                    dtype,
                    [
                        ((slice(local.group.row_start, local.group.row_stop),), local.rows[name])
                        for local in self._local
                        if local.group.table == table
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
        self._engine.settle()
        with self._engine.copying(copies.targets):
            if copies.flush_first:
                for local in self._local:
                    self._write_back(local, np.flatnonzero(local.held >= 0))
                    local.held[:] = -1
            for moves in copies.moves:
                for local, (evicted_slots, evicted_rows, loaded_rows, loaded_slots) in zip(
                    self._local, moves, strict=True
                ):
                    if np.any(local.held[evicted_slots] != evicted_rows):
                        raise RuntimeError(
                            f"cold table {local.group.table}: the slots hold other rows than planned"
                        )
                    self._write_back(local, evicted_slots)
                    local.held[evicted_slots] = -1
                    self._load(local, loaded_rows, loaded_slots)
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
        everyone = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
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
            for local in self._local:
                local.held[:] = -1
                self._load(local, rows_of[local.group], np.arange(len(rows_of[local.group])))
        keys = [self._offsets[g.table] + g.row_start + rows_of[g] for g in self.groups]
        slots = [self._slot_offsets[g.table] + g.slot_start + np.arange(len(rows_of[g])) for g in self.groups]
        return self._slot_ids(cold, np.concatenate(keys), np.concatenate(slots), "an evaluation batch")

    def _write_back(self, local: _HostRows, slots: np.ndarray) -> None:
        """Copy ``slots`` (with their optimizer state) to the host rows they hold."""
        if not len(slots):
            return
        rows = torch.from_numpy(local.held[slots])
        index = torch.from_numpy(slots).to(local.slots["weight"].device)
        with torch.no_grad():
            for name, device_slots in local.slots.items():
                values = device_slots.index_select(0, index)
                self._engine.to_host(local.rows[name], rows, values)
                self.bytes_out += values.nbytes
        self.rows_out += len(slots)

    def _load(self, local: _HostRows, rows: np.ndarray, slots: np.ndarray) -> None:
        """Copy host ``rows`` (with their optimizer state) into ``slots``."""
        if not len(rows):
            return
        index = torch.from_numpy(rows)
        device = local.slots["weight"].device
        targets = torch.from_numpy(slots).to(device)
        with torch.no_grad():
            for name, device_slots in local.slots.items():
                self._engine.to_device(device_slots, targets, local.rows[name], index)
                self.bytes_in += len(rows) * local.rows[name][0].nbytes
        local.held[slots] = rows
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


def _slot_groups(fae: FAEEmbeddingBagCollection) -> list[SlotGroup]:
    """The slot groups of every cold table: one per row-wise shard of its slot table in the sharding
    plan, each given the table's cold rows in proportion to its slots. ``ValueError`` for a slot table
    sharded otherwise or on another kernel than ``fused``."""
    plan = getattr(fae.cold, "module_sharding_plan", None)
    if plan is None:
        raise ValueError("the cold part is not sharded: shard the model with DistributedModelParallel first")
    groups = []
    for table, num_slots in fae.cold_slots.items():
        sharding = plan[part_table_name(table, COLD)]
        if sharding.sharding_type not in SLOT_SHARDING_TYPES or sharding.compute_kernel != SLOT_KERNEL:
            raise ValueError(
                f"cold table {table}: a planned cold tier's slot table must be sharded "
                f"{'/'.join(SLOT_SHARDING_TYPES)} on the fused kernel, not {sharding.sharding_type} on "
                f"{sharding.compute_kernel} (constrain {part_table_name(table, COLD)})"
            )
        starts = sorted({shard.shard_offsets[0] for shard in sharding.sharding_spec.shards})
        rows = fae.num_cold[table]
        bounds = [*starts, num_slots]
        groups += [
            SlotGroup(table, a, b, a * rows // num_slots, b * rows // num_slots) for a, b in pairwise(bounds)
        ]
    return groups


def _host_rows(fae: FAEEmbeddingBagCollection, groups: list[SlotGroup]) -> list[_HostRows]:
    """This rank's slot groups: the local shards of the slot tables' weights and per-row fused
    optimizer state, and host rows for them (pinned on CUDA)."""
    weights = fae.cold.state_dict()
    optimizer_state = fae.cold.fused_optimizer.state_dict()["state"]
    result = []
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
        if not slots:
            continue  # another rank's shard
        pin = slots["weight"].device.type == "cuda"
        rows = {
            name: torch.zeros((group.row_stop - group.row_start, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
            for name, t in slots.items()
        }
        initial = {name: t[:1].clone() for name, t in slots.items() if name != "weight"}
        result.append(_HostRows(group, slots, rows, np.full(group.num_slots, -1, dtype=np.int64), initial))
    return result


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
        pieces.append((np.repeat(ordinal, stop - start), partition.part(part).part_ids[rows]))
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
