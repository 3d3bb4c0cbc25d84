"""Accuracy of FAE against the baseline, paired by seed: the same data, initial weights and schedule seed.

For each seed, trains ``examples/train_dlrm_fae.py`` (or, with ``--model tbsm``,
``examples/train_tbsm_fae.py``) on the built-in synthetic data with
``--baseline`` (TorchRec's default planner, batches in random order) and with FAE in each of the
``--order``s, and compares their validation AUC and log loss (held-out inputs, never profiled).
A control runs too: the baseline again with only its random order changed (``--order-seed``), which
shows how far the order alone moves AUC on this data. Prints each seed's figures, for each order and
the control the mean difference from the baseline with its standard error and how many seeds fall
below the baseline, and draws the per-seed AUC differences to
``bench_accuracy.png`` in ``--figures``; every figure also goes to ``bench_accuracy.json`` in ``--out``::

    python benchmarks/bench_accuracy.py                            # 10 seeds, 300,000 inputs each
    python benchmarks/bench_accuracy.py --num-samples 600000       # the next doubling
    python benchmarks/bench_accuracy.py --label-gap -1.0           # hot inputs click less (planted)
    python benchmarks/bench_accuracy.py --order stream shuffled phases    # several orders, one baseline
    python benchmarks/bench_accuracy.py --data criteo-tsv ROWS --example-args "--sample 0.25 --budget 1MiB"
    python benchmarks/bench_accuracy.py --model tbsm               # TBSM on Taobao-like histories
    python benchmarks/bench_accuracy.py --jobs 2                   # two runs at once, a core each

Real rows are read from where they are (never copied into the repository); each seed then varies the
initial weights and the schedule, not the data.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.example_runs import EXAMPLES, data_size, run_example
from benchmarks.common.statistics import standard_error
from fae_torchrec.arguments import positive_int
from fae_torchrec.train.schedule import ORDERS

#: The control's name: the baseline with another random order (``--order-seed`` = seed + offset).
CONTROL = "reordered baseline"
CONTROL_SEED_OFFSET = 10_000
#: A seed's difference from the baseline counted as large.
MARGIN = 0.005
#: The paired figures, as ``metrics.json`` names them, and whether higher is better.
FIGURES = {"final_auc": True, "final_log_loss": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10, help="seeds 0..N-1, one pair each")
    parser.add_argument("--model", choices=sorted(EXAMPLES), default="dlrm", help="the model, by its example")
    parser.add_argument("--num-samples", type=positive_int, default=300_000, help="synthetic inputs (DLRM)")
    parser.add_argument("--num-users", type=positive_int, default=40_000, help="synthetic users (TBSM)")
    parser.add_argument(
        "--order", nargs="+", choices=ORDERS, default=["stream"], help="FAE's hot/cold step orders"
    )
    parser.add_argument(
        "--label-gap", type=float, default=0.0, help="DLRM example's --label-gap: a planted label gap"
    )
    parser.add_argument(
        "--data",
        nargs="+",
        default=["synthetic"],
        metavar="SOURCE",
        help="the example's --data: synthetic (default) or real rows, such as criteo-tsv FILE",
    )
    parser.add_argument(
        "--example-args",
        default="",
        help="more options of the example for both modes, e.g. '--sample 0.25 --budget 1MiB'",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="example runs at once, each on an equal share of the cores (the runs are independent)",
    )
    parser.add_argument("--out", default="runs/bench_accuracy", help="the runs go here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_accuracy.png goes here")
    return parser.parse_args(argv)


def describe(args: argparse.Namespace) -> str:
    """The data of every run, in words."""
    if args.data == ["synthetic"] and args.model == "tbsm":
        return f"TBSM, {args.num_users:,} synthetic users"
    if args.data == ["synthetic"]:
        return f"{args.num_samples:,} synthetic inputs, label gap {args.label_gap}"
    return " ".join(Path(item).name for item in args.data)


def data_options(args: argparse.Namespace) -> list[str]:
    """The example's options that size the synthetic data (and plant DLRM's label gap)."""
    return [*data_size(args), *([] if args.model == "tbsm" else ["--label-gap", str(args.label_gap)])]


def paired(other: np.ndarray, baseline: np.ndarray, higher_is_better: bool) -> str:
    """Mean difference from the baseline, its standard error, and the seeds where it is worse (at
    all, and by more than ``MARGIN``)."""
    difference = other - baseline
    error = standard_error(difference)
    better = difference if higher_is_better else -difference
    return (
        f"mean difference {difference.mean():+.4f} (SE {error:.4f}), worse at {int(np.sum(better < 0))} "
        f"of {len(difference)} seeds, {int(np.sum(better < -MARGIN))} by more than {MARGIN}"
    )


def plot_auc_differences(differences: dict[str, np.ndarray], title: str, path: Path) -> None:
    """Per seed a bar for each order (and the control): validation AUC minus the baseline's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axis = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(differences)
    for index, (order, values) in enumerate(differences.items()):
        axis.bar(
            np.arange(len(values)) + (index - (len(differences) - 1) / 2) * width, values, width, label=order
        )
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xlabel("seed")
    axis.set_ylabel("validation AUC - baseline's")
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    args = parse_args(argv)
    started = time.perf_counter()
    orders = list(dict.fromkeys(args.order))
    print(
        f"data: {describe(args)}, FAE order {' '.join(orders)}, seeds 0-{args.seeds - 1}, example options "
        f"{args.example_args or '(defaults)'}"
    )
    # the control: the baseline again, only its random order changed (how far order alone moves AUC)
    modes = {
        "baseline": ["--baseline"],
        CONTROL: ["--baseline"],
        **{order: ["--order", order] for order in orders},
    }
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None

    def train(mode: str, seed: int) -> dict:
        common = [
            "--data",
            *args.data,
            "--seed",
            str(seed),
            *data_options(args),
            *shlex.split(args.example_args),
        ]
        out = Path(args.out) / f"{mode.replace(' ', '-')}-{seed}"
        order_seed = ["--order-seed", str(seed + CONTROL_SEED_OFFSET)] if mode == CONTROL else []
        metrics = run_example([*common, *modes[mode], *order_seed], out, model=args.model, threads=threads)
        for partition in out.glob("partition-*"):  # metrics stay; the partition's .npy files go
            shutil.rmtree(partition)
        return metrics

    tasks = [(mode, seed) for seed in range(args.seeds) for mode in modes]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(
            tqdm(pool.map(lambda task: train(*task), tasks), total=len(tasks), desc="runs", unit="run")
        )
    runs = {
        mode: [metrics for (m, _), metrics in zip(tasks, done, strict=True) if m == mode] for mode in modes
    }
    values = {
        f"{mode} {figure}": np.array([run[figure] for run in mode_runs])
        for mode, mode_runs in runs.items()
        for figure in FIGURES
    }
    base_auc, base_loss = values["baseline final_auc"], values["baseline final_log_loss"]
    compared = [CONTROL, *orders]
    print(f"{'seed':>4}{'base AUC':>10}{'base loss':>11}" + "".join(f"{f'{m} ΔAUC':>24}" for m in compared))
    for seed in range(args.seeds):
        differences = "".join(f"{values[f'{m} final_auc'][seed] - base_auc[seed]:>+24.4f}" for m in compared)
        print(f"{seed:>4}{base_auc[seed]:>10.4f}{base_loss[seed]:>11.4f}{differences}")
    for mode in compared:
        hot = np.mean([run["hot_steps"] / (run["hot_steps"] + run["cold_steps"]) for run in runs[mode]])
        print(f"{mode if mode == CONTROL else f'FAE {mode}'}: {100 * hot:.1f}% hot steps")
        for figure, higher_is_better in FIGURES.items():
            summary = paired(values[f"{mode} {figure}"], values[f"baseline {figure}"], higher_is_better)
            print(f"  {figure.removeprefix('final_')}: {summary}")
    figure_path = Path(args.figures) / "bench_accuracy.png"
    plot_auc_differences(
        {mode: values[f"{mode} final_auc"] - base_auc for mode in compared},
        f"FAE - baseline, {describe(args)}, paired by seed",
        figure_path,
    )
    results = Path(args.out) / "bench_accuracy.json"
    results.write_text(
        json.dumps({"args": vars(args), **{k: v.tolist() for k, v in values.items()}}, indent=1)
    )
    print(f"wrote {figure_path} and {results}; total wall time {time.perf_counter() - started:.0f} s")
    return values


if __name__ == "__main__":
    main()
