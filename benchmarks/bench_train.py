"""CPU training throughput of FAE against TorchRec's default planner, at world size 1 and 2 (gloo).

Each world size trains the ``--model``'s example (``examples/train_dlrm_fae.py``, or
``examples/train_tbsm_fae.py`` for ``--model tbsm``) on the same built-in synthetic data as FAE (hot
steps on the hot part only) and as ``--baseline`` (the unsplit model planned by TorchRec's default
planner), ``--repeats`` times each, alternating (FAE first in even repetitions, the baseline first in odd
ones, so that neither always runs first), both on TorchRec's train pipeline by default (FAE on
``FAETrainPipeline``, the baseline on the stock ``TrainPipelineSparseDist``; ``--pipeline none`` for the
plain loop). Both train on the training inputs the profile did not sample (the example's
``--exclude-profiled``): the hot set is chosen on inputs disjoint from those the speed is measured on.
Every figure is the example's own wall-clock measure of its training steps (``metrics.json``):
samples/s, mean hot and cold step times, and the routing time (getting a step's batch from the router,
which on the pipeline splits FAE's batches for the parts).

FAE's machinery is what its steps do that the baseline's do not: the extra routing time, which is the
split of each batch for the parts (by sign, from the part ids the partition stored: the remap was done
when it was written). Its share of a mean FAE step is printed against the goal of at most 2%, with the
split timed alone on rank 0's batches of the first ``--split-steps`` steps (``FAEEmbeddingBagCollection
.split``, rebuilt from the run's ``stats.npz`` and partition), beside the lookup remap it replaces.
Peak RSS (rank 0's, both sides) is printed against the tables with their optimizer state.

DLRM trains on ``--num-samples`` Criteo-like inputs over Criteo Kaggle's table sizes times ``--scale``;
TBSM on the Taobao-like histories of ``--num-users`` users (about 5.6 training inputs each, 21 steps an
input) over the TBSM reference run's table sizes (987,994 users, 4,162,024 items, 9,439 categories)
times ``--scale``. Both take a 16 MiB hot-row budget by default: for TBSM at the default 50,000 users
it holds every row the profile's 20% sample sees (some 223,000 rows, 13.6 MiB), which makes about 36%
of the unprofiled training inputs hot, the ones trained on (``bench_hot_share.py`` draws the curve).

World size 1 is one process with torch's default threads; more ranks run under torchrun, which gives
each rank one thread. Run it on an otherwise idle machine: a step whose threads wait on a core another
process keeps busy can take many times as long (the script warns when it sees one).

    python benchmarks/bench_train.py                  # world sizes 1 and 2, 4 repeats: ~18 min on 2 cores
    python benchmarks/bench_train.py --world-sizes 1 --num-samples 200000 --scale 0.05
    python benchmarks/bench_train.py --model tbsm --world-sizes 1 --repeats 1   # TBSM: ~1 min a mode

Prints a table per world size, the ratios FAE / baseline, the machinery share and, where FAE is slower,
why (from the measured step times); writes ``bench_train.png`` to ``--figures``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from functools import partial
from itertools import islice
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from benchmarks.common.arguments import add_training_options, training_options
from benchmarks.common.example_runs import data_size, run_example
from benchmarks.common.statistics import standard_error
from fae_torchrec import AccessStats, BatchRouter, FAEEmbeddingBagCollection, HotColdPartition
from fae_torchrec.modules import SplitFeatures
from fae_torchrec.threads import busy_cores, usable_cores
from fae_torchrec.train import RoutedBatch
from fae_torchrec.units import parse_bytes

MODES = ("fae", "torchrec")
#: The goal for FAE's machinery (what its steps do that the baseline's do not), as a share of a step.
MACHINERY_GOAL = 0.02
#: Peak RSS goals: FAE against the baseline, and either against the tables with optimizer state.
RSS_GOAL_RATIO, RSS_GOAL_TABLES = 1.1, 2.0
#: Cores kept busy by other processes (just before a run) above which the figures are distorted.
BUSY_CORES = 0.3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    add_training_options(parser)
    parser.add_argument(
        "--pipeline", default="sparse", choices=("sparse", "none"), help="the example's --pipeline"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="runs of each mode per world size (even: each mode first as often)",
    )
    parser.add_argument("--split-steps", type=int, default=200, help="steps whose split is timed alone")
    parser.add_argument("--out", default="runs/bench_train", help="the runs go here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_train.png goes here")
    args = parser.parse_args(argv)
    if min(args.world_sizes) < 1:
        parser.error(f"--world-sizes must be at least 1, got {args.world_sizes}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.split_steps < 1:
        parser.error(f"--split-steps must be at least 1, got {args.split_steps}")
    return args


def example_args(args: argparse.Namespace) -> list[str]:
    """The example's options shared by every run: both modes train on the inputs the profile left out
    (``--exclude-profiled``), so that no figure comes from the inputs that chose the hot set."""
    return [*data_size(args), *training_options(args), "--pipeline", args.pipeline]


def mean_step_ms(metrics: dict) -> float:
    """Mean training step time: hot and cold step times weighted by their counts."""
    hot, cold = metrics["hot_steps"], metrics["cold_steps"]
    total = (hot * (metrics["hot_step_ms"] or 0.0)) + (cold * (metrics["cold_step_ms"] or 0.0))
    return total / (hot + cold)


def split_ms(args: argparse.Namespace, run: Path, world_size: int) -> dict[str, float]:
    """Mean time per step of FAE's split (``FAEEmbeddingBagCollection.split``) on rank 0's batches of
    the first ``--split-steps`` steps of the FAE run in ``run``: by sign from the partition's part ids
    (``part_ids``, what the router does) and by lookup from original ids (``lookup``, the remap the
    module would do in its forward without them)."""
    stats = AccessStats.load(run / "stats.npz")  # the run's tables, of either model
    module = FAEEmbeddingBagCollection(list(stats.tables), stats.hot_set(parse_bytes(args.budget)))
    partition = HotColdPartition.open(run / "partition-fae")
    seconds: dict[str, list[float]] = {"part_ids": [], "lookup": []}

    def timed(kind: str, features: KeyedJaggedTensor, is_hot: bool, part_ids_of: str | None) -> SplitFeatures:
        started = time.perf_counter()
        split = module.split(features, is_hot, part_ids_of)
        seconds[kind].append(time.perf_counter() - started)
        return split

    def router(split=None) -> Iterator[RoutedBatch]:
        routed = BatchRouter(partition, args.batch_size, world_size, 0, args.order, args.seed, split=split)
        return islice(routed.epoch(0), args.split_steps)

    for _ in router(partial(timed, "part_ids")):
        pass
    del seconds["part_ids"][0]  # the router's check of the module's hot set: a split of one input
    for routed in router():
        timed("lookup", routed.batch.sparse_features, routed.hot, None)
    return {kind: 1000 * float(np.mean(times)) for kind, times in seconds.items()}


def explain_slower(world_size: int, fae: dict, baseline: dict) -> str:
    """Why FAE trains slower than the baseline here, from the measured step times."""
    base, hot, cold = baseline["cold_step_ms"], fae["hot_step_ms"], fae["cold_step_ms"]
    share = fae["hot_steps"] / (fae["hot_steps"] + fae["cold_steps"])
    ratio = fae["samples_per_second"] / baseline["samples_per_second"]
    exchange = ", each with its own all-to-all over gloo" if world_size > 1 else ""
    if hot is None or cold is None:  # a budget of 0, or one that holds the whole model
        kind, step = ("cold", cold) if hot is None else ("hot", hot)
        return (
            f"world size {world_size}: FAE is slower ({ratio:.2f}x the baseline's samples/s) with every "
            f"step {kind}: {step:.1f} ms a step, the baseline's {base:.1f} ms."
        )
    lines = [
        f"world size {world_size}: FAE is slower ({ratio:.2f}x the baseline's samples/s). A baseline step "
        f"takes {base:.1f} ms; FAE's cold steps {cold:.1f} ms ({cold / base:.2f}x: lookups in both parts"
        f"{exchange}) and its hot steps {hot:.1f} ms ({hot / base:.2f}x), {share:.0%} of the steps hot."
    ]
    if hot >= base:
        lines.append(
            f"  Even a hot step is {hot - base:.1f} ms slower than a baseline step: on CPU the hot rows sit "
            "in the same memory as the cold rows, so a hot step saves no host-device traffic (what FAE "
            "saves on a GPU), only the cold part's lookup."
        )
    elif cold > base:
        lines.append(
            f"  Hot steps save {base - hot:.1f} ms each, cold steps cost {cold - base:.1f} ms more; FAE "
            f"would break even at {(cold - base) / (cold - hot):.0%} hot steps. On CPU a hot step saves no "
            "host-device traffic, which is what FAE saves on a GPU."
        )
    else:
        lines.append("  Neither kind of step is slower than the baseline's: the difference is noise.")
    return "\n".join(lines)


def memory_line(fae: dict, baseline: dict) -> str:
    """Rank 0's peak RSS of both runs against the goals: FAE at most ``RSS_GOAL_RATIO`` x the baseline,
    both at most ``RSS_GOAL_TABLES`` x the tables with their optimizer state."""
    ratio = fae["peak_rss_gib"] / baseline["peak_rss_gib"]
    tables = fae["tables_with_state_gib"]
    worst = max(fae["peak_rss_gib"], baseline["peak_rss_gib"]) / tables
    return (
        f"peak RSS (rank 0): FAE {fae['peak_rss_gib']:.2f} GiB, baseline {baseline['peak_rss_gib']:.2f} "
        f"GiB: {ratio:.2f}x (goal <= {RSS_GOAL_RATIO}x: {_verdict(ratio <= RSS_GOAL_RATIO)}); tables with "
        f"optimizer state {tables:.2f} GiB, the larger peak {worst:.2f}x of it (goal <= {RSS_GOAL_TABLES}x: "
        f"{_verdict(worst <= RSS_GOAL_TABLES)})"
    )


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def plot(results: dict[int, dict[str, dict]], model: str, path: Path) -> None:
    """Samples/s per world size and mode, and step times (FAE hot and cold, the baseline's)."""
    sizes = sorted(results)
    x = np.arange(len(sizes))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for offset, mode in zip((-0.2, 0.2), MODES, strict=True):
        left.bar(x + offset, [results[n][mode]["samples_per_second"] for n in sizes], 0.4, label=mode)
    left.set_ylabel("samples/s")
    bars = [
        ("FAE hot step", lambda n: results[n]["fae"]["hot_step_ms"] or 0.0),
        ("FAE cold step", lambda n: results[n]["fae"]["cold_step_ms"] or 0.0),
        ("torchrec step", lambda n: results[n]["torchrec"]["cold_step_ms"] or 0.0),
    ]
    for index, (label, value) in enumerate(bars):
        right.bar(x + (index - 1) * 0.27, [value(n) for n in sizes], 0.27, label=label)
    right.set_ylabel("ms per step")
    for axis in (left, right):
        axis.set_xticks(x, [f"{n} rank(s)" for n in sizes])
        axis.legend()
    fig.suptitle(f"{model.upper()} training on CPU: FAE against TorchRec's default planner")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[int, dict[str, dict]]:
    args = parse_args(argv)
    out = Path(args.out)
    started = time.perf_counter()
    results: dict[int, dict[str, dict]] = {}
    data = f"{args.num_users:,} users" if args.model == "tbsm" else f"{args.num_samples:,} inputs"
    print(
        f"data: {args.model.upper()}, {data} (synthetic), scale {args.scale}, dim {args.dim}, batch "
        f"{args.batch_size} per rank, FAE budget {args.budget}, order {args.order}, pipeline "
        f"{args.pipeline}, {args.repeats} runs of each mode"
    )
    pairs = list(zip(MODES, ([], ["--baseline"]), strict=True))  # each mode with its example options
    for world_size in args.world_sizes:
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode, extra in pairs if repeat % 2 == 0 else pairs[::-1]:
                busy = busy_cores(1.0)
                if busy > BUSY_CORES:
                    print(
                        f"warning: other processes kept {busy:.1f} of {len(usable_cores())} cores busy just "
                        f"before the {mode} run at world size {world_size}: a step whose threads wait on a "
                        "busy core can take many times as long, so its figures may be distorted"
                    )
                run = out / f"ws{world_size}-{mode}-{repeat}"
                runs[mode].append(run_example([*example_args(args), *extra], run, world_size, args.model))
        ratios = [
            f["samples_per_second"] / b["samples_per_second"] for f, b in zip(*runs.values(), strict=True)
        ]
        best = int(np.argsort(ratios)[len(ratios) // 2])  # the median repetition is reported in full
        fae, baseline = runs["fae"][best], runs["torchrec"][best]
        results[world_size] = {"fae": fae, "torchrec": baseline}
        fae["split_ms"] = split_ms(args, out / f"ws{world_size}-fae-{best}", world_size)
        extra_ms = fae["routing_ms"] - baseline["routing_ms"]
        fae["machinery_share"] = extra_ms / mean_step_ms(fae)
        print(
            f"\nworld size {world_size} (the median of {args.repeats} repetitions by ratio; "
            f"{fae['train_inputs']:,} training inputs, the profile's sample left out)"
        )
        print(
            f"{'mode':<10}{'samples/s':>12}{'hot ms':>9}{'cold ms':>9}{'hot steps':>11}{'routing ms':>12}"
            f"{'peak RSS GiB':>14}"
        )
        for mode, metrics in results[world_size].items():
            hot, cold = metrics["hot_step_ms"], metrics["cold_step_ms"]
            share = metrics["hot_steps"] / (metrics["hot_steps"] + metrics["cold_steps"])
            print(
                f"{mode:<10}{metrics['samples_per_second']:>12,.0f}"
                f"{'-' if hot is None else f'{hot:.1f}':>9}{'-' if cold is None else f'{cold:.1f}':>9}"
                f"{share:>11.1%}{metrics['routing_ms']:>12.2f}{metrics['peak_rss_gib']:>14.2f}"
            )
        print(
            "ratio FAE / torchrec samples/s per repetition: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
            + f"; mean {np.mean(ratios):.2f}x (SE {standard_error(ratios):.2f}), "
            f"{sum(r >= 1 for r in ratios)} of {len(ratios)} at least 1.0x"
        )
        hot_ratio = (fae["hot_step_ms"] or float("nan")) / baseline["cold_step_ms"]
        print(f"FAE hot step / baseline step: {hot_ratio:.2f}x (goal < 1.0x: {_verdict(hot_ratio < 1)})")
        split, share = fae["split_ms"], fae["machinery_share"]
        print(
            f"FAE machinery: routing {fae['routing_ms']:.2f} ms - the baseline's "
            f"{baseline['routing_ms']:.2f} ms = {extra_ms:.2f} ms, {share:.1%} of a "
            f"{mean_step_ms(fae):.1f} ms step (goal <= {MACHINERY_GOAL:.0%}: "
            f"{_verdict(share <= MACHINERY_GOAL)}); the split alone takes {split['part_ids']:.2f} ms per "
            f"step from the partition's part ids ({split['lookup']:.2f} ms by "
            "looking original ids up, the remap it replaces)"
        )
        print(memory_line(fae, baseline))
        if ratios[best] < 1:
            print(explain_slower(world_size, fae, baseline))
    figure = Path(args.figures) / "bench_train.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.model, figure)
    print(f"\nwrote {figure}; total wall time {time.perf_counter() - started:.0f} s")
    return results


if __name__ == "__main__":
    main()
