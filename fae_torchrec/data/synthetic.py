"""Synthetic Criteo-like data: skewed ids, learnable labels, deterministic by seed, made chunk by chunk.

Each table draws row *ranks* from a truncated power law (rank ``r`` has weight ``(r + 1) ** -a``) and
maps ranks to ids through a random affine permutation ``id = (A * r + B) mod N`` with ``gcd(A, N) = 1``,
so the hot rows are spread over the table rather than being the small ids. Popularity is correlated
across the features of an input, as in real traffic: each id takes its input's shared uniform quantile
with probability ``correlation``, otherwise a quantile of its own, so popular rows tend to appear
together. Labels come from a planted logistic model: a linear function of the dense features plus, per
feature, a fixed pseudo-random effect of each row (a hash of table and id, so it costs no memory), with
the intercept set so that the click rate is ``ctr``. Data are generated in fixed chunks, each from its
own seed ``(seed, chunk)``, so the samples do not depend on the batch size and memory does not grow
with the number of samples.

Drift: with ``days`` > 1 the inputs are ``days`` consecutive days of equal length, and each day rotates
every table's popularity by ``drift`` of its rows: on day ``d`` rank ``r`` takes the id rank
``(r + floor(d * drift * N)) mod N`` had on day 0. The rows on top of day ``d`` were far down day 0's
tail (new ids for a hot set profiled then), and day 0's hottest rows fall to the table's coldest end.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fae_torchrec.checks import check_share
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.criteo import (
    CAT_FEATURE_COUNT,
    INT_FEATURE_COUNT,
    KAGGLE_TABLE_SIZES,
    CriteoSource,
    scaled_table_sizes,
)

#: Power-law exponent of every table's popularity; gives Criteo-like skew (see docs/data.md).
DEFAULT_EXPONENT = 1.05
#: Chance that an id takes its input's shared popularity quantile (see the module docstring).
DEFAULT_CORRELATION = 0.85
#: Samples per generated chunk: the unit of determinism.
CHUNK_SIZE = 1 << 16

_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _row_effect(ids: np.ndarray, salt: int) -> np.ndarray:
    """A fixed pseudo-random value in [-1, 1) per (table, id): splitmix64 of ``id + salt``."""
    x = ids.astype(np.uint64) + np.uint64(salt)
    x *= np.uint64(_SPLITMIX[0])
    x ^= x >> np.uint64(30)
    x *= np.uint64(_SPLITMIX[1])
    x ^= x >> np.uint64(27)
    x *= np.uint64(_SPLITMIX[2])
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-23) - np.float32(1.0)


def power_law_ranks(u: np.ndarray, num_rows: int | np.ndarray, exponent: float) -> np.ndarray:
    """Ranks 0..N-1 of a table of ``N = num_rows`` rows, rank ``r`` with weight ``(r + 1) ** -exponent``,
    for uniform draws ``u`` in [0, 1): the inverse CDF of the continuous power law on [1, N + 1),
    floored. ``num_rows`` is one size or an array of sizes that broadcasts with ``u`` (a table per draw).
    """
    if math.isclose(exponent, 1.0):
        x = np.exp(u * np.log(num_rows + 1.0))
    else:
        top = (num_rows + 1.0) ** (1.0 - exponent) - 1.0
        x = (1.0 + u * top) ** (1.0 / (1.0 - exponent))
    return np.minimum(x.astype(np.int64) - 1, num_rows - 1)


@dataclass(frozen=True)
class _TablePlan:
    num_rows: int
    exponent: float
    multiplier: int
    offset: int
    weight: float
    salt: int


class SyntheticCriteo(CriteoSource):
    """An iterable of TorchRec ``Batch``es that behaves like Criteo traffic.

    Args:
        num_samples: inputs in the data set.
        batch_size: inputs per ``Batch`` (the last one may be smaller).
        scale: table sizes are ``table_sizes`` times ``scale`` (1.0 = full size).
        seed: the data set; the same seed gives the same samples whatever the batch size.
        exponent: power-law exponent per table (one value for all, or 26 values).
        ids_per_feature: ids each input carries per feature (1 = single-hot, as in Criteo; a sequence
            of 26 counts for multi-hot data as in DLRM-v2).
        correlation: chance that an id takes its input's shared popularity quantile (0 = independent
            features, 1 = all ids of an input equally popular).
        sparse_signal: weight of each feature's row effect in the planted logit.
        ctr: share of positive labels the planted model is calibrated to (Criteo Kaggle: 25.6%).
        table_sizes: rows per categorical feature before ``scale`` (default: Criteo Kaggle's).
        label_gap: logit added to the inputs whose every id is among the ``popular_rows`` most popular
            rows of its table: the inputs FAE finds entirely hot click at another rate than the rest,
            as on real Criteo rows (where they click less often). 0 plants no gap.
        popular_rows: how many of each table's most popular rows make an input popular for
            ``label_gap`` (every row of a smaller table).
        days: consecutive days of equal length the inputs span (see the module docstring).
        drift: share of each table's rows its popularity rotates by per day (0: stationary data).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int = 2048,
        *,
        scale: float = 1.0,
        seed: int = 0,
        exponent: float | Sequence[float] = DEFAULT_EXPONENT,
        ids_per_feature: int | Sequence[int] = 1,
        correlation: float = DEFAULT_CORRELATION,
        sparse_signal: float = 0.6,
        ctr: float = 0.25,
        table_sizes: Sequence[int] = KAGGLE_TABLE_SIZES,
        label_gap: float = 0.0,
        popular_rows: int = 10_000,
        days: int = 1,
        drift: float = 0.0,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be non-negative, got {num_samples}")
        super().__init__(batch_size, scaled_table_sizes(scale, table_sizes))
        self.num_samples: int = num_samples
        self.seed = seed
        exponents = _per_feature("exponent", exponent, np.float64)
        counts = _per_feature("ids_per_feature", ids_per_feature, np.int64)
        self.ids_per_feature = tuple(int(c) for c in counts)
        check_share(correlation, "correlation")
        if not 0.0 < ctr < 1.0:
            raise ValueError(f"ctr must be in (0, 1), got {ctr}")
        if popular_rows <= 0:
            raise ValueError(f"popular_rows must be positive, got {popular_rows}")
        if days <= 0:
            raise ValueError(f"days must be positive, got {days}")
        check_share(drift, "drift (of a table's rows per day)")
        self.days, self.drift = days, drift
        self.correlation = correlation
        self.label_gap, self.popular_rows = label_gap, popular_rows
        rng = np.random.default_rng([seed, 1 << 32])
        self._dense_weights = rng.normal(0.0, 0.4, INT_FEATURE_COUNT).astype(np.float32)
        self._dense_mu = rng.uniform(0.0, 3.0, INT_FEATURE_COUNT)
        self._tables = [
            _TablePlan(
                num_rows=n,
                exponent=float(a),
                multiplier=coprime(rng, n),
                offset=int(rng.integers(n)),
                weight=sparse_signal,
                salt=int(rng.integers(1 << 62)),
            )
            for n, a in zip(self.table_sizes, exponents, strict=True)
        ]
        _, _, pilot = self._draw(np.random.default_rng([seed, 1 << 33]), 1 << 14)
        self._intercept = _intercept_for(ctr, pilot)

    def day_starts(self) -> np.ndarray:
        """Where each day's inputs start, and where the last one ends (``days + 1`` positions)."""
        return np.arange(self.days + 1) * self.num_samples // self.days

    @property
    def num_chunks(self) -> int:
        return -(-self.num_samples // CHUNK_SIZE)

    def chunk(self, index: int) -> SampleBlock:
        """Chunk ``index`` of the data set (``CHUNK_SIZE`` inputs; the last may be shorter)."""
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} out of range [0, {self.num_chunks})")
        n = min(CHUNK_SIZE, self.num_samples - index * CHUNK_SIZE)
        rng = np.random.default_rng([self.seed, index])
        days = np.searchsorted(self.day_starts(), index * CHUNK_SIZE + np.arange(n), "right") - 1
        dense, ids, logit = self._draw(rng, n, days)
        logit += np.float32(self._intercept)
        labels = rng.random(n, dtype=np.float32) < 1.0 / (1.0 + np.exp(-logit))
        return SampleBlock(
            dense=dense,
            ids=ids,
            labels=labels.astype(np.int32),
            ids_per_feature=self.ids_per_feature,
        )

    def raw_blocks(self) -> Iterator[SampleBlock]:
        return (self.chunk(i) for i in range(self.num_chunks))

    def raw_range(self, start: int, stop: int | None) -> Iterator[SampleBlock]:
        """The inputs ``start`` to ``stop``, drawing only the chunks that hold them."""
        stop = self.num_samples if stop is None else min(stop, self.num_samples)
        for index in range(start // CHUNK_SIZE, -(-stop // CHUNK_SIZE)):
            first = index * CHUNK_SIZE
            yield self.chunk(index).slice(max(start - first, 0), min(stop - first, CHUNK_SIZE))

    def _draw(
        self, rng: np.random.Generator, n: int, days: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dense features, ids and the planted logit (without intercept) of ``n`` inputs, of day
        ``days[i]`` each (day 0 when None)."""
        days = np.zeros(n, dtype=np.int64) if days is None else days
        raw = np.floor(np.exp(self._dense_mu + 1.5 * rng.standard_normal((n, INT_FEATURE_COUNT))))
        dense = np.log1p(raw).astype(np.float32)
        logit = (dense - np.float32(2.0)) @ self._dense_weights
        bounds = np.concatenate([[0], np.cumsum(self.ids_per_feature)])
        ids = np.empty((n, bounds[-1]), dtype=np.int64)
        uniform = rng.random((n, bounds[-1]))
        shared = rng.random((n, bounds[-1])) < self.correlation
        uniform[shared] = np.broadcast_to(rng.random((n, 1)), uniform.shape)[shared]
        popular = np.ones(n, dtype=bool)
        for f, plan in enumerate(self._tables):
            cols = slice(bounds[f], bounds[f + 1])
            ranks = power_law_ranks(uniform[:, cols], plan.num_rows, plan.exponent)
            popular &= (ranks < self.popular_rows).all(axis=1)
            rotated = (ranks + (days * self.drift * plan.num_rows).astype(np.int64)[:, None]) % plan.num_rows
            ids[:, cols] = (rotated * plan.multiplier + plan.offset) % plan.num_rows
            logit += np.float32(plan.weight) * _row_effect(ids[:, cols], plan.salt).mean(axis=1)
        if self.label_gap:
            logit += np.float32(self.label_gap) * popular
        return dense, ids, logit

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)


def _per_feature(name: str, value: float | Sequence[float], dtype: type) -> np.ndarray:
    """One positive value per categorical feature, from one value or 26."""
    values: np.ndarray = np.asarray(value, dtype=dtype)
    if values.ndim > 1 or (values.ndim == 1 and len(values) != CAT_FEATURE_COUNT):
        raise ValueError(f"{name} must be one value or {CAT_FEATURE_COUNT}, got {value}")
    if np.any(values <= 0):
        raise ValueError(f"{name} must be positive, got {value}")
    return np.broadcast_to(values, CAT_FEATURE_COUNT)


def _intercept_for(ctr: float, logit: np.ndarray) -> float:
    """The intercept that makes the mean of ``sigmoid(logit + intercept)`` equal ``ctr`` (bisection)."""
    low, high = -30.0, 30.0
    for _ in range(60):
        middle = (low + high) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + middle)))) < ctr:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def coprime(rng: np.random.Generator, n: int) -> int:
    """A random multiplier in [1, n) coprime with ``n`` (1 for n <= 2)."""
    if n <= 2:
        return 1
    while True:
        candidate = int(rng.integers(1, n))
        if math.gcd(candidate, n) == 1:
            return candidate
