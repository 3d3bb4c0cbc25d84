"""PNG pictures of a profile: access CDF per table and estimated hot-input share against budget.

Drawn on ``matplotlib.figure.Figure`` without pyplot, so that no backend is chosen or changed."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.figure import Figure

from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.hot_share import ShareCurve


def plot_access_cdf(stats: AccessStats, path: str | os.PathLike) -> None:
    """Per table, the share of its sampled accesses taken by its most accessed fraction of rows."""
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    for config, counts in zip(stats.tables, stats.seen_counts, strict=True):
        total = counts.sum()
        if total == 0:
            continue
        seen = np.sort(counts)[::-1]
        rows = np.append(np.arange(1, len(seen) + 1), config.num_embeddings)
        share = np.append(np.cumsum(seen), total) / total
        ax.plot(rows / config.num_embeddings, share, lw=1, label=config.name)
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the table's rows (most accessed first)")
    ax.set_ylabel("share of the table's sampled accesses")
    ax.set_title(f"Access CDF per table ({stats.num_sampled:,} sampled inputs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_hot_share(curve: ShareCurve, path: str | os.PathLike, budget: int | None = None) -> None:
    """Estimated hot-input share against the hot-row budget, with its 95% band."""
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    mib = curve.budgets / 2**20
    ax.fill_between(mib, 100 * curve.low, 100 * curve.high, alpha=0.3, label="95% interval")
    ax.plot(mib, 100 * curve.share, marker=".", label="estimated hot-input share")
    if budget is not None:
        ax.axvline(budget / 2**20, color="k", ls="--", lw=1, label="chosen budget")
    ax.set_xscale("log")
    ax.set_xlabel("hot-row budget (MiB)")
    ax.set_ylabel("inputs entirely hot (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Hot-input share against budget")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
