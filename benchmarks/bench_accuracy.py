"""Accuracy of FAE against the baseline, paired by seed: the same data, initial weights and schedule seed.

For each seed, trains ``examples/train_dlrm_fae.py`` twice on the built-in synthetic data, FAE and
``--baseline`` (TorchRec's default planner, batches in random order), and compares their validation
AUC and log loss (held-out inputs, never profiled). Prints each seed's pair, the mean difference with
its standard error and how many seeds fall below the baseline, and draws the per-seed AUC differences
to ``bench_accuracy.png`` in ``--figures``::

    python benchmarks/bench_accuracy.py                            # 10 seeds, 300,000 inputs each
    python benchmarks/bench_accuracy.py --num-samples 600000       # the next doubling
    python benchmarks/bench_accuracy.py --label-gap -1.0           # hot inputs click less (planted)
    python benchmarks/bench_accuracy.py --data criteo-tsv ROWS --example-args "--sample 0.25 --budget 1MiB"

Real rows are read from where they are (never copied into the repository); each seed then varies the
initial weights and the schedule, not the data.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.example_runs import run_example
from fae_torchrec.arguments import positive_int
from fae_torchrec.train.schedule import ORDERS

#: The paired figures, as ``metrics.json`` names them, and whether higher is better.
FIGURES = {"final_auc": True, "final_log_loss": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10, help="seeds 0..N-1, one pair each")
    parser.add_argument("--num-samples", type=positive_int, default=300_000, help="synthetic inputs")
    parser.add_argument("--order", choices=ORDERS, default="shuffled", help="FAE's hot/cold step order")
    parser.add_argument(
        "--label-gap", type=float, default=0.0, help="the example's --label-gap: a planted label gap"
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
    parser.add_argument("--out", default="runs/bench_accuracy", help="the runs go here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_accuracy.png goes here")
    return parser.parse_args(argv)


def describe(args: argparse.Namespace) -> str:
    """The data of every run, in words."""
    if args.data == ["synthetic"]:
        return f"{args.num_samples:,} synthetic inputs, label gap {args.label_gap}"
    return " ".join(Path(item).name for item in args.data)


def paired(fae: np.ndarray, baseline: np.ndarray, higher_is_better: bool) -> str:
    """Mean difference FAE - baseline, its standard error, and the seeds where FAE is worse."""
    difference = fae - baseline
    error = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else float("nan")
    worse = int(np.sum(difference < 0 if higher_is_better else difference > 0))
    return (
        f"mean difference {difference.mean():+.4f} (SE {error:.4f}), "
        f"FAE worse at {worse} of {len(difference)} seeds"
    )


def plot_auc_differences(differences: np.ndarray, title: str, path: Path) -> None:
    """A bar per seed: FAE's validation AUC minus the baseline's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axis = plt.subplots(figsize=(6, 3.5))
    axis.bar(range(len(differences)), differences)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xlabel("seed")
    axis.set_ylabel("validation AUC, FAE - baseline")
    axis.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    args = parse_args(argv)
    started = time.perf_counter()
    print(
        f"data: {describe(args)}, FAE order {args.order}, seeds 0-{args.seeds - 1}, example options "
        f"{args.example_args or '(defaults)'}"
    )
    runs: dict[str, list[dict]] = {"fae": [], "baseline": []}
    for seed in tqdm(range(args.seeds), desc="seeds", unit="pair"):
        common = [
            "--data", *args.data, "--num-samples", str(args.num_samples), "--seed", str(seed),
            "--label-gap", str(args.label_gap), *shlex.split(args.example_args),
        ]  # fmt: skip
        for mode, extra in (("fae", ["--order", args.order]), ("baseline", ["--baseline"])):
            out = Path(args.out) / f"{mode}-{seed}"
            runs[mode].append(run_example([*common, *extra], out))
            for partition in out.glob("partition-*"):  # metrics stay; the partition's .npy files go
                shutil.rmtree(partition)
    values = {
        f"{mode} {figure}": np.array([run[figure] for run in mode_runs])
        for mode, mode_runs in runs.items()
        for figure in FIGURES
    }
    print(f"{'seed':>4}{'FAE AUC':>10}{'base AUC':>10}{'ΔAUC':>9}{'FAE loss':>10}{'base loss':>11}")
    for seed in range(args.seeds):
        auc, base_auc = values["fae final_auc"][seed], values["baseline final_auc"][seed]
        loss, base_loss = values["fae final_log_loss"][seed], values["baseline final_log_loss"][seed]
        print(f"{seed:>4}{auc:>10.4f}{base_auc:>10.4f}{auc - base_auc:>+9.4f}{loss:>10.4f}{base_loss:>11.4f}")
    for figure, higher_is_better in FIGURES.items():
        summary = paired(values[f"fae {figure}"], values[f"baseline {figure}"], higher_is_better)
        print(f"{figure.removeprefix('final_')}: {summary}")
    figure_path = Path(args.figures) / "bench_accuracy.png"
    plot_auc_differences(
        values["fae final_auc"] - values["baseline final_auc"],
        f"FAE ({args.order}) - baseline, {describe(args)}, paired by seed",
        figure_path,
    )
    print(f"wrote {figure_path}; total wall time {time.perf_counter() - started:.0f} s")
    return values


if __name__ == "__main__":
    main()
