"""How good is the hot set FAE picks from a 5% sample? Side by side with one from all the data.

First how much popular rows co-occur within an input, on 10k synthetic inputs and, when
``../shared/realdata`` is there, on the first 10k lines of Criteo Kaggle's train.txt; then the skew of the
data (share of all accesses taken by the most accessed rows of all tables).

For each budget: the hot-input share, on the inputs outside the sample, of the hot set chosen from the
sample and of the hot set chosen from every input, their ratio, and the sample's 95% estimate.

    python benchmarks/bench_hot_set.py                       # 2M default synthetic inputs
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fae_torchrec import AccessProfiler
from fae_torchrec.data import CriteoTsvReader, SyntheticCriteo
from fae_torchrec.stats import estimate_hot_share
from fae_torchrec.units import format_bytes, parse_bytes

KAGGLE_HEAD = (
    Path(__file__).resolve().parents[2] / "shared/realdata/criteo_kaggle_head10k/train_head10000.txt"
)

BUDGETS = "256KiB,512KiB,1MiB,2MiB,4MiB,16MiB,64MiB,256MiB"


def _repeats(column: np.ndarray) -> np.ndarray:
    """True where the id occurs more than once in ``column``."""
    _, inverse, counts = np.unique(column, return_inverse=True, return_counts=True)
    return counts[inverse] >= 2


def co_occurrence(ids: np.ndarray) -> str:
    """Inputs whose every id repeats within ``ids`` (all hot), against that share if features were
    independent, and the least repeating feature's share."""
    repeated = np.stack([_repeats(column) for column in ids.T], axis=1)
    per_feature = repeated.mean(axis=0)
    return (
        f"all ids repeat {repeated.all(axis=1).mean():.1%}, if independent "
        f"{np.prod(per_feature):.2%}, least repeating feature {per_feature.min():.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=2_000_000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--sample", type=float, default=0.05)
    parser.add_argument("--budgets", default=BUDGETS)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    data = SyntheticCriteo(args.num_samples, batch_size=1 << 16, scale=args.scale, seed=args.seed)
    print(f"synthetic, first 10k inputs: {co_occurrence(data.chunk(0).ids[:10_000])}")
    if KAGGLE_HEAD.exists():
        real = np.concatenate([b.ids for b in CriteoTsvReader(KAGGLE_HEAD).raw_blocks()])
        print(f"Criteo Kaggle, first 10k lines: {co_occurrence(real)}")
    batches = list(data)
    tables = data.table_configs()
    sampled = AccessProfiler(tables, args.sample, seed=0)
    outside = [~sampled.update(batch) for batch in batches]
    everything = AccessProfiler(tables, 1.0, holdout_size=0)
    for batch in batches:
        everything.update(batch)
    sample_stats, full_stats = sampled.stats(), everything.stats()

    def share_outside(hot_set) -> float:
        hot = [hot_set.is_hot_input(b)[m] for b, m in zip(batches, outside, strict=True)]
        return float(np.concatenate(hot).mean())

    print(
        f"{args.num_samples:,} synthetic inputs, scale {args.scale}; sample {args.sample:.0%} "
        f"({sample_stats.num_sampled:,} inputs); shares measured on the {sum(map(np.sum, outside)):,} "
        "inputs outside the sample"
    )
    counts = np.sort(np.concatenate(full_stats.seen_counts))[::-1]
    covered, rows = np.cumsum(counts) / counts.sum(), int(full_stats.layout.num_rows.sum())
    skew = ", ".join(
        f"top {top:.1%} of rows take {covered[min(int(top * rows), len(counts)) - 1]:.1%}"
        for top in (0.001, 0.01)
    )
    print(f"skew over all {rows:,} rows: {skew} of accesses; {len(counts) / rows:.1%} rows seen")
    print(f"{'budget':>10}{'hot rows':>10}{'from sample':>13}{'from all':>10}{'ratio':>8}  estimate")
    for budget in (parse_bytes(b) for b in args.budgets.split(",")):
        hot_set = sample_stats.hot_set(budget)
        mine, best = share_outside(hot_set), share_outside(full_stats.hot_set(budget))
        estimate = estimate_hot_share(sample_stats, hot_set)
        print(
            f"{format_bytes(budget):>10}{hot_set.total_hot:>10,}{mine:>13.2%}{best:>10.2%}"
            f"{mine / best:>8.3f}  {estimate}"
        )


if __name__ == "__main__":
    main()
