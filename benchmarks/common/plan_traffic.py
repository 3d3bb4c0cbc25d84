"""Host-device traffic of a TorchRec ``ShardingPlan`` over an id stream, through FBGEMM's cache model.

``cache_groups`` reads the plan's UVM shards (``fused_uvm_caching`` and ``fused_uvm``; every other
kernel keeps its rows in device memory and moves nothing) and groups them as TorchRec groups tables
into TBE modules: one cache per rank, sharding type and kernel, sized by the shards' load factors
(FBGEMM's default 0.2 where the plan sets none). ``replay`` routes each lookup to the shards that hold
its row (all column shards of it, the row shard whose range holds it) and runs the batches through
``cache_model.SetAssociativeLRU``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ShardingPlan

from benchmarks.common.cache_model import BatchedKeys, SetAssociativeLRU, cache_sets

#: FBGEMM's cache load factor where TorchRec passes none.
FBGEMM_DEFAULT_LOAD_FACTOR = 0.2
#: Bytes per embedding element (fp32 weights, as in the cache).
ELEMENT_BYTES = 4
UVM_KERNELS = (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.FUSED_UVM.value)


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
    """The UVM caches of a plan: per group its cache slots (0: ``fused_uvm``, no cache) and shards."""

    shards: list[UvmShard]
    slots: np.ndarray
    cached: np.ndarray

    @property
    def cache_slots(self) -> float:
        """Rows of device memory all caches take."""
        return float(self.slots.sum())


def cache_groups(
    plan: ShardingPlan, table_names: Callable[[str], str | None] = lambda name: name
) -> CacheGroups:
    """The UVM shards of ``plan``, grouped into TBE caches; ``table_names`` maps a planned table's name
    to the stream's table name (None: not replayed)."""
    keys: dict[tuple[int, str, str], int] = {}
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
            for shard in sharding.sharding_spec.shards:
                key = (shard.placement.rank(), sharding.sharding_type, sharding.compute_kernel)
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
    cached = np.array([key[2] == EmbeddingComputeKernel.FUSED_UVM_CACHING.value for key in keys], dtype=bool)
    return CacheGroups(shards, np.array([slots[g] for g in range(len(keys))]), cached)


@dataclass(frozen=True)
class Traffic:
    """Rows and bytes moved between host and device (both directions), scaled back from the sample."""

    rows: float
    bytes: float


def replay(
    groups: CacheGroups,
    batches: np.ndarray,
    tables: np.ndarray,
    ids: np.ndarray,
    table_index: dict[str, int],
    sampling: int,
    count_from: int,
    row_bytes: int,
) -> Traffic:
    """Replay lookups (batch index, stream table index, id; batches in order) through ``groups``.

    Batches before ``count_from`` warm the caches; traffic is counted from it on. ``row_bytes`` is a
    full row's bytes, the unit of ``Traffic.rows``.
    """
    order = np.argsort(tables, kind="stable")
    starts = np.searchsorted(tables[order], np.arange(len(table_index) + 1))
    routed = []
    for s, shard in enumerate(groups.shards):
        t = table_index[shard.table]
        mine = order[starts[t] : starts[t + 1]]
        mine = mine[(ids[mine] >= shard.row_start) & (ids[mine] < shard.row_end)]
        routed.append((batches[mine], ids[mine] - shard.row_start + shard.base, np.full(len(mine), s)))
    if not routed:
        return Traffic(0.0, 0.0)
    batch, linear, shard = (np.concatenate(parts) for parts in zip(*routed, strict=True))
    group = np.array([s.group for s in groups.shards])[shard]
    columns = np.array([s.columns for s in groups.shards])[shard]
    # distinct (group, linear index) per batch; a linear index has one shard (and width)
    distinct = BatchedKeys.of(batch, linear * len(groups.slots) + group)
    columns = columns[distinct.first]
    linear, group = distinct.keys // len(groups.slots), distinct.keys % len(groups.slots)
    num_sets = [cache_sets(s, sampling) if c else 0 for s, c in zip(groups.slots, groups.cached, strict=True)]
    cache = SetAssociativeLRU(num_sets)
    for b in range(len(distinct)):
        if b == count_from:
            cache.reset_moves()
        span = distinct.batch(b)
        cache.access(group[span], linear[span], columns[span])
    if count_from >= len(distinct):
        cache.reset_moves()
    moved_bytes = float(cache.moves.total()) * ELEMENT_BYTES * sampling
    return Traffic(moved_bytes / row_bytes, moved_bytes)
