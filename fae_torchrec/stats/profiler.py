"""FAE's access profiler: count row accesses per table on a random sample of the inputs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from tqdm import tqdm

from fae_torchrec.seeds import generator
from fae_torchrec.stats.access_stats import AccessStats, Holdout
from fae_torchrec.stats.feature_ids import BatchLike, FeatureIds
from fae_torchrec.stats.paged import paged_zeros
from fae_torchrec.tables import TableLayout

logger = logging.getLogger(__name__)

#: Standard deviations of margin in the holdout's bound (:meth:`AccessProfiler.holdout_short`).
HOLDOUT_MARGIN = 8.0


@dataclass(frozen=True)
class ProfiledShare:
    """What a profiler of one share of the data saw, less its counts (which add up): its inputs, those
    it sampled, and its holdout's candidates: their draws, rows, and which of them each row is of (both
    in the narrowest unsigned dtype that holds them: a share goes to every rank)."""

    num_inputs: int
    num_sampled: int
    draws: np.ndarray
    rows: np.ndarray
    owners: np.ndarray


def _compact(values: np.ndarray) -> np.ndarray:
    """Non-negative integers in the narrowest dtype that holds them: what a share sends other ranks."""
    return values.astype(np.min_scalar_type(int(values.max()))) if len(values) else values


def profile_draws(seed: int, first_input: int = 0) -> np.random.Generator:
    """The draws of the profile of ``seed``, one an input, from input ``first_input`` on: an input is
    sampled where its draw is below the sample fraction (:meth:`AccessProfiler.update`), so that which
    inputs a profile sampled can be drawn again without it."""
    draws = generator(seed, "profile")
    bits = draws.bit_generator
    assert isinstance(bits, np.random.PCG64)  # numpy's default, which can jump ahead
    bits.advance(first_input)
    return draws


class AccessProfiler:
    """Streams over batches, counting the accesses of a seeded random sample of inputs.

    Each input is drawn into the sample independently with probability ``sample_fraction``. Of the
    inputs left out, a uniform random ``holdout_size`` are kept (as their rows only, bounded memory):
    they estimate, without bias, the share of unseen inputs that a hot set makes entirely hot.

    Args:
        tables: the embedding tables the inputs look up.
        sample_fraction: probability that an input is counted (FAE uses 5% for DLRM).
        seed: seed of the sampling.
        holdout_size: inputs kept out of the sample for hot-input share estimates (0: none).
        first_input: where in the data its inputs start: the profilers of consecutive shares of the
            data (one per rank) draw what one profiler of all of it draws, and :meth:`join` makes one.
        total_inputs: the inputs of all shares, where known: the holdout then never keeps an input
            drawn above the draw that ``holdout_size`` of them stay under but for ``HOLDOUT_MARGIN``
            standard deviations (a share's profiler keeps about its own part of the holdout, not
            ``holdout_size``); :meth:`holdout_short` says when the margin did not hold.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        sample_fraction: float = 0.05,
        seed: int = 0,
        holdout_size: int = 100_000,
        first_input: int = 0,
        total_inputs: int | None = None,
    ) -> None:
        if not 0.0 < sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1], got {sample_fraction}")
        if holdout_size < 0:
            raise ValueError(f"holdout_size must be non-negative, got {holdout_size}")
        self.layout = TableLayout.of(tables)
        self.sample_fraction = sample_fraction
        self._rng = profile_draws(seed, first_input)
        # Counts of every row, in memory paged in as rows are counted (a small profile of large
        # tables costs little).
        self.counts = [paged_zeros(int(n), np.int64) for n in self.layout.num_rows]
        self._offsets = np.concatenate([[0], np.cumsum(self.layout.num_rows)])
        bound = 1.0
        if total_inputs:
            held = holdout_size + HOLDOUT_MARGIN * np.sqrt(holdout_size)
            bound = min(1.0, sample_fraction + held / total_inputs)
        self._holdout = _BottomK(holdout_size, bound)
        self.num_inputs = 0
        self.num_sampled = 0

    def update(self, data: BatchLike) -> np.ndarray:
        """Count the sampled inputs of one batch; return the mask of the inputs that were counted."""
        ids = FeatureIds.of(data)
        ids.check(self.layout)
        draw = self._rng.random(ids.stride)
        sampled = draw < self.sample_fraction
        for key, values in ids.subset(sampled).values.items():
            np.add.at(self.counts[self.layout.table_of(key)], values, 1)
        held = self._holdout.wants(draw, ~sampled)
        if held.any():
            part = ids.subset(held)
            keys = list(part.values)
            rows = [part.values[k] + self._offsets[self.layout.table_of(k)] for k in keys]
            owners = [part.input_index(k) for k in keys]
            self._holdout.add(draw[held], np.concatenate(rows), np.concatenate(owners))
        self.num_inputs += ids.stride
        self.num_sampled += int(sampled.sum())
        return sampled

    def profile(
        self, batches: Iterable[BatchLike], total: int | None = None, progress: bool = False
    ) -> AccessStats:
        """Update with every batch and return the stats (``progress`` draws a bar over ``total`` inputs)."""
        bar = tqdm(
            total=total, desc="profiling", unit="input", unit_scale=True, leave=False, disable=not progress
        )
        for batch in batches:
            bar.update(len(self.update(batch)))
        bar.close()
        return self.stats()

    @property
    def holdout_size(self) -> int:
        return self._holdout.k

    def holdout_short(self) -> bool:
        """Whether the holdout kept fewer inputs than it would have without the bound ``total_inputs``
        set (fewer than ``holdout_size``, of more left out): the data held fewer inputs under it than
        the margin allows for, or more than ``total_inputs``. Profile again without the bound."""
        holdout = self._holdout
        left_out = self.num_inputs - self.num_sampled
        return holdout.bound < 1.0 and min(holdout.held, holdout.k) < min(holdout.k, left_out)

    def holdout_draws(self) -> np.ndarray:
        """The draws of the inputs its holdout keeps so far (at most ``holdout_size``)."""
        return self._holdout.candidates()[0]

    def holdout_below(self, draws: Sequence[np.ndarray]) -> float:
        """The largest draw the holdout of all shares keeps, from each share's :meth:`holdout_draws`."""
        every = np.concatenate(draws) if draws else np.empty(0)
        k = self.holdout_size
        return float(np.partition(every, k - 1)[k - 1]) if len(every) > k else 1.0

    def share(self, below: float = 1.0) -> ProfiledShare:
        """What this profiler saw, less its counts, for :meth:`join`: of its holdout, the inputs drawn
        at most ``below`` (all by default; the largest draw the joined holdout keeps, where the
        shares' :meth:`holdout_draws` tell it, sends no more than it keeps)."""
        draws, rows, owners = self._holdout.candidates()
        kept = draws <= below
        if not kept.all():
            positions = np.cumsum(kept) - 1
            rows, owners = rows[kept[owners]], positions[owners[kept[owners]]]
            draws = draws[kept]
        return ProfiledShare(self.num_inputs, self.num_sampled, draws, _compact(rows), _compact(owners))

    def join(self, shares: Sequence[ProfiledShare]) -> None:
        """Become the profiler of all ``shares`` (consecutive shares of the data, in its order, this
        one's among them; add their counts into :attr:`counts` first): its totals and holdout those
        of one profiler over all of them."""
        holdout = _BottomK(self._holdout.k, self._holdout.bound)
        for share in shares:
            if len(share.draws):
                holdout.add(share.draws, share.rows.astype(np.int64), share.owners.astype(np.int64))
        self._holdout = holdout
        self.num_inputs = sum(share.num_inputs for share in shares)
        self.num_sampled = sum(share.num_sampled for share in shares)

    def stats(self) -> AccessStats:
        """The statistics so far, the rows seen and their counts (a later ``update`` leaves them
        alone). Raises ``ValueError`` when no input was sampled."""
        if self.num_sampled == 0:
            raise ValueError(
                f"no input was sampled: {self.num_inputs} inputs seen at sample fraction "
                f"{self.sample_fraction} (empty data, or too few inputs for this fraction)"
            )
        logger.info(
            "profiled %d of %d inputs (%.2f%%); holdout %d inputs",
            self.num_sampled,
            self.num_inputs,
            100.0 * self.num_sampled / self.num_inputs,
            self._holdout.held,
        )
        return AccessStats.of_counts(
            self.layout.configs, self.counts, self.num_inputs, self.num_sampled, self._holdout.holdout()
        )


class _BottomK:
    """The ``k`` eligible inputs with the smallest draws so far: a uniform sample of a stream.

    Inputs are numbered in the order they are added (serials) and each row keeps its input's
    serial. New inputs are kept in pieces and cut back to the ``k`` smallest draws once twice that
    many are held. None drawn at or above ``bound`` is kept.
    """

    def __init__(self, k: int, bound: float = 1.0) -> None:
        self.k, self.bound = k, bound
        self.keys: list[np.ndarray] = []
        self.serials: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.row_serials: list[np.ndarray] = []
        self.held = 0
        self.next_serial = 0
        self.threshold = bound if k > 0 else 0.0

    def wants(self, draw: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """Mask of the eligible inputs whose draw may place them among the ``k`` smallest."""
        return eligible & (draw < self.threshold)

    def add(self, keys: np.ndarray, rows: np.ndarray, owners: np.ndarray) -> None:
        """Add inputs with draws ``keys``; ``rows[i]`` belongs to input ``owners[i]`` of them."""
        self.keys.append(keys)
        self.serials.append(np.arange(self.next_serial, self.next_serial + len(keys)))
        self.rows.append(rows)
        self.row_serials.append(owners + self.next_serial)
        self.next_serial += len(keys)
        self.held += len(keys)
        if self.held >= 2 * self.k:
            self._cut()

    def _cut(self) -> tuple[np.ndarray, int]:
        """Cut back to the ``k`` smallest draws; return the kept serials' mask over all serials
        and the first serial it starts at."""
        keys, serials = np.concatenate(self.keys), np.concatenate(self.serials)
        if len(keys) > self.k:
            self.threshold = float(np.partition(keys, self.k - 1)[self.k - 1])
        kept = keys <= self.threshold
        base = int(serials[0])
        by_serial = np.zeros(self.next_serial - base, dtype=bool)
        by_serial[serials[kept] - base] = True
        self.keys, self.serials = [keys[kept]], [serials[kept]]
        row_serials = np.concatenate(self.row_serials)
        rows_kept = by_serial[row_serials - base]
        self.rows = [np.concatenate(self.rows)[rows_kept]]
        self.row_serials = [row_serials[rows_kept]]
        self.held = int(kept.sum())
        return by_serial, base

    def candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The inputs held (at most ``k``): their draws and rows, and each row's input among them."""
        if not self.keys:
            return np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
        self._cut()
        serials = self.serials[0]
        return self.keys[0], self.rows[0], np.searchsorted(serials, self.row_serials[0])

    def holdout(self) -> Holdout:
        if not self.keys:
            return Holdout(np.empty(0, np.int64), np.empty(0, np.int64), 0)
        by_serial, base = self._cut()
        position = np.cumsum(by_serial) - 1
        return Holdout(
            rows=self.rows[0].copy(),
            owners=position[self.row_serials[0] - base],
            num_inputs=self.held,
        )
