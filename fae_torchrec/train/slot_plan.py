"""Which cold rows occupy which of ``S`` device slots at every cold step: the slot plan of a planned
cold tier (issue 48).

FAE's router fixes an epoch's steps before training, so the cold rows each cold step looks up are
known ahead. Instead of a cache, a cold part can keep its rows in host memory and give the device a
plain table of ``S`` slots: before each step the rows it needs and no slot holds are copied in, and
when no slot is free the resident row whose next use is farthest goes out (Belady's rule, optimal
for the rows moved), written back with its optimizer state after its last use. ``plan_slots``
decides all of it from the steps' rows, for the whole epoch or with a look-ahead of ``window``
steps: next uses beyond the window count as never, and those rows go out least recently used first
(what a planner with that look-ahead can know). The plan also holds each step's remap from row to
slot, so a step's ids can be rewritten to slot ids before the step, as the hot part's are.

Copies may run ``ahead`` steps early, while the steps before run (a copy engine overlapping them with
compute): step ``s``'s rows are copied in before step ``s - ahead``, so they may only take slots whose
rows no step from ``s - ahead`` on needs before them; the slots then hold the rows of ``ahead + 1``
steps at once, and a step's evictions are written back after their last use, before that step.

Every row a step looks up sits in a slot during the step, so a step's new rows take slots before it
runs and never bypass them. With that rule evicting the farthest next use is still optimal (the tests
check it against every choice on small streams). ``benchmarks.common.cache_model.belady_moves`` is
looser: its cache of ``C`` rows evicts after each step, the rows just used included, so it holds a
step's misses on top of ``C``; it loads no more than ``C`` slots do, and no less than
``C + the largest step``'s.

Cost: one sort of the (row, step) pairs for the next uses, then per step a few array operations over
the step's rows and, when it must evict, one ``np.argpartition`` over the ``S`` slots' next uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SlotPlan:
    """Rows and slots of every step, in the steps' order.

    Step ``s`` looks up ``rows[bounds[s]:bounds[s + 1]]`` (distinct, ascending), held by the same span
    of ``slots``; ``loaded`` marks those copied in (host to device) before the step. Before them, the
    step's evictions ``evicted_rows[evicted_bounds[s]:evicted_bounds[s + 1]]`` leave their
    ``evicted_slots``, each written back (device to host) at any time after its last use, step
    ``evicted_after``. ``resident_rows`` hold ``resident_slots`` after the last step (written back
    when the plan ends). ``window``: the look-ahead in steps (None: the whole epoch). ``ahead``: the
    copies of step ``s`` run before step ``s - ahead`` (:func:`copied_before`), and the evictions'
    last uses are before that step.
    """

    num_slots: int
    window: int | None
    ahead: int
    rows: np.ndarray
    bounds: np.ndarray
    slots: np.ndarray
    loaded: np.ndarray
    evicted_rows: np.ndarray
    evicted_slots: np.ndarray
    evicted_after: np.ndarray
    evicted_bounds: np.ndarray
    resident_rows: np.ndarray
    resident_slots: np.ndarray

    @property
    def num_steps(self) -> int:
        return len(self.bounds) - 1

    def step_of(self) -> np.ndarray:
        """The step of each entry of ``rows``."""
        return np.repeat(np.arange(self.num_steps), np.diff(self.bounds))

    def loads_per_step(self) -> np.ndarray:
        """Rows copied in before each step."""
        return np.bincount(self.step_of()[self.loaded], minlength=self.num_steps)

    def evictions_per_step(self) -> np.ndarray:
        """Rows evicted (and written back) before each step."""
        return np.diff(self.evicted_bounds)

    @property
    def rows_in(self) -> int:
        """Rows copied host to device over the plan."""
        return int(self.loaded.sum())

    @property
    def rows_out(self) -> int:
        """Rows written back device to host over the plan, the residents at its end left out."""
        return len(self.evicted_rows)

    @property
    def nbytes(self) -> int:
        """Memory of the plan's arrays."""
        return sum(
            getattr(self, name).nbytes
            for name in (
                "rows",
                "bounds",
                "slots",
                "loaded",
                "evicted_rows",
                "evicted_slots",
                "evicted_after",
                "evicted_bounds",
                "resident_rows",
                "resident_slots",
            )
        )

    def loads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows copied in before ``step`` and their slots."""
        span = slice(self.bounds[step], self.bounds[step + 1])
        loaded = self.loaded[span]
        return self.rows[span][loaded], self.slots[span][loaded]

    def evictions(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows evicted before ``step`` and the slots they leave."""
        span = slice(self.evicted_bounds[step], self.evicted_bounds[step + 1])
        return self.evicted_rows[span], self.evicted_slots[span]

    def step_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The distinct rows ``step`` looks up (ascending) and the slots that hold them during it."""
        span = slice(self.bounds[step], self.bounds[step + 1])
        return self.rows[span], self.slots[span]

    def remap(self, step: int, ids: np.ndarray) -> np.ndarray:
        """The slot of each of ``ids`` (rows of ``step``, repeats allowed) during ``step``."""
        rows, held = self.step_rows(step)
        ids = np.asarray(ids)
        at = np.minimum(np.searchsorted(rows, ids), max(len(rows) - 1, 0))
        if len(ids) and (not len(rows) or np.any(rows[at] != ids)):
            missing = ids[rows[at] != ids] if len(rows) else ids
            raise ValueError(f"step {step} does not look up rows {missing[:5].tolist()}")
        return held[at]


def copied_before(step: int, ahead: int, num_steps: int) -> range:
    """The steps of ``num_steps`` whose copies run before ``step`` when they run ``ahead`` steps early:
    the step ``ahead`` steps later, and at the first step every step up to that one."""
    return range(0 if step == 0 else step + ahead, min(step + ahead + 1, num_steps))


def plan_slots(
    ids: np.ndarray, bounds: np.ndarray, num_slots: int, window: int | None = None, ahead: int = 0
) -> SlotPlan:
    """Plan ``num_slots`` device slots over steps that look up ``ids[bounds[s]:bounds[s + 1]]``
    (non-negative row ids, repeats allowed), the slots empty at the start.

    ``window``: steps of look-ahead after the current one (None: the whole epoch). ``ahead``: steps
    before its own that a step's copies run (0: just before it). Raises ``ValueError`` naming the
    first step with more distinct rows than slots, or the first ``ahead + 1`` steps that are.
    """
    ids, bounds = np.asarray(ids, dtype=np.int64), np.asarray(bounds, dtype=np.int64)
    _check(ids, bounds, num_slots, window, ahead)
    n = len(bounds) - 1
    step, rows = _distinct(ids, bounds)
    row_bounds = np.searchsorted(step, np.arange(n + 1))
    sizes = np.diff(row_bounds)
    if np.any(sizes > num_slots):
        s = int(np.argmax(sizes > num_slots))
        raise ValueError(f"step {s} looks up {sizes[s]} distinct rows, more than the {num_slots} slots")
    dense, distinct, following = _by_row(rows, step, n)
    horizon = n if window is None else window  # next uses beyond step + horizon count as never
    state = _Slots.empty(num_slots, len(distinct))
    slots = np.empty(len(rows), dtype=np.int64)
    loaded = np.zeros(len(rows), dtype=bool)
    evicted: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    evicted_counts = np.zeros(n, dtype=np.int64)
    for s in range(n):
        span = slice(row_bounds[s], row_bounds[s + 1])
        mine = dense[span]
        miss = state.row_slot[mine] < 0
        need = int(miss.sum()) - len(state.free)
        if need > 0:
            evicted.append(state.evict(s, need, ahead, s + horizon, n))
            evicted_counts[s] = need
        slots[span], loaded[span] = state.load(mine, miss, following[span], s, n), miss
    victims, victim_rows, after = (
        (np.concatenate(parts) for parts in zip(*evicted, strict=True))
        if evicted
        else (np.zeros(0, dtype=np.int64),) * 3
    )
    resident = np.flatnonzero(state.row >= 0)
    return SlotPlan(
        num_slots,
        window,
        ahead,
        rows,
        row_bounds,
        slots,
        loaded,
        distinct[victim_rows],
        victims,
        after,
        np.r_[0, np.cumsum(evicted_counts)],
        distinct[state.row[resident]],
        resident,
    )


@dataclass
class _Slots:
    """The slots as :func:`plan_slots` walks the steps: each slot's row, its next and last use and its
    rank in the eviction order where every next use is known (-1: none), each row's slot (-1: none),
    and the free slots."""

    row: np.ndarray
    next: np.ndarray
    last: np.ndarray
    rank: np.ndarray
    row_slot: np.ndarray
    free: np.ndarray

    @classmethod
    def empty(cls, num_slots: int, num_rows: int) -> _Slots:
        row, next_use, last_use, rank = (np.full(num_slots, -1, dtype=np.int64) for _ in range(4))
        row_slot = np.full(num_rows, -1, dtype=np.int64)
        return cls(row, next_use, last_use, rank, row_slot, np.arange(num_slots, dtype=np.int64))

    def evict(
        self, s: int, need: int, ahead: int, horizon: int, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Free ``need`` slots before step ``s`` (Belady's victims, next uses beyond ``horizon`` counted
        as never; with copies ``ahead``, none a row looked up from step ``s - ahead`` on): the slots, their
        rows and their last uses. ``ValueError`` where those steps look up more rows than there are slots."""
        keep = (self.last >= s - ahead) | (self.next == s) if ahead else None
        if keep is not None and np.count_nonzero(~keep & (self.row >= 0)) < need:
            raise ValueError(
                f"steps {max(s - ahead, 0)} to {s} look up more distinct rows than the {len(self.row)} "
                f"slots (copies {ahead} steps ahead)"
            )
        victims = _farthest(self.rank, self.next, self.last, horizon, n, need, keep)
        gone = (victims, self.row[victims], self.last[victims])
        self.row_slot[self.row[victims]] = -1
        self.free = np.concatenate([self.free, victims])
        return gone

    def load(self, mine: np.ndarray, miss: np.ndarray, following: np.ndarray, s: int, n: int) -> np.ndarray:
        """Step ``s``'s rows ``mine`` (``miss``: those in no slot) into slots, their next uses
        ``following``; the slot of each."""
        loads = int(np.count_nonzero(miss))
        taken, self.free = self.free[:loads], self.free[loads:]
        self.row_slot[mine[miss]] = taken
        self.row[taken] = mine[miss]
        held = self.row_slot[mine]
        self.next[held], self.last[held] = following, s
        self.rank[held] = _rank(following, s, n)
        return held


def min_slots(ids: np.ndarray, bounds: np.ndarray, ahead: int = 0) -> int:
    """The fewest slots :func:`plan_slots` plans the steps with (``ids`` and ``bounds`` as it takes them):
    the most distinct rows of ``ahead + 1`` steps in a row, at least 1."""
    ids, bounds = np.asarray(ids, dtype=np.int64), np.asarray(bounds, dtype=np.int64)
    n = len(bounds) - 1
    step, rows = _distinct(ids, bounds)
    # a use counts in the runs ending from its step until ahead steps later or the row's next use
    stop = np.minimum(step + ahead + 1, _by_row(rows, step, n)[2])
    counts = np.cumsum(np.bincount(step, minlength=n + 1) - np.bincount(stop, minlength=n + 1))
    return max(1, int(counts.max()))


def _distinct(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step and the row of each distinct (step, row) pair of the steps ``ids[bounds[s]:bounds[s +
    1]]``, by step, then row. ``ValueError`` where the pairs' keys would overflow."""
    n = len(bounds) - 1
    width = int(ids.max(initial=0)) + 1
    if n * width >= 1 << 62:
        raise ValueError(
            f"{n} steps x row ids up to {width - 1} overflow the (step, row) keys: renumber the rows"
        )
    combined = np.sort(np.repeat(np.arange(n, dtype=np.int64), np.diff(bounds)) * width + ids)
    combined = combined[np.r_[True, combined[1:] != combined[:-1]]] if len(combined) else combined
    return combined // width, combined % width


def _check(ids: np.ndarray, bounds: np.ndarray, num_slots: int, window: int | None, ahead: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be at least 1, got {num_slots}")
    if ahead < 0:
        raise ValueError(f"ahead must be at least 0 steps, got {ahead}")
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1 step (or None: the whole epoch), got {window}")
    if ids.ndim != 1 or bounds.ndim != 1 or len(bounds) < 1:
        raise ValueError("ids and bounds must be 1-d arrays, bounds with at least one entry")
    if bounds[0] != 0 or bounds[-1] != len(ids) or np.any(np.diff(bounds) < 0):
        raise ValueError(f"bounds must rise from 0 to len(ids) = {len(ids)}, got {bounds[0]} to {bounds[-1]}")
    if len(ids) and ids.min() < 0:
        raise ValueError(f"row ids must be non-negative, got {ids.min()}")


def _by_row(rows: np.ndarray, step: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of distinct (step, row) entries: each one's row as an index of the distinct rows, those rows
    (ascending), and the step at which the entry's row is next looked up (``n``: never again); one sort
    by row, then step."""
    order = np.argsort(rows * n + step)  # the keys are distinct: any sort is the stable one
    ordered = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    dense = np.empty(len(rows), dtype=np.int64)
    dense[order] = np.cumsum(new) - 1
    following = np.full(len(rows), n, dtype=np.int64)
    same = ~new[1:]
    following[order[:-1][same]] = step[order[1:][same]]
    return dense, ordered[new], following


def _rank(next_use: np.ndarray | int, last_use: np.ndarray | int, n: int) -> np.ndarray:
    """Eviction order of resident rows, first out largest: farthest next use, then least recently used
    (``n - last_use`` is below the ``n + 2`` between next uses)."""
    return np.asarray(next_use * (n + 2) + (n - last_use))


def _farthest(
    rank: np.ndarray,
    next_use: np.ndarray,
    last_use: np.ndarray,
    horizon: int,
    n: int,
    count: int,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """The ``count`` slots to empty: the largest ``rank`` (``_rank``), next uses after ``horizon``
    counting as never (``n + 1``), none of ``keep`` (ranked as an empty slot). The step's own rows
    (next use the step) rank below every other resident, and its rows fit the slots, so none is taken;
    nor is an empty slot (rank -1)."""
    if horizon < n:
        rank = np.where(next_use > horizon, _rank(n + 1, last_use, n), rank)
    if keep is not None:
        rank = np.where(keep, -1, rank)
    return np.argpartition(rank, len(rank) - count)[len(rank) - count :]


@dataclass(frozen=True)
class SlotAllocation:
    """Slots per pool (:func:`allocate_slots`), and the rows each pool's plan with them copies in and back."""

    slots: dict[str, int]
    copied_rows: dict[str, int]


def allocate_slots(
    pools: Mapping[str, tuple[np.ndarray, np.ndarray]],
    row_bytes: Mapping[str, float],
    budget_bytes: float,
    floor: Mapping[str, int],
    window: int | None = None,
    ahead: int = 0,
) -> SlotAllocation:
    """Slots per pool within ``budget_bytes``, a slot of pool ``p`` costing ``row_bytes[p]``, at least
    ``floor[p]``: each pool (``pools[p]``: its ids and step bounds, as :func:`plan_slots` takes them)
    starts at its floor and grows a doubling at a time where its plan's copies (rows in and back) fall
    most per byte; the last growth takes what is left of the budget. Each size tried is planned
    (``window`` and ``ahead`` as :func:`plan_slots`'s), so the copies of the sizes chosen come with
    them; a pool stops at its distinct rows, where only first loads remain. The floors alone may exceed
    the budget: they are returned as they are."""
    sizes = {p: int(floor[p]) for p in pools}
    spent = sum(sizes[p] * row_bytes[p] for p in pools)
    distinct = {p: len(np.unique(ids)) for p, (ids, _) in pools.items()} if spent < budget_bytes else {}
    copies = {p: _copies(pools[p], sizes[p], window, ahead) for p in pools}
    tried: dict[str, tuple[int, int]] = {}
    while spent < budget_bytes:
        best = None
        for p in pools:
            if sizes[p] >= distinct[p]:
                continue
            if p not in tried:
                grown = min(2 * sizes[p], distinct[p])
                tried[p] = (grown, _copies(pools[p], grown, window, ahead))
            grown, fewer = tried[p]
            gain = (copies[p] - fewer) / ((grown - sizes[p]) * row_bytes[p])
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, p)
        if best is None:
            break
        p = best[1]
        grown, fewer = tried.pop(p)
        cost = (grown - sizes[p]) * row_bytes[p]
        if spent + cost > budget_bytes:
            extra = int((budget_bytes - spent) // row_bytes[p])
            if extra:
                sizes[p] += extra
                copies[p] = _copies(pools[p], sizes[p], window, ahead)
            break
        sizes[p], copies[p], spent = grown, fewer, spent + cost
    return SlotAllocation(sizes, copies)


def _copies(pool: tuple[np.ndarray, np.ndarray], num_slots: int, window: int | None, ahead: int) -> int:
    """Rows the plan of ``pool`` (ids, step bounds) with ``num_slots`` slots copies in and back."""
    plan = plan_slots(pool[0], pool[1], num_slots, window, ahead)
    return plan.rows_in + plan.rows_out
