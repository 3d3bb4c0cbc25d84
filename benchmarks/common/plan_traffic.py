"""Host-device traffic of a TorchRec ``ShardingPlan`` over an id stream, through FBGEMM's cache model.

``cache_groups`` reads the plan's UVM shards (``fused_uvm_caching`` and ``fused_uvm``; every other
kernel keeps its rows in device memory and moves nothing) and groups them as TorchRec groups tables
into TBE modules: one cache per rank, sharding type, kernel and cache policy (``CacheParams``'
algorithm and ``prefetch_pipeline``), sized by the shards' load factors (FBGEMM's default 0.2 where
the plan sets none). ``replay`` routes each lookup to the shards that hold its row (all column shards
of it, the row shard whose range holds it) and runs the batches through the groups' caches
(``cache_model.SetAssociativeLRU`` or ``SetAssociativeLFU``); a ``fused_uvm`` shard moves its rows as
FBGEMM's UVM kernels move them (``cache_model.host_access``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingPlan

from benchmarks.common.cache_model import (
    BatchedKeys,
    Moves,
    SetAssociativeCache,
    SetAssociativeLFU,
    SetAssociativeLRU,
    cache_sets,
    host_access,
)

#: FBGEMM's cache load factor where TorchRec passes none.
FBGEMM_DEFAULT_LOAD_FACTOR = 0.2
#: Bytes per embedding element (fp32 weights, as in the cache).
ELEMENT_BYTES = 4
UVM_KERNELS = (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.FUSED_UVM.value)


@dataclass(frozen=True)
class CachePolicy:
    """How a TBE's cache replaces rows (FBGEMM's defaults: LRU, no prefetch pipeline)."""

    algorithm: CacheAlgorithm = CacheAlgorithm.LRU
    prefetch_pipeline: bool = False

    @classmethod
    def of(cls, params: CacheParams | None) -> CachePolicy:
        params = params or CacheParams()
        return cls(params.algorithm or CacheAlgorithm.LRU, bool(params.prefetch_pipeline))

    def simulator(self, num_sets: list[int], num_keys: int) -> SetAssociativeCache:
        """The cache model of groups with ``num_sets`` sets, for keys below ``num_keys``."""
        if self.algorithm == CacheAlgorithm.LFU:
            return SetAssociativeLFU(num_sets, num_keys)
        return SetAssociativeLRU(num_sets, self.prefetch_pipeline)


@dataclass(frozen=True)
class UvmShard:
    """One UVM shard of a table: its rows ``[row_start, row_end)`` and columns, and its cache group."""

    table: str
    row_start: int
    row_end: int
    columns: int
    group: int
    base: int


@dataclass(frozen=True)
class CacheGroups:
    """The UVM caches of a plan: per group its cache slots, policy (None: ``fused_uvm``, no cache)
    and rank, and the shards."""

    shards: list[UvmShard]
    slots: np.ndarray
    policies: list[CachePolicy | None]
    ranks: np.ndarray

    @property
    def signature(self) -> tuple:
        """What the replay depends on: plans with equal signatures move the same rows."""
        return (
            tuple(self.shards),
            tuple(self.slots.tolist()),
            tuple(self.policies),
            tuple(self.ranks.tolist()),
        )

    @property
    def cached(self) -> np.ndarray:
        """Mask of the groups with a cache."""
        return np.array([p is not None for p in self.policies], dtype=bool)

    @property
    def cache_slots(self) -> float:
        """Rows of device memory all caches take."""
        return float(self.slots.sum())

    @property
    def busiest_rank_caches(self) -> int:
        """The most caches (TBE modules with a cache) on one rank: FBGEMM's cache machinery (linearize,
        unique, lookup, prefetch, insert) runs once per cache and step."""
        cached = self.ranks[self.cached]
        return int(np.bincount(cached).max()) if len(cached) else 0


def cache_groups(
    plan: ShardingPlan, table_names: Callable[[str], str | None] = lambda name: name
) -> CacheGroups:
    """The UVM shards of ``plan``, grouped into TBE caches; ``table_names`` maps a planned table's name
    to the stream's table name (None: not replayed)."""
    keys: dict[tuple[int, str, str, CachePolicy | None], int] = {}
    shards: list[UvmShard] = []
    slots: dict[int, float] = {}
    bases: dict[int, int] = {}
    for module_plan in plan.plan.values():
        for name, sharding in module_plan.items():
            table = table_names(name)
            if table is None or sharding.compute_kernel not in UVM_KERNELS:
                continue
            load_factor = (sharding.cache_params.load_factor if sharding.cache_params else None) or (
                FBGEMM_DEFAULT_LOAD_FACTOR
            )
            caching = sharding.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
            policy = CachePolicy.of(sharding.cache_params) if caching else None
            for shard in sharding.sharding_spec.shards:
                key = (shard.placement.rank(), sharding.sharding_type, sharding.compute_kernel, policy)
                group = keys.setdefault(key, len(keys))
                rows = int(shard.shard_sizes[0])
                start = int(shard.shard_offsets[0])
                shards.append(
                    UvmShard(
                        table, start, start + rows, int(shard.shard_sizes[1]), group, bases.get(group, 0)
                    )
                )
                bases[group] = bases.get(group, 0) + rows
                slots[group] = slots.get(group, 0.0) + (load_factor * rows if caching else 0.0)
    return CacheGroups(
        shards,
        np.array([slots[g] for g in range(len(keys))]),
        [key[3] for key in keys],
        np.array([key[0] for key in keys], dtype=np.int64),
    )


@dataclass(frozen=True)
class Traffic:
    """Bytes moved host to device (``bytes_in``) and device to host (``bytes_out``) per cache group,
    scaled back from the sample, and each group's rank."""

    bytes_in: np.ndarray
    bytes_out: np.ndarray
    ranks: np.ndarray
    #: The part of the bytes the lookup kernels move themselves (``fused_uvm`` rows, conflict misses,
    #: lost hits: ``cache_model.host_access``) rather than a prefetch ahead of the step; None where not
    #: counted.
    direct: Traffic | None = None

    @property
    def bytes(self) -> float:
        """Everything moved, both directions, all ranks."""
        return float(self.bytes_in.sum() + self.bytes_out.sum())

    def busiest_link(self) -> float:
        """Bytes over the busiest rank's host-device link in its busier direction (links are full
        duplex)."""
        if not len(self.ranks):
            return 0.0
        n = int(self.ranks.max()) + 1
        per_rank = [np.bincount(self.ranks, weights=w, minlength=n) for w in (self.bytes_in, self.bytes_out)]
        return float(max(x.max() for x in per_rank))


def replay(
    groups: CacheGroups,
    batches: np.ndarray,
    tables: np.ndarray,
    ids: np.ndarray,
    table_index: dict[str, int],
    sampling: int,
    count_from: int,
    ends: Sequence[int],
) -> list[Traffic]:
    """Replay lookups (batch index, stream table index, id; batches in order) through ``groups``.

    Batches before ``count_from`` warm the caches; one ``Traffic`` per end counts the batches from
    ``count_from`` up to that end (exclusive), all from one replay that stops at the last end, with the
    part the lookup kernels move themselves (``Traffic.direct``).
    """
    last = max(ends)
    kept = batches < last
    batches, tables, ids = batches[kept], tables[kept], ids[kept]
    order = np.argsort(tables, kind="stable")
    starts = np.searchsorted(tables[order], np.arange(len(table_index) + 1))
    routed = []
    for s, shard in enumerate(groups.shards):
        t = table_index[shard.table]
        mine = order[starts[t] : starts[t + 1]]
        mine = mine[(ids[mine] >= shard.row_start) & (ids[mine] < shard.row_end)]
        routed.append((batches[mine], ids[mine] - shard.row_start + shard.base, np.full(len(mine), s)))
    num_groups = len(groups.slots)
    windows = [Moves.zeros(num_groups) for _ in ends]
    direct = [Moves.zeros(num_groups) for _ in ends]
    if routed:
        batch, linear, shard = (np.concatenate(parts) for parts in zip(*routed, strict=True))
        group = np.array([s.group for s in groups.shards])[shard]
        columns = np.array([s.columns for s in groups.shards])[shard]
        # distinct (group, linear index) per batch; a linear index has one shard (and width)
        distinct = BatchedKeys.of(batch, linear * num_groups + group)
        columns = columns[distinct.first]
        group = distinct.keys % num_groups
        batch_of = distinct.batch_of()
        for end, moves, moved_direct in zip(ends, windows, direct, strict=True):
            uncached = ~groups.cached[group] & (batch_of >= count_from) & (batch_of < end)
            for counted in (moves, moved_direct):
                counted.add(group[uncached], *host_access(columns[uncached], distinct.uses[uncached]))
        for policy in dict.fromkeys(p for p in groups.policies if p is not None):
            _replay_caches(groups, policy, distinct, columns, sampling, count_from, ends, windows, direct)
    scale = ELEMENT_BYTES * sampling

    def traffic(m: Moves, direct: Traffic | None = None) -> Traffic:
        return Traffic(m.rows_in * scale, m.rows_out * scale, groups.ranks, direct)

    return [traffic(m, traffic(d)) for m, d in zip(windows, direct, strict=True)]


def _replay_caches(
    groups: CacheGroups,
    policy: CachePolicy,
    distinct: BatchedKeys,
    columns: np.ndarray,
    sampling: int,
    count_from: int,
    ends: Sequence[int],
    windows: list[Moves],
    direct: list[Moves],
) -> None:
    """Replay the rows of the groups with ``policy`` through their caches; add what moved from
    ``count_from`` to each end to its window, and the part the lookup kernels moved to ``direct``'s."""
    mine = np.array([p == policy for p in groups.policies], dtype=bool)
    local = np.cumsum(mine) - 1
    num_groups = len(groups.slots)
    kept = mine[distinct.keys % num_groups]
    rows, widths = distinct.subset(kept), columns[kept]
    group, linear = local[rows.keys % num_groups], rows.keys // num_groups
    # keys in row order; LFU counts every row, so its keys are made dense
    keys = (
        np.unique(rows.keys, return_inverse=True)[1] if policy.algorithm == CacheAlgorithm.LFU else rows.keys
    )
    cache = policy.simulator(
        [cache_sets(s, sampling) for s in groups.slots[mine]], int(keys.max(initial=-1)) + 1
    )
    stops = {min(end, len(rows)) for end in ends}
    counted: dict[int, tuple[Moves, Moves]] = {}  # the moves (all, direct) from count_from up to each stop
    for b in range(len(rows) + 1):
        if b == count_from:
            cache.reset_moves()
        if b in stops and b >= count_from:
            counted[b] = tuple(
                Moves(m.rows_in.copy(), m.rows_out.copy()) for m in (cache.moves, cache.direct)
            )
        if b < len(rows):
            span = rows.batch(b)
            cache.access(group[span], linear[span], keys[span], widths[span], rows.uses[span])
    for end, *into in zip(ends, windows, direct, strict=True):
        for moves, window in zip(into, counted.get(min(end, len(rows)), ()), strict=False):
            moves.rows_in[mine] += window.rows_in
            moves.rows_out[mine] += window.rows_out
