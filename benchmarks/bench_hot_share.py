"""Hot-input share against the hot-row budget: estimated from a profile, and measured on inputs it never saw.

Profiles a sample of the training inputs as the examples do (``AccessProfiler`` at FAE's sample: 20% for
TBSM, 5% for DLRM; holdout ``--holdout`` inputs) and, for each budget of ``--budgets`` (default: a
doubling ladder from 1 MiB up to the whole model; weights only, as the examples' ``--budget``), takes
FAE's hot set (the most accessed rows of all tables that fit) and prints

* its hot rows and their share of the model's rows;
* the estimated hot-input share with its 95% Wilson interval (``hot_share_curve``, from the holdout);
* the measured share (``HotSet.is_hot_input``, every input classified) on the training inputs the
  profile did not sample (when fewer than ``--holdout``, the holdout is all of them and the estimate
  agrees by construction) and on the validation inputs: for TBSM the held-out users (the last active
  30%, whose user rows a profile of training users never sees, so that none of their inputs is hot
  below the whole model), for DLRM every ``--val-every``-th input;
* for TBSM, the measured share of unprofiled training inputs whose target step alone is hot (its user,
  item and category): an input is hot only when all ``--ts-length + 1`` steps are, which is what the
  history costs.

TBSM (default) runs on Taobao-like histories at the reference run's table sizes (``--scale 1.0``), DLRM
on Criteo-like inputs at Kaggle's; ``--data`` names real rows instead, read where they are::

    python benchmarks/bench_hot_share.py                    # TBSM, 50,000 users: ~15 s on 2 cores, 1.3 GB
    python benchmarks/bench_hot_share.py --data taobao-csv UserBehavior.csv       # a real slice: ~5 s
    python benchmarks/bench_hot_share.py --model dlrm       # DLRM, 2,000,000 inputs: ~35 s, 1.7 GB
    python benchmarks/bench_hot_share.py --model dlrm --data criteo-tsv train.txt --budgets 1MiB 16MiB

The data options are the model's (``--model dlrm --help`` lists DLRM's). Writes ``bench_hot_share.png``
(share against budget) to ``--figures`` and every figure to ``bench_hot_share.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.arguments import fail
from benchmarks.common.training_data import NUM_USERS, describe, model_parser, profile_training
from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.arguments import byte_size, fraction, int_at_least, positive_int
from fae_torchrec.command_line import PROFILE_SAMPLE, add_data_arguments, add_taobao_arguments
from fae_torchrec.data import SampleBlock
from fae_torchrec.data.source import BlockSource
from fae_torchrec.recipes.sources import open_source, open_taobao_source
from fae_torchrec.stats import hot_share_curve
from fae_torchrec.units import format_bytes, parse_bytes

#: Synthetic DLRM inputs (TBSM's users: ``NUM_USERS``).
NUM_SAMPLES = 2_000_000
#: Inputs per block read, profiled and classified.
BLOCK = 1 << 16
#: The measured shares (``measure``'s keys), each with its marker and what it is measured on.
MEASURED = {
    "unprofiled": ("o", "unprofiled training inputs"),
    "validation": ("s", "validation inputs"),
    "target_step": ("^", "target step alone hot (unprofiled)"),
}
#: The first budget of the default ladder.
FIRST_BUDGET = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; the data options are ``--model``'s (``add_taobao_arguments`` for TBSM,
    ``add_data_arguments`` for DLRM; see ``model_parser``)."""
    parser, model = model_parser(argv, __doc__.split("\n")[0], default="tbsm")
    if model == "tbsm":
        add_taobao_arguments(parser, num_users=NUM_USERS, scale=1.0)
    else:
        add_data_arguments(parser, num_samples=NUM_SAMPLES, scale=1.0)
        parser.add_argument(
            "--val-every", type=int_at_least(2), default=10, help="every N-th input is a validation input"
        )
    parser.add_argument("--dim", type=positive_int, default=16, help="embedding dimension")
    parser.add_argument(
        "--sample",
        type=fraction,
        help=f"profiled fraction of the training inputs, below 1 (default {PROFILE_SAMPLE[model]}, FAE's)",
    )
    parser.add_argument("--holdout", type=positive_int, default=100_000, help="the profile's holdout inputs")
    parser.add_argument(
        "--budgets",
        nargs="+",
        type=byte_size,
        help="hot-row budgets (default: 1MiB, 2MiB, 4MiB, ... and the whole model)",
    )
    parser.add_argument("--out", default="runs/bench_hot_share", help="bench_hot_share.json goes here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_hot_share.png goes here")
    args = parser.parse_args(argv)
    args.sample = PROFILE_SAMPLE[model] if args.sample is None else args.sample
    if args.sample == 1.0:
        parser.error("--sample must be below 1: the estimate and the measure need unprofiled inputs")
    return args


def open_data(args: argparse.Namespace) -> tuple[BlockSource, int | None]:
    """The source ``--data`` names and its validation split (``split_blocks``' ``every``: None for
    TBSM's split by time)."""
    if args.model == "tbsm":
        return open_taobao_source(args, BLOCK), None
    return open_source(args, BLOCK)[0], args.val_every


def budget_ladder(total_bytes: int, first: int = FIRST_BUDGET) -> np.ndarray:
    """``first`` doubled while below ``total_bytes``, then ``total_bytes`` (the whole model)."""
    steps = int(np.ceil(np.log2(max(total_bytes / first, 1.0))))
    doublings = first * 2 ** np.arange(steps, dtype=np.int64)
    return np.append(doublings[doublings < total_bytes], total_bytes)


def profile(
    args: argparse.Namespace, source: BlockSource, every: int | None
) -> tuple[AccessStats, SampleBlock]:
    """Profile the training inputs; the statistics and the inputs the profile did not sample."""
    profiler = AccessProfiler(source.table_configs(args.dim), args.sample, args.seed, args.holdout)
    blocks = source.split_blocks(False, every, BLOCK)
    return profile_training(profiler, blocks, source.feature_names)[:2]


def hot_share(hot_set: HotSet, inputs: dict[str, np.ndarray]) -> float:
    """Share of ``inputs`` (per feature id arrays) that ``hot_set`` makes entirely hot; nan for none."""
    hot = hot_set.is_hot_input(inputs)
    return float(hot.mean()) if len(hot) else float("nan")


def target_hot_share(hot_set: HotSet, inputs: dict[str, np.ndarray]) -> float:
    """Share of ``inputs`` whose last step alone (each table's last feature: TBSM's target) is hot."""
    hot = [
        hot_set.is_hot(index, inputs[config.feature_names[-1]].reshape(-1))
        for index, config in enumerate(hot_set.tables)
    ]
    return float(np.logical_and.reduce(hot).mean()) if len(hot[0]) else float("nan")


def measure(
    args: argparse.Namespace, stats: AccessStats, measured_on: dict[str, dict[str, np.ndarray]]
) -> dict[str, list]:
    """Per budget: FAE's hot rows, the estimated share with its 95% interval and the measured shares
    on each set of ``measured_on`` (and, for TBSM, the target step's on the unprofiled inputs)."""
    ranking = stats.ranking()
    budgets = (
        np.sort([parse_bytes(b) for b in args.budgets])
        if args.budgets
        else budget_ladder(ranking.total_bytes)
    )
    curve = hot_share_curve(ranking, budgets)
    results: dict[str, list] = {
        "budget": budgets.tolist(),
        "hot_rows": [],
        "row_share": [],
        "estimated": curve.share.tolist(),
        "low": curve.low.tolist(),
        "high": curve.high.tolist(),
        **{name: [] for name in measured_on},
    }
    if args.model == "tbsm":
        results["target_step"] = []
    total_rows = int(stats.layout.num_rows.sum())
    for budget in tqdm(budgets, desc="budgets", unit="budget"):
        hot_set = ranking.hot_set(int(budget))
        results["hot_rows"].append(hot_set.total_hot)
        results["row_share"].append(hot_set.total_hot / total_rows)
        for name, inputs in measured_on.items():
            results[name].append(hot_share(hot_set, inputs))
        if args.model == "tbsm":
            results["target_step"].append(target_hot_share(hot_set, measured_on["unprofiled"]))
    return results


def print_table(results: dict[str, list], total_bytes: int) -> None:
    """One line per budget; a budget that holds the whole model is starred."""
    measured = [key for key in MEASURED if key in results]
    print(
        f"{'budget':>11}{'hot rows':>12}{'of rows':>9}  {'estimated [95% interval]':<27}"
        + "".join(f"{key.replace('_', ' '):>13}" for key in measured)
    )
    for i, budget in enumerate(results["budget"]):
        label = format_bytes(budget) + ("*" if budget >= total_bytes else "")
        estimate = f"{results['estimated'][i]:.2%} [{results['low'][i]:.2%}, {results['high'][i]:.2%}]"
        print(
            f"{label:>11}{results['hot_rows'][i]:>12,}{results['row_share'][i]:>9.2%}  {estimate:<27}"
            + "".join(f"{results[key][i]:>13.2%}" for key in measured)
        )
    print(f"* the whole model ({total_bytes:,} bytes): every row hot")


def plot(results: dict[str, list], title: str, path: Path) -> None:
    """Share against budget (log x): the estimate's 95% band and line, the measured points."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mib = np.asarray(results["budget"]) / 2**20
    fig, axis = plt.subplots(figsize=(7, 4.5))
    axis.fill_between(mib, results["low"], results["high"], alpha=0.3, label="estimated, 95% interval")
    axis.plot(mib, results["estimated"], label="estimated (profile's holdout)")
    for key, (marker, label) in MEASURED.items():
        if key in results:
            axis.plot(mib, results[key], marker, fillstyle="none", label=f"measured: {label}")
    axis.set_xscale("log")
    axis.set_xlabel("hot-row budget (MiB)")
    axis.set_ylabel("share of inputs entirely hot")
    axis.set_ylim(0, 1)
    axis.set_title(title, fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, list]:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        source, every = open_data(args)
    except ValueError as error:
        fail(str(error))
    title = describe(args, source)
    stats, unprofiled = profile(args, source, every)
    held_out = list(source.split_blocks(True, every, BLOCK))
    if not held_out:
        fail(f"--data {' '.join(args.data)} has no validation input")
    validation = SampleBlock.concat(held_out)
    print(
        f"data: {title}; profiled {stats.num_sampled:,} of {stats.num_inputs:,} training inputs "
        f"({args.sample:.0%}), holdout {len(stats.holdout):,}; measured on the {len(unprofiled):,} "
        f"unprofiled training inputs and {len(validation):,} validation inputs"
    )
    names = source.feature_names
    results = measure(
        args,
        stats,
        {"unprofiled": unprofiled.feature_ids(names), "validation": validation.feature_ids(names)},
    )
    total_bytes = stats.ranking().total_bytes
    print_table(results, total_bytes)
    figure = Path(args.figures) / "bench_hot_share.png"
    plot(results, f"Hot-input share against the hot-row budget\n{title}", figure)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "args": vars(args),
        "data": title,
        "total_bytes": total_bytes,
        "total_rows": int(stats.layout.num_rows.sum()),
        "num_sampled": stats.num_sampled,
        "holdout": len(stats.holdout),
        "num_unprofiled": len(unprofiled),
        "num_validation": len(validation),
        **results,
    }
    written = out / "bench_hot_share.json"
    written.write_text(json.dumps(summary, indent=1))
    print(f"wrote {figure} and {written}; total wall time {time.perf_counter() - started:.0f} s")
    return results


if __name__ == "__main__":
    main()
