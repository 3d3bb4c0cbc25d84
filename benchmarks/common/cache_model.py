"""Host-device embedding traffic of GPU caches, replayed batch by batch over an id stream.

FBGEMM's caches (``fused_uvm_caching``), as its CUDA kernels implement them:

- One cache per table-batched embedding (TBE) module, shared by its tables. TorchRec groups the
  ``fused_uvm_caching`` tables of one rank and sharding type into one TBE, whose cache gets the
  tables' load factors averaged by rows: ``ceil(sum(load factor x rows) / 32)`` sets of 32 ways.
- A row's set is MurmurHash3's 64-bit finalizer of its linear index (its table's row offset in the
  TBE plus the id) modulo the number of sets. Each batch is one prefetch.
- ``SetAssociativeLRU`` (``CacheAlgorithm.LRU``, ``lru_cache_populate``): every distinct row of the
  batch that is cached is a hit and gets the batch's time stamp. The misses of a set take its ways in
  order of oldest time stamp, stopping at the first way the batch already uses; misses left over are
  conflict misses, which the kernels read from and write back to host memory directly. With
  ``prefetch_pipeline=True`` the prefetch of a batch runs while the previous batch is in flight and
  FBGEMM locks that batch's ways (``lxu_cache_locking_counter``): they are not evicted either.
- ``SetAssociativeLFU`` (``CacheAlgorithm.LFU``, ``lfu_cache_populate``): a count per row of the TBE
  (``lfu_state``, kept for every row, cached or not) grows by the row's lookups in each batch before
  anything else. A set's uncached rows, most counted first (ties: lower index first), are paired with
  its ways in order of the count of the row they hold (empty ways first); a row replaces the way's
  row while that row's count is at most its own, at most 32 a set. Rows left over are read and updated
  in host memory. No way is kept for the batch's hits: a hit whose way goes to a more counted miss is
  read and updated in host memory too. Simplifications: ways of equal count are taken in way order
  (FBGEMM's bitonic sort leaves their order open), and counts never saturate (FBGEMM keeps 40 bits).
- Costs: a miss moves its row host to device; inserting into a way that holds a row writes that row
  back (FBGEMM writes back every evicted row, as training has updated it). A row read and updated in
  host memory (a conflict miss, an LFU hit whose way a miss took, every row of a ``fused_uvm`` table
  without a cache) moves as FBGEMM's UVM kernels move it (``host_access``): in once per lookup in the
  forward and once more in the backward, which writes it back once.

Belady's optimal replacement (``belady_moves``) is the lower bound for any cache of a number of
rows: one fully associative cache for everything that, after each batch, keeps the rows whose next use
is soonest. It starts preloaded, for free, with the rows it serves best (those used soonest), as the
plans' device-resident rows are: a miss moves a row in, and evicting a row written by training (used
since it was loaded) moves it out.

Replaying a Kaggle-size stream is sampled by rows (SHARDS, Waldspurger et al., FAST 2015): only rows
whose hash falls in a fixed ``1/k`` of the hash space are replayed, through caches with ``1/k`` of the
sets (or rows), and the counts are multiplied by ``k``. Each set of a hashed cache is an independent
LRU or LFU, so this keeps the load per set; the tests compare it with full replays.
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


def host_access(widths: np.ndarray, uses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What rows read and updated in host memory move in one batch (in and out, in units of their
    widths), as FBGEMM's UVM kernels access them: the forward reads a row at each of its ``uses``
    lookups, and the backward reads it and writes it back once (the fused optimizer's update of the
    row, its duplicates' gradients summed first)."""
    return widths * (uses + 1.0), widths


@dataclass(frozen=True)
class BatchedKeys:
    """Distinct non-negative keys of each batch, batch by batch in key order: batch ``b`` holds
    ``keys[bounds[b]:bounds[b + 1]]``; ``first`` is where each key first occurs in the input and
    ``uses`` how often it occurs in its batch."""

    keys: np.ndarray
    first: np.ndarray
    uses: np.ndarray
    bounds: np.ndarray

    @classmethod
    def of(cls, batches: np.ndarray, keys: np.ndarray) -> BatchedKeys:
        """Group ``keys`` by their ``batches`` index (0, 1, ...), dropping repeats within a batch."""
        width = int(keys.max(initial=0)) + 1
        combined, first, uses = np.unique(
            batches.astype(np.int64) * width + keys, return_index=True, return_counts=True
        )
        batch = combined // width
        bounds = np.searchsorted(batch, np.arange(int(batch.max(initial=-1)) + 2))
        return cls(combined % width, first, uses, bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, b: int) -> slice:
        return slice(self.bounds[b], self.bounds[b + 1])

    def batch_of(self) -> np.ndarray:
        """The batch of each key."""
        return np.repeat(np.arange(len(self)), np.diff(self.bounds))

    def subset(self, mask: np.ndarray) -> BatchedKeys:
        """The keys where ``mask`` holds, in the same batches."""
        bounds = np.searchsorted(np.flatnonzero(mask), self.bounds)
        return BatchedKeys(self.keys[mask], self.first[mask], self.uses[mask], bounds)


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


class SetAssociativeCache:
    """FBGEMM's caches of several TBE groups with one replacement policy, simulated together (their
    sets are disjoint). A row is named by a key: a non-negative int, distinct across groups.

    A prefetch gives each set's misses, the largest claim first (ties: lower key first), the set's
    ways in order of their cost, while a way's cost is at most the miss's claim and 32 at the most:
    a policy is its claims and costs (``_claims``, ``_way_costs``).

    Args:
        num_sets: sets of each group's cache (at least one).
    """

    def __init__(self, num_sets: Sequence[int]) -> None:
        self.num_sets = np.asarray(num_sets, dtype=np.int64)
        if np.any(self.num_sets < 1):
            raise ValueError(f"every cache needs at least one set, got {self.num_sets.tolist()}")
        self.set_offsets = np.concatenate([[0], np.cumsum(self.num_sets)])
        self.keys = np.full((int(self.set_offsets[-1]), WAYS), _EMPTY, dtype=np.int64)
        self.moves = Moves.zeros(len(self.num_sets))
        #: The part of ``moves`` read and updated in host memory by the lookup kernels themselves (conflict
        #: misses, lost hits), which no prefetch moves ahead of the step.
        self.direct = Moves.zeros(len(self.num_sets))

    def access(
        self,
        groups: np.ndarray,
        linear: np.ndarray,
        keys: np.ndarray,
        widths: np.ndarray | None = None,
        uses: np.ndarray | None = None,
    ) -> None:
        """One batch: its distinct rows (group, linear index in the group's TBE, key), each row's width
        (the unit moves are counted in) and lookups in the batch, 1 when not given."""
        widths = np.ones(len(keys)) if widths is None else np.asarray(widths, dtype=np.float64)
        uses = np.ones(len(keys), dtype=np.int64) if uses is None else np.asarray(uses)
        self._start(keys, uses)
        sets = self.set_offsets[groups] + (
            murmur_finalizer(linear) % self.num_sets[groups].astype(np.uint64)
        ).astype(np.int64)
        match = self.keys[sets] == keys[:, None]
        hit = match.any(axis=1)
        self._used(sets[hit], match[hit].argmax(axis=1))
        miss = ~hit
        evicted = self._insert(sets[miss], keys[miss], groups[miss], widths[miss], uses[miss])
        lost = np.isin(keys[hit], evicted)  # hits whose way a miss took: read in host memory
        self._host_access(groups[hit][lost], widths[hit][lost], uses[hit][lost])

    def _insert(
        self, sets: np.ndarray, keys: np.ndarray, groups: np.ndarray, widths: np.ndarray, uses: np.ndarray
    ) -> np.ndarray:
        """Give the batch's misses ways and count the moves; return the keys evicted."""
        claims = self._claims(keys)
        order = np.lexsort((keys, -claims, sets))
        sets, keys, groups, widths, uses, claims = (
            x[order] for x in (sets, keys, groups, widths, uses, claims)
        )
        first = np.r_[True, sets[1:] != sets[:-1]] if len(sets) else np.zeros(0, dtype=bool)
        run = np.cumsum(first) - 1
        position = np.arange(len(sets)) - np.flatnonzero(first)[run]
        cost = self._way_costs(sets[first])
        way_order = np.argsort(cost, axis=1, kind="stable")
        costs = np.take_along_axis(cost, way_order, axis=1)
        placed = position < WAYS
        placed[placed] = costs[run[placed], position[placed]] <= claims[placed]
        way, target = way_order[run[placed], position[placed]], sets[placed]
        evicted = self.keys[target, way]
        self.keys[target, way] = keys[placed]
        self._used(target, way)
        left = ~placed
        # an evicted row of a TBE group has the width of the row replacing it (one TBE, one width)
        self.moves.add(groups[placed], widths[placed], widths[placed] * (evicted != _EMPTY))
        self._host_access(groups[left], widths[left], uses[left])
        return evicted

    def _host_access(self, groups: np.ndarray, widths: np.ndarray, uses: np.ndarray) -> None:
        """Count rows read and updated in host memory (``host_access``) in ``moves`` and ``direct``."""
        for moves in (self.moves, self.direct):
            moves.add(groups, *host_access(widths, uses))

    def _start(self, keys: np.ndarray, uses: np.ndarray) -> None:
        """A batch with these rows and lookups begins."""

    def _used(self, sets: np.ndarray, ways: np.ndarray) -> None:
        """The batch uses these ways (hits and inserts)."""

    def _claims(self, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _way_costs(self, sets: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reset_moves(self) -> None:
        """Start counting afresh (after a warm-up), keeping the cache contents."""
        self.moves = Moves.zeros(len(self.num_sets))
        self.direct = Moves.zeros(len(self.num_sets))


class SetAssociativeLRU(SetAssociativeCache):
    """FBGEMM's LRU caches: a way costs its last batch's time stamp (empty: -1), and a miss claims the
    ways older than the batches in flight (this one; with ``prefetch_pipeline``, the one before too)."""

    def __init__(self, num_sets: Sequence[int], prefetch_pipeline: bool = False) -> None:
        super().__init__(num_sets)
        self.stamps = np.full(self.keys.shape, -1, dtype=np.int64)
        self.time = 0
        self.in_flight = 2 if prefetch_pipeline else 1

    def _start(self, keys: np.ndarray, uses: np.ndarray) -> None:
        self.time += 1

    def _used(self, sets: np.ndarray, ways: np.ndarray) -> None:
        self.stamps[sets, ways] = self.time

    def _claims(self, keys: np.ndarray) -> np.ndarray:
        return np.full(len(keys), self.time - self.in_flight)

    def _way_costs(self, sets: np.ndarray) -> np.ndarray:
        return self.stamps[sets]


class SetAssociativeLFU(SetAssociativeCache):
    """FBGEMM's LFU caches: every row's lookups are counted (``num_keys`` bounds the keys); a way
    costs its row's count (empty: -1) and a miss claims its own count."""

    def __init__(self, num_sets: Sequence[int], num_keys: int) -> None:
        super().__init__(num_sets)
        self.counts = np.zeros(num_keys, dtype=np.int64)

    def _start(self, keys: np.ndarray, uses: np.ndarray) -> None:
        self.counts[keys] += uses

    def _claims(self, keys: np.ndarray) -> np.ndarray:
        return self.counts[keys]

    def _way_costs(self, sets: np.ndarray) -> np.ndarray:
        held = self.keys[sets]
        return np.where(held == _EMPTY, -1, self.counts[np.maximum(held, 0)])


def belady_moves(batches: BatchedKeys, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows moved in and out in each batch by Belady's optimal cache of ``capacity`` rows.

    The cache starts with the ``capacity`` rows used soonest, loaded for free and clean; a row used
    since it was loaded is written back when evicted. Within rows of the same next use the clean
    ones go first; which ones among equals does not change the counts (they are all loaded again at
    that use). Rows are counted by next use, so each batch costs a few array operations.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be non-negative, got {capacity}")
    n = len(batches)
    batch_of = batches.batch_of()
    _, dense = np.unique(batches.keys, return_inverse=True)
    order = np.lexsort((batch_of, dense))
    same = dense[order[1:]] == dense[order[:-1]]
    following = np.full(len(dense), n)  # n: never used again
    following[order[:-1][same]] = batch_of[order[1:][same]]
    first_use = np.sort(batch_of[order[np.r_[True, ~same]]] if len(dense) else batch_of)
    clean = np.bincount(first_use[:capacity], minlength=n + 1)  # cached rows by next use
    dirty = np.zeros(n + 1, dtype=np.int64)
    held = min(capacity, len(first_use))
    moved_in, moved_out = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for b in range(n):
        span = batches.batch(b)
        misses = int(span.stop - span.start - clean[b] - dirty[b])
        clean[b] = dirty[b] = 0
        np.add.at(dirty, following[span], 1)
        held += misses
        moved_in[b] = misses
        if held > capacity:
            moved_out[b] = _evict_farthest(clean, dirty, held - capacity)
            held = capacity
    return moved_in, moved_out


def _evict_farthest(clean: np.ndarray, dirty: np.ndarray, count: int) -> int:
    """Take ``count`` rows out of the counts by next use, farthest first and clean first within a
    next use; return how many were dirty."""
    reached = np.cumsum((clean + dirty)[::-1])
    last = int(np.searchsorted(reached, count))  # next uses emptied from the top, then a partial one
    emptied = slice(len(clean) - last, len(clean))
    written = int(dirty[emptied].sum())
    clean[emptied] = dirty[emptied] = 0
    rest = count - (int(reached[last - 1]) if last else 0)
    partial = len(clean) - 1 - last
    from_clean = min(rest, int(clean[partial]))
    clean[partial] -= from_clean
    dirty[partial] -= rest - from_clean
    return written + rest - from_clean
