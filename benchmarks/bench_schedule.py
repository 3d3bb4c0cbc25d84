"""How each step order mixes hot and cold steps, measured on the schedule alone (no training).

Profiles a sample of the data, takes the hot set for ``--budget``, partitions the data into
entirely-hot and other inputs (all of them, as the example trains on them; the header also gives the
hot share of the inputs the profile did not sample, which chose no hot row), and lays out every order
for many seeds. Per order it prints the share of hot steps, the longest run of hot steps, and how far
the click rate of a window of ``--window`` consecutive steps strays from the data's: the largest
stray anywhere in the epoch and the stray of the epoch's last window (the steps the final model
remembers best). The baseline's order (all inputs cold, batches in random order) is the reference:
its windows stray by sampling alone. Draws the windowed click rate of one seed to
``bench_schedule.png`` in ``--figures``::

    python benchmarks/bench_schedule.py --label-gap -1                   # synthetic, planted gap
    python benchmarks/bench_schedule.py --data criteo-tsv ROWS --scale 1 --sample 0.25 \\
        --budget 1MiB --batch-size 128                                   # real rows, as bench_accuracy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fae_torchrec import AccessProfiler
from fae_torchrec.arguments import byte_size, fraction, positive_int
from fae_torchrec.command_line import add_data_arguments
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.recipes.sources import open_source
from fae_torchrec.stats.hot_set import COLD, HOT
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.schedule import Step, make_schedule
from fae_torchrec.units import parse_bytes

#: The orders laid out (``adaptive`` follows the validation loss, so it has no fixed layout).
ORDERS = ("stream", "shuffled", "phases")
BASELINE = "baseline"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(parser, num_samples=300_000, scale=0.02)
    parser.add_argument("--sample", type=fraction, default=0.05, help="profiled fraction of inputs")
    parser.add_argument("--budget", type=byte_size, default="256KiB", help="hot-row budget")
    parser.add_argument("--batch-size", type=positive_int, default=512, help="per-rank batch size")
    parser.add_argument("--world-size", type=positive_int, default=1)
    parser.add_argument("--seeds", type=positive_int, default=20, help="schedule seeds 0..N-1")
    parser.add_argument("--window", type=positive_int, default=8, help="steps per window")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_schedule.png goes here")
    return parser.parse_args(argv)


def step_labels(steps: list[Step], labels: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the clicks and the inputs of all ranks."""
    clicks, sizes = np.zeros(len(steps)), np.zeros(len(steps))
    for index, step in enumerate(steps):
        for spans in step.spans:
            for part, start, stop in spans:
                clicks[index] += labels[part][start:stop].sum()
                sizes[index] += stop - start
    return clicks, sizes


def window_rates(clicks: np.ndarray, sizes: np.ndarray, window: int) -> np.ndarray:
    """The click rate of every run of ``window`` consecutive steps (of all steps when fewer)."""
    window = min(window, len(clicks))
    totals = [np.convolve(values, np.ones(window), mode="valid") for values in (clicks, sizes)]
    return totals[0] / totals[1]


def longest_hot_run(steps: list[Step]) -> int:
    """The most hot steps in a row."""
    kinds = np.concatenate([[False], [step.hot for step in steps], [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(kinds))  # starts and ends of the runs of hot steps, alternating
    return int((edges[1::2] - edges[::2]).max()) if len(edges) else 0


def main(argv: list[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    args = parse_args(argv)
    source, _ = open_source(args, batch_size=4096, require_labels=True)
    tables = source.table_configs()
    profiler = AccessProfiler(tables, args.sample, seed=0)
    profiled = np.concatenate([profiler.update(batch) for batch in source])  # per input, in the data's order
    partition = HotColdPartition.of(
        source.blocks(), profiler.stats().hot_set(parse_bytes(args.budget)), DEFAULT_CAT_NAMES
    )
    everything = np.empty(len(partition.is_hot), dtype=partition.hot.labels.dtype)  # in the data's order
    everything[partition.is_hot], everything[~partition.is_hot] = partition.hot.labels, partition.cold.labels
    rate = everything.mean()
    print(
        f"data: {' '.join(Path(item).name for item in args.data)}, {len(everything):,} inputs, "
        f"{partition.is_hot.mean():.1%} entirely hot ({partition.is_hot[~profiled].mean():.1%} of the "
        f"{(~profiled).sum():,} the profile did not sample; click rate {partition.hot.labels.mean():.3f}, "
        f"others {partition.cold.labels.mean():.3f}, all {rate:.3f}); batch {args.batch_size} x "
        f"{args.world_size} ranks, windows of {args.window} steps, seeds 0-{args.seeds - 1}"
    )
    layouts = {BASELINE: (np.zeros_like(partition.is_hot), {COLD: everything}, "stream")}
    layouts |= {order: (partition.is_hot, {HOT: partition.hot.labels, COLD: partition.cold.labels}, order)
                for order in ORDERS}  # fmt: skip
    figures: dict[str, dict[str, np.ndarray]] = {}
    curves = {}
    for name, (is_hot, labels, order) in layouts.items():
        rows = []
        for seed in range(args.seeds):
            steps = make_schedule(is_hot, args.batch_size, args.world_size, order, seed)
            rates = window_rates(*step_labels(steps, labels), args.window)
            rows.append([np.mean([s.hot for s in steps]), longest_hot_run(steps),
                         np.abs(rates - rate).max(), abs(rates[-1] - rate)])  # fmt: skip
            if seed == 0:
                curves[name] = rates
        figures[name] = dict(zip(("hot", "run", "stray", "last"), np.array(rows).T, strict=True))
    print(
        f"{'order':>10}{'hot steps':>11}{'longest hot run':>22}{'largest stray':>20}{'last window stray':>22}"
    )
    print(f"{'':>10}{'':>11}{'mean':>11}{'max':>11}{'mean':>10}{'max':>10}{'mean':>11}{'max':>11}")
    for name, values in figures.items():
        print(f"{name:>10}{values['hot'].mean():>11.1%}{values['run'].mean():>11.1f}{values['run'].max():>11.0f}"
              f"{values['stray'].mean():>10.3f}{values['stray'].max():>10.3f}"
              f"{values['last'].mean():>11.3f}{values['last'].max():>11.3f}")  # fmt: skip
    path = Path(args.figures) / "bench_schedule.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axis = plt.subplots(figsize=(7, 3.5))
    for name, rates in curves.items():
        axis.plot(np.arange(len(rates)) + args.window, rates, label=name, linewidth=1)
    axis.axhline(rate, color="black", linewidth=0.8, linestyle=":")
    axis.set_xlabel(f"step (end of a window of {args.window})")
    axis.set_ylabel("click rate of the window")
    axis.set_title(f"seed 0, {' '.join(Path(item).name for item in args.data)}", fontsize=10)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
