"""The hot-input share: estimated from a profile's holdout with a 95% interval, or measured on data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.feature_ids import BatchLike
from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.stats.ranking import RowRanking

_Z95 = 1.959963984540054


@dataclass(frozen=True)
class ShareEstimate:
    """Share of inputs that are entirely hot, with the bounds of its 95% Wilson score interval."""

    share: float
    low: float
    high: float
    num_inputs: int

    def __str__(self) -> str:
        return (
            f"{100 * self.share:.2f}% (95% CI {100 * self.low:.2f}% - {100 * self.high:.2f}%, "
            f"n={self.num_inputs})"
        )


@dataclass(frozen=True)
class ShareCurve:
    """Estimated hot-input share (and 95% bounds) against the hot-row budget in bytes."""

    budgets: np.ndarray
    share: np.ndarray
    low: np.ndarray
    high: np.ndarray


def wilson_interval(hits: np.ndarray | int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share ``hits / n`` and its 95% Wilson score bounds (valid near 0 and 1, unlike the normal one)."""
    p = np.asarray(hits, dtype=np.float64) / n
    z2n = _Z95**2 / n
    center = (p + z2n / 2) / (1 + z2n)
    half = _Z95 * np.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    # the interval holds p; the bounds only say so up to rounding (1 - 1e-16 at p = 1)
    return p, np.clip(center - half, 0.0, p), np.clip(center + half, p, 1.0)


def measured_share(hits: int, n: int) -> ShareEstimate:
    """The share of ``hits`` hot inputs among ``n`` seen, with its 95% interval."""
    share, low, high = wilson_interval(hits, n)
    return ShareEstimate(float(share), float(low), float(high), n)


def clearly_below(measured: ShareEstimate, planned: ShareEstimate, margin: float) -> bool:
    """Whether ``measured`` lies below ``planned`` by more than ``margin``, beyond chance: the top of
    its 95% interval under the bottom of the plan's, less ``margin``."""
    return measured.high < planned.low - margin


def _holdout_size(holdout: Holdout) -> int:
    if len(holdout) == 0:
        raise ValueError(
            "the statistics have no holdout inputs to estimate from "
            "(sample fraction 1.0, holdout_size=0, or every input was sampled)"
        )
    return len(holdout)


def holdout_rows_hot(holdout: Holdout, hot_set: HotSet) -> np.ndarray:
    """For each row the ``holdout`` inputs look up, whether ``hot_set`` makes it hot (binary searches:
    no mask over every row of every table)."""
    return hot_set.is_hot_row(holdout.rows)


def holdout_cold_inputs(holdout: Holdout, row_hot: np.ndarray) -> np.ndarray:
    """Per ``holdout`` input, whether it carries a cold row (``row_hot``: per holdout row, as
    :func:`holdout_rows_hot` gives it)."""
    cold = np.zeros(len(holdout), dtype=bool)
    cold[holdout.owners[~row_hot]] = True
    return cold


def hot_inputs(holdout: Holdout, hot_set: HotSet) -> np.ndarray:
    """Per ``holdout`` input, whether ``hot_set`` makes it entirely hot."""
    return ~holdout_cold_inputs(holdout, holdout_rows_hot(holdout, hot_set))


def estimate_hot_share(stats: AccessStats, hot_set: HotSet) -> ShareEstimate:
    """Share of inputs outside the sample that ``hot_set`` makes entirely hot, from the holdout."""
    n = _holdout_size(stats.holdout)
    return measured_share(int(np.count_nonzero(hot_inputs(stats.holdout, hot_set))), n)


@dataclass(frozen=True)
class ShareChange:
    """Two hot sets' shares on the same inputs (``before``, ``after``), and the change from the first to
    the second with the lower bound of its 95% interval (``low``): paired, so that only the inputs hot
    under one set alone tell them apart, and the inputs both agree on add no noise."""

    before: ShareEstimate
    after: ShareEstimate
    change: float
    low: float


def compare_hot_sets(holdout: Holdout, before: HotSet, after: HotSet) -> ShareChange:
    """How the share of ``holdout``'s inputs made entirely hot changes from ``before`` to ``after``.
    Of the ``d`` inputs hot under one set alone, ``g`` are hot under ``after``; the change is
    ``(2g - d) / n``, its lower bound that of ``g / d``'s Wilson interval taken the same way (none
    beyond chance from a handful of inputs)."""
    n = _holdout_size(holdout)
    old, new = hot_inputs(holdout, before), hot_inputs(holdout, after)
    gained, differ = int(np.count_nonzero(new & ~old)), int(np.count_nonzero(new != old))
    low = differ / n * (2 * float(wilson_interval(gained, differ)[1]) - 1) if differ else 0.0
    old_share, new_share = (measured_share(int(np.count_nonzero(hot)), n) for hot in (old, new))
    return ShareChange(old_share, new_share, (2 * gained - differ) / n, low)


def hot_share_curve(ranking: RowRanking, budgets: np.ndarray) -> ShareCurve:
    """Estimated hot-input share of FAE's hot set at each budget (one pass over the holdout)."""
    n = _holdout_size(ranking.holdout)
    budgets = np.asarray(budgets)
    worst = np.sort(ranking.worst_ranks())
    num_hot = np.asarray(ranking.num_hot_rows(budgets))
    hits = np.searchsorted(worst, num_hot, side="left")
    hits = np.where(budgets >= ranking.total_bytes, n, hits)
    share, low, high = wilson_interval(hits, n)
    return ShareCurve(budgets=budgets, share=share, low=low, high=high)


def measure_hot_share(
    hot_set: HotSet, data: Iterable[BatchLike], total: int | None = None, progress: bool = False
) -> float:
    """The true share of entirely-hot inputs in ``data`` (every input classified; ``progress`` draws a bar
    over ``total`` batches)."""
    hot = seen = 0
    for batch in tqdm(data, total=total, desc="classifying", unit="batch", leave=False, disable=not progress):
        mask = hot_set.is_hot_input(batch)
        hot += int(mask.sum())
        seen += len(mask)
    if seen == 0:
        raise ValueError("no inputs to measure the hot-input share on")
    return hot / seen
