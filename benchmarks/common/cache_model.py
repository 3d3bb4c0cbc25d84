"""Host-device embedding traffic of GPU caches, replayed batch by batch over an id stream.

FBGEMM's LRU cache (``fused_uvm_caching`` with ``CacheAlgorithm.LRU``), as its CUDA kernels implement it:

- One cache per table-batched embedding (TBE) module, shared by its tables. TorchRec groups the
  ``fused_uvm_caching`` tables of one rank and sharding type into one TBE, whose cache gets the
  tables' load factors averaged by rows: ``ceil(sum(load factor x rows) / 32)`` sets of 32 ways.
- A row's set is MurmurHash3's 64-bit finalizer of its linear index (its table's row offset in the TBE
  plus the id) modulo the number of sets.
- Each batch is one prefetch with a new time stamp. Every distinct row of the batch that is cached is a
  hit and gets the time stamp. The misses of a set take its ways in order of oldest time stamp,
  stopping at the first way already used in this batch; misses left over are conflict misses, which
  the kernels read from and write back to host memory directly.
- Costs: a miss moves its row host to device; inserting into a way that holds a row writes that row
  back (FBGEMM writes back every evicted row, as training has updated it); a conflict miss moves its
  row both ways. A ``fused_uvm`` table without a cache moves every distinct row of a batch both ways.

Belady's optimal replacement (``belady_traffic``) is the lower bound for any cache of a number of
rows: after each batch the cache keeps the rows whose next use is soonest, one fully associative cache
for everything; a miss moves a row in and an eviction moves it out.

Replaying a Kaggle-size stream is sampled by rows (SHARDS, Waldspurger et al., FAST 2015): only rows
whose hash falls in a fixed ``1/k`` of the hash space are replayed, through caches with ``1/k`` of the
sets (or rows), and the counts are multiplied by ``k``. Each set of a hashed cache is an independent
LRU, so this keeps the load per set; the tests compare it with full replays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Ways per set of FBGEMM's cache on CUDA (``DEFAULT_ASSOC``; 64 on ROCm).
WAYS = 32
_EMPTY = -1
_MURMUR = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33))


def murmur_finalizer(keys: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (FBGEMM's ``cache_slot`` before the modulo), as uint64."""
    h = keys.astype(np.uint64)
    h ^= h >> _MURMUR[2]
    h *= _MURMUR[0]
    h ^= h >> _MURMUR[2]
    h *= _MURMUR[1]
    h ^= h >> _MURMUR[2]
    return h


def sampled_rows(keys: np.ndarray, sampling: int) -> np.ndarray:
    """Mask of the rows (any int64 keys) in the replayed ``1/sampling`` of the hash space."""
    salted = keys.astype(np.uint64) ^ np.uint64(0x5BD1E9955BD1E995)
    return (murmur_finalizer(salted) >> np.uint64(40)) % np.uint64(sampling) == 0


def cache_sets(slots: float, sampling: int = 1) -> int:
    """Sets of a cache of ``slots`` rows (FBGEMM rounds up to whole sets), in a ``1/sampling`` replay."""
    return max(1, round(np.ceil(slots / WAYS) / sampling))


@dataclass(frozen=True)
class BatchedKeys:
    """Distinct non-negative keys of each batch, batch by batch in key order: batch ``b`` holds
    ``keys[bounds[b]:bounds[b + 1]]``; ``first`` is where each key first occurs in the input."""

    keys: np.ndarray
    first: np.ndarray
    bounds: np.ndarray

    @classmethod
    def of(cls, batches: np.ndarray, keys: np.ndarray) -> BatchedKeys:
        """Group ``keys`` by their ``batches`` index (0, 1, ...), dropping repeats within a batch."""
        width = int(keys.max(initial=0)) + 1
        combined, first = np.unique(batches * width + keys, return_index=True)
        batch = combined // width
        bounds = np.searchsorted(batch, np.arange(int(batch.max(initial=-1)) + 2))
        return cls(combined % width, first, bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, b: int) -> slice:
        return slice(self.bounds[b], self.bounds[b + 1])


@dataclass
class Moves:
    """Rows moved host to device (``rows_in``) and device to host (``rows_out``), per cache group,
    each row weighted by its width when widths are given."""

    rows_in: np.ndarray
    rows_out: np.ndarray

    @classmethod
    def zeros(cls, num_groups: int) -> Moves:
        return cls(np.zeros(num_groups), np.zeros(num_groups))

    def add(self, groups: np.ndarray, rows_in: np.ndarray, rows_out: np.ndarray) -> None:
        n = len(self.rows_in)
        self.rows_in += np.bincount(groups, weights=rows_in, minlength=n)
        self.rows_out += np.bincount(groups, weights=rows_out, minlength=n)

    def total(self) -> float:
        """Everything moved, both directions, all groups."""
        return float(self.rows_in.sum() + self.rows_out.sum())


class SetAssociativeLRU:
    """FBGEMM's LRU caches of several TBE groups, simulated together (their sets are disjoint).

    Args:
        num_sets: sets of each group's cache; a group with 0 sets has no cache (``fused_uvm``).
    """

    def __init__(self, num_sets: Sequence[int]) -> None:
        self.num_sets = np.asarray(num_sets, dtype=np.int64)
        self.set_offsets = np.concatenate([[0], np.cumsum(self.num_sets)])
        total = int(self.set_offsets[-1])
        self.keys = np.full((total, WAYS), _EMPTY, dtype=np.int64)
        self.stamps = np.zeros((total, WAYS), dtype=np.int64)
        self.time = 0
        self.moves = Moves.zeros(len(self.num_sets))

    def access(self, groups: np.ndarray, linear: np.ndarray, widths: np.ndarray | None = None) -> None:
        """One batch: the distinct ``(group, linear index)`` pairs it looks up, and the width of each
        row (the unit moves are counted in; 1 when not given)."""
        self.time += 1
        widths = np.ones(len(groups)) if widths is None else np.asarray(widths, dtype=np.float64)
        uncached = self.num_sets[groups] == 0
        self.moves.add(groups[uncached], widths[uncached], widths[uncached])
        groups, linear, widths = groups[~uncached], linear[~uncached], widths[~uncached]
        sets = self.set_offsets[groups] + (
            murmur_finalizer(linear) % self.num_sets[groups].astype(np.uint64)
        ).astype(np.int64)
        # tags are made unique across groups by storing (linear, group) in one int64
        tags = linear * len(self.num_sets) + groups
        match = self.keys[sets] == tags[:, None]
        hit = match.any(axis=1)
        self.stamps[sets[hit], match[hit].argmax(axis=1)] = self.time
        self._insert(sets[~hit], tags[~hit], groups[~hit], widths[~hit])

    def _insert(self, sets: np.ndarray, tags: np.ndarray, groups: np.ndarray, widths: np.ndarray) -> None:
        order = np.lexsort((tags, sets))
        sets, tags, groups, widths = sets[order], tags[order], groups[order], widths[order]
        first = np.r_[True, sets[1:] != sets[:-1]] if len(sets) else np.zeros(0, dtype=bool)
        run = np.cumsum(first) - 1
        position = np.arange(len(sets)) - np.flatnonzero(first)[run]
        touched = sets[first]
        way_order = np.argsort(self.stamps[touched], axis=1, kind="stable")
        evictable = (np.take_along_axis(self.stamps[touched], way_order, axis=1) < self.time).sum(axis=1)
        placed = position < evictable[run]
        way = way_order[run[placed], position[placed]]
        target = sets[placed]
        evicted = self.keys[target, way] != _EMPTY
        self.keys[target, way] = tags[placed]
        self.stamps[target, way] = self.time
        conflict = ~placed
        # an evicted row of a TBE group has the width of the row replacing it (one TBE, one width)
        self.moves.add(groups[placed], widths[placed], widths[placed] * evicted)
        self.moves.add(groups[conflict], widths[conflict], widths[conflict])

    def reset_moves(self) -> None:
        """Start counting afresh (after a warm-up), keeping the cache contents."""
        self.moves = Moves.zeros(len(self.num_sets))


def belady_traffic(batches: Sequence[np.ndarray], capacity: int, count_from: int = 0) -> tuple[int, int]:
    """Rows moved in and out by Belady's optimal cache of ``capacity`` rows over ``batches`` of
    distinct row keys, counted from batch ``count_from`` on (the batches before warm the cache; it
    starts empty, as every cache does)."""
    if capacity < 0:
        raise ValueError(f"capacity must be non-negative, got {capacity}")
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    batch_of = np.repeat(np.arange(len(batches)), sizes)
    keys = np.concatenate(batches) if len(batches) else np.zeros(0, dtype=np.int64)
    rows, dense = np.unique(keys, return_inverse=True)
    order = np.lexsort((batch_of, dense))
    following = np.full(len(dense), np.iinfo(np.int64).max)
    same = dense[order[1:]] == dense[order[:-1]]
    following[order[:-1][same]] = batch_of[order[1:][same]]
    in_cache = np.zeros(len(rows), dtype=bool)
    next_use = np.zeros(len(rows), dtype=np.int64)
    held, moved_in, moved_out = 0, 0, 0
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for b in range(len(batches)):
        ids = dense[bounds[b] : bounds[b + 1]]
        misses = int((~in_cache[ids]).sum())
        in_cache[ids] = True
        next_use[ids] = following[bounds[b] : bounds[b + 1]]
        held += misses
        evict = max(held - capacity, 0)
        if evict:
            cached = np.flatnonzero(in_cache)
            victims = cached[np.argpartition(-next_use[cached], evict - 1)[:evict]]
            in_cache[victims] = False
            held -= evict
        if b >= count_from:
            moved_in, moved_out = moved_in + misses, moved_out + evict
    return moved_in, moved_out
