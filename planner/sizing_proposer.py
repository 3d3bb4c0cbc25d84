"""``SizingProposer``: FAE's search over cold-part sizings as one TorchRec ``Proposer``.

The cold parts of a split model can go whole into HBM, into UVM caches of several sizes, or into UVM
without a cache; each choice (a *sizing*) is a set of ``ParameterConstraints`` and so its own search
space. Where TorchRec cannot place a sizing, FAE tries a smaller one, as TorchRec's
``EmbeddingOffloadScaleupProposer`` grows caches: propose, be told whether it fits, change the size.
``SizingProposer`` runs TorchRec's own proposers over each sizing's search space in turn, inside one
``EmbeddingShardingPlanner.plan`` call, and learns from their feedback whether the sizing placed; the
search (``cold_sizing_search``, a generator sent that answer) picks the next sizing. A sizing whose least
storage cannot fit the devices (TorchRec's own estimates) is answered without partitioning a proposal.

Within a sizing TorchRec's rating picks the plan, as in a planner run of that sizing alone; across
sizings FAE's two-step prediction decides, so every placed sizing's best plan is kept (``placed``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from torchrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology

#: A plan's cold sizing: load factors by table, and the kernel options of ``fae_constraints`` (booleans)
#: or, for a TorchRec configuration's plan, that configuration (``config``).
Sizing: TypeAlias = tuple[dict[str, float], dict[str, Any]]
#: The search: yields each sizing to try and is sent whether TorchRec placed it.
SizingSearch: TypeAlias = Generator[Sizing, bool, Any]
#: A sizing's search space and the enumerator that priced it.
SearchSpace: TypeAlias = tuple[list[ShardingOption], Enumerator]
#: Whether one sizing's load factors ask at least as much device memory as another's.
AsksAtLeast: TypeAlias = Callable[[dict[str, float], dict[str, float]], bool]
#: One step of the search: yields sizings, returns whether the last one it tried placed.
SizingStep: TypeAlias = Generator[Sizing, bool, bool]


def default_proposers() -> list[Proposer]:
    """TorchRec's default proposers, as ``EmbeddingShardingPlanner`` makes them when given none."""
    return [GridSearchProposer(), GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()]


def try_sizing(sizing: Sizing, unplaced: list[dict[str, float]], asks_at_least: AsksAtLeast) -> SizingStep:
    """Yield ``sizing`` and return whether it placed. A sizing without kernel options that asks at
    least as much as one that did not place (``unplaced``, which this extends) is not tried."""
    load_factors, options = sizing
    if not options and any(asks_at_least(load_factors, other) for other in unplaced):
        return False
    placed = yield sizing
    if not placed and not options:
        unplaced.append(load_factors)
    return placed


def largest_placed(sizings: list[Sizing], place: Callable[[Sizing], SizingStep]) -> SizingStep:
    """Whether one of ``sizings`` (ordered from the largest caches to the smallest) places, trying the
    largest first, then the smallest, then bisecting between them: at most ``2 + log2(len(sizings))``
    tries where trying each in turn took one per sizing. Assumes that TorchRec places smaller caches
    wherever it places larger ones."""
    if not sizings:
        return False
    if (yield from place(sizings[0])):
        return True
    if len(sizings) == 1 or not (yield from place(sizings[-1])):
        return False
    failed, placed = 0, len(sizings) - 1
    while placed - failed > 1:
        middle = (failed + placed) // 2
        if (yield from place(sizings[middle])):
            placed = middle
        else:
            failed = middle
    return True


def cold_sizing_search(
    known: Sizing | None,
    whole: dict[str, float],
    full: dict[str, float],
    smaller: list[dict[str, float]],
    asks_at_least: AsksAtLeast,
) -> SizingSearch:
    """FAE's order of cold sizings: a ``known`` sizing alone where it places; else the cold parts whole
    in HBM where the budget pays for them (``whole``), caches from the whole budget (``full``), and where
    neither places the largest of the ``smaller`` caches that places and ``full`` with ``fused_uvm``
    allowed too (``uncached``)."""
    unplaced: list[dict[str, float]] = []

    def place(sizing: Sizing) -> SizingStep:
        return try_sizing(sizing, unplaced, asks_at_least)

    if known and (yield from place(known)):
        return
    if (yield from place((whole, {}))) or (full != whole and (yield from place((full, {})))):
        return
    yield from largest_placed([(factors, {}) for factors in smaller], place)
    yield from place((full, {"uncached": True}))


@dataclass
class PlacedSizing:
    """A sizing TorchRec placed: its best plan by TorchRec's rating and the enumerator that priced it."""

    sizing: Sizing
    enumerator: Enumerator
    plan: list[ShardingOption] = field(default_factory=list)
    rating: float = float("inf")


class SizingProposer(Proposer):
    """TorchRec's proposers (``proposers``, its defaults) over one sizing's search space after another.

    A sizing is first enumerated with TorchRec's storage estimates only (a tenth of the time with its perf
    estimates too, at 32 and 128 GPUs): where its least options cannot fit the devices (``fits``), it
    is answered "not placed" at once, as TorchRec's partitioner would answer each of its proposals.

    Args:
        search: the sizings to try (``cold_sizing_search``), already started: ``first`` is the sizing
            it yielded first, which the planner enumerates, with storage estimates only, for ``load``.
        first: that sizing.
        storage: a later sizing's sharding options with TorchRec's storage estimates only.
        search_space: a sizing's search space with all of TorchRec's estimates, and its enumerator.
        capacity: the devices' storage after TorchRec's reservation (``StorageReservation.reserve``).
        proposers: the proposers run over each sizing: TorchRec's defaults.
    """

    def __init__(
        self,
        search: SizingSearch,
        first: Sizing,
        storage: Callable[[Sizing], list[ShardingOption]],
        search_space: Callable[[Sizing], SearchSpace],
        capacity: Topology,
        proposers: Callable[[], list[Proposer]] = default_proposers,
    ) -> None:
        self._search = search
        self._first = first
        self._storage = storage
        self._search_space = search_space
        self._capacity = capacity
        self._proposers = proposers
        self._inner: list[Proposer] = []
        self._current: PlacedSizing | None = None
        #: The sizings tried, in order, with whether each placed, and of those that placed, their best plans.
        self.tried: list[tuple[Sizing, bool]] = []
        self.placed: list[PlacedSizing] = []

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        self._start(self._first, search_space)

    def _start(self, sizing: Sizing, storage: list[ShardingOption]) -> None:
        """Load the proposers with ``sizing``'s search space, or none where its options with their
        storage estimates (``storage``) cannot fit."""
        self._inner, self._current = [], None
        if not fits(storage, self._capacity):
            self.tried.append((sizing, False))
            return
        options, enumerator = self._search_space(sizing)
        self._current = PlacedSizing(sizing, enumerator)
        self._inner = self._proposers()
        for proposer in self._inner:
            proposer.load(options, enumerator)

    def propose(self) -> list[ShardingOption] | None:
        while True:
            while self._inner:
                proposal = self._inner[0].propose()
                if proposal:
                    return proposal
                self._inner.pop(0)
            try:
                sizing = self._search.send(self._placed())
            except StopIteration:
                return None
            self._start(sizing, self._storage(sizing))

    def _placed(self) -> bool:
        """Whether the sizing whose proposals are done placed (recorded in ``tried`` and ``placed``)."""
        current = self._current
        if current is None:  # ruled out by ``fits``, and recorded then
            return False
        placed = bool(current.plan)
        self.tried.append((current.sizing, placed))
        if placed:
            self.placed.append(current)
        return placed

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        current = self._current
        assert current is not None and self._inner  # feedback follows a proposal
        if partitionable and plan and perf_rating is not None and perf_rating < current.rating:
            current.plan, current.rating = copy.deepcopy(plan), perf_rating
        self._inner[0].feedback(partitionable, plan, perf_rating, storage_constraint)


def least_storage(
    options: list[ShardingOption], largest_shard: tuple[int, int] | None = None
) -> dict[str, tuple[int, int]]:
    """Per table (``fqn``), the least HBM and the least DDR of its options, by TorchRec's storage
    estimates of their shards; with ``largest_shard`` (HBM, DDR), of the options whose shards each fit
    that, and tables with no such option left out."""
    least: dict[str, tuple[int, int]] = {}
    for option in options:
        storages = [shard.storage for shard in option.shards]
        assert all(s is not None for s in storages)  # the enumerator estimated them
        if largest_shard and (
            max(s.hbm for s in storages) > largest_shard[0] or max(s.ddr for s in storages) > largest_shard[1]
        ):
            continue
        total = (sum(s.hbm for s in storages), sum(s.ddr for s in storages))
        best = least.get(option.fqn)
        least[option.fqn] = total if best is None else (min(best[0], total[0]), min(best[1], total[1]))
    return least


def fits(options: list[ShardingOption], capacity: Topology) -> bool:
    """Whether some plan of the search space ``options`` may fit ``capacity``, by TorchRec's storage
    estimates: each table has an option whose shards each fit a device, and the least such options of
    all tables together fit the devices' total. Where not, every proposal fails to partition."""
    devices = [device.storage for device in capacity.devices]
    least = least_storage(options, (max(s.hbm for s in devices), max(s.ddr for s in devices)))
    if len(least) < len({option.fqn for option in options}):
        return False
    return sum(h for h, _ in least.values()) <= sum(s.hbm for s in devices) and sum(
        d for _, d in least.values()
    ) <= sum(s.ddr for s in devices)
