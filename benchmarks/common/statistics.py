"""Summaries of repeated measurements that the benchmarks print."""

from __future__ import annotations

import numpy as np


def standard_error(values: np.ndarray | list[float]) -> float:
    """The standard error of the mean of ``values`` (NaN for fewer than two)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
