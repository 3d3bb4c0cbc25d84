"""CPU training throughput of FAE against TorchRec's default planner, both models in one process.

``bench_train.py`` runs each mode as its own process, one after the other; on a shared machine whose
speed drifts between runs (BENCHMARKS.md, section 2) that buries a difference of a few percent. Here each
rank builds both models as ``examples/train_dlrm_fae.py`` does (the recipe's ``build_training``: FAE's,
and the baseline's with ``--baseline``, on the same data, the profile's sample left out; TBSM's with
``--model tbsm``, as ``examples/train_tbsm_fae.py`` builds them) and trains them in
alternating stretches of ``--stretch`` steps (FAE's first in every other pair), both on TorchRec's train
pipeline, so that both see the same moments of the machine. Each pair of stretches gives a ratio, FAE's
samples/s over the baseline's (the example's own step times, routing excluded); the first
``--warmup-pairs`` and a last, partial pair are left out. Printed per world size: the ratio over all
counted steps, the pairs' mean ratio with its standard error and their median (a stretch that meets a slow
moment of the machine moves the mean), how many pairs reach 1.0x, each half's mean (a drift along the run
would show there), and the routing time per step with the ratio over all counted steps and their routing
(the end-to-end figure: routing runs before each step, on its critical path). ``bench_interleaved.png``
plots the ratio per pair. ``--modes`` measures another pair of modes (``MODES``), the first over the
second, such as FAE's planned cold tier over its caching tier (``bench_interleaved_planned_fae.png``).

    python benchmarks/bench_interleaved.py                            # world sizes 1 and 2: ~5 min on 2 cores
    python benchmarks/bench_interleaved.py --epochs 4 --stretch 40    # the doubling: ~10 min
    python benchmarks/bench_interleaved.py --model tbsm --batch-size 256   # TBSM, 50,000 synthetic users
    python benchmarks/bench_interleaved.py --modes planned fae     # the planned cold tier against caching

World size 1 is one process with torch's default threads; more ranks run under torchrun (one thread a
rank). Each rank holds both models, so memory is about twice ``bench_train.py``'s.
"""

from __future__ import annotations

# first: importing fae_torchrec sets OpenMP's wait policy before torch loads (fae_torchrec.threads)
from fae_torchrec import recipes

# isort: split
import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import chain, count, islice
from pathlib import Path

import matplotlib
import torch.distributed as dist

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.arguments import add_training_options, fail, training_options
from benchmarks.common.example_runs import ERROR_TAIL_LINES, data_size, launcher
from benchmarks.common.statistics import standard_error
from fae_torchrec.arguments import non_negative_int, positive_int
from fae_torchrec.train.runner import StepRunner

#: Each mode with the example options that select it: FAE (its cold tier FBGEMM's caches, TorchRec's CPU
#: kernels here), TorchRec's default planner, and FAE with the planned cold tier.
MODES = {"fae": [], "torchrec": ["--baseline"], "planned": ["--cold-tier", "planned"]}
#: Per stretch, as the worker records it: inputs, step seconds, routing seconds, hot steps, steps.
FIELDS = ("inputs", "seconds", "routing_seconds", "hot_steps", "steps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--modes",
        nargs=2,
        choices=list(MODES),
        default=["fae", "torchrec"],
        metavar="MODE",
        help=f"the mode measured and the one it is measured against, of {list(MODES)} (planned: FAE with "
        "--cold-tier planned)",
    )
    add_training_options(parser)
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs each model trains")
    parser.add_argument("--stretch", type=positive_int, default=20, help="steps of one model in a row")
    parser.add_argument(
        "--warmup-pairs", type=non_negative_int, default=2, help="first pairs of stretches left out"
    )
    parser.add_argument("--out", default="runs/bench_interleaved", help="the runs go here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_interleaved.png goes here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one rank's part
    return parser.parse_args(argv)


def example_args(args: argparse.Namespace) -> list[str]:
    """The example's options both models share (on the train pipeline, without the profiled inputs)."""
    return [*data_size(args), *training_options(args), "--epochs", str(args.epochs), "--pipeline", "sparse"]


def alternate(steps: dict[str, Iterator], stretch: int, world_size: int) -> dict[str, list[list[float]]]:
    """Train ``stretch`` steps of each mode's ``StepRunner.train`` iterator in turn (the second mode
    first in odd pairs) until one runs out; per mode, per stretch, the ``FIELDS``."""
    modes = list(steps)
    stretches: dict[str, list[list[float]]] = {mode: [] for mode in modes}
    for pair in count():
        for mode in modes if pair % 2 == 0 else modes[::-1]:
            trained = [
                (routed.batch.labels.numel() * world_size, seconds, routing, routed.hot, 1)
                for routed, _, seconds, routing in islice(steps[mode], stretch)
            ]
            stretches[mode].append(
                [float(sum(column)) for column in zip(*trained, strict=True)] or [0.0] * len(FIELDS)
            )
        if any(stretches[mode][-1][4] < stretch for mode in modes):
            return stretches


def _epochs(router, epochs: int) -> Iterator:
    """The routed steps of ``router``'s first ``epochs`` epochs, one after the other."""
    return chain.from_iterable(router.epoch(epoch, plan_next=epoch + 1 < epochs) for epoch in range(epochs))


def worker(args: argparse.Namespace) -> None:
    """One rank: build both models, train them alternating, and (rank 0) write ``stretches.json``."""
    family = recipes.FAMILIES[args.model]
    rank, world, device = recipes.init_distributed()
    out = Path(args.out)
    try:
        steps = {}
        for mode in args.modes:
            extra = MODES[mode]
            options = recipes.parse_args(family, [*example_args(args), *extra, "--out", str(out / mode)])
            training = recipes.build_training(options, rank, world, device, family)
            runner = StepRunner(
                training.config.pipeline, training.model, training.optimizer, device, fae=training.fae
            )
            steps[mode] = runner.train(_epochs(training.router, options.epochs))
        stretches = alternate(steps, args.stretch, world)
        if rank == 0:
            (out / "stretches.json").write_text(json.dumps(stretches))
    finally:
        gc.collect()  # the models' DDP wrappers hold the process group (see the recipe's main)
        dist.destroy_process_group()


def summarize(stretches: dict[str, list[list[float]]], warmup_pairs: int) -> dict:
    """Ratios of the first mode over the second (``--modes``; FAE over the baseline) of the pairs counted
    (the warm-up and the last, partial pair left out)."""
    counted = {mode: np.asarray(rows[warmup_pairs:-1], dtype=np.float64) for mode, rows in stretches.items()}
    fae, baseline = counted.values()  # the first mode, the second
    if len(fae) < 2:
        raise ValueError(
            f"{len(fae)} pairs of stretches counted after --warmup-pairs {warmup_pairs}: need at least 2 "
            "(more --epochs or a shorter --stretch)"
        )
    ratios = (fae[:, 0] / fae[:, 1]) / (baseline[:, 0] / baseline[:, 1])
    half = len(ratios) // 2
    return {
        "ratios": ratios,
        "overall": (fae[:, 0].sum() / fae[:, 1].sum()) / (baseline[:, 0].sum() / baseline[:, 1].sum()),
        "with_routing": (fae[:, 0].sum() / fae[:, 1:3].sum())
        / (baseline[:, 0].sum() / baseline[:, 1:3].sum()),
        "samples_per_second": {mode: rows[:, 0].sum() / rows[:, 1].sum() for mode, rows in counted.items()},
        "routing_ms": {mode: 1000 * rows[:, 2].sum() / rows[:, 4].sum() for mode, rows in counted.items()},
        "hot_share": fae[:, 3].sum() / fae[:, 4].sum(),
        "halves": (ratios[:half].mean(), ratios[half:].mean()),
    }


def report(world_size: int, summary: dict, stretch: int) -> str:
    """The lines printed for one world size."""
    ratios, sps, routing = summary["ratios"], summary["samples_per_second"], summary["routing_ms"]
    first, second = sps
    return "\n".join(
        [
            f"\nworld size {world_size}: {len(ratios)} pairs of {stretch}-step stretches counted, "
            f"{summary['hot_share']:.1%} of {first}'s steps hot",
            f"samples/s: {first} {sps[first]:,.0f}, {second} {sps[second]:,.0f}: "
            f"{first} / {second} {summary['overall']:.3f}x over all counted steps",
            f"per pair: mean {ratios.mean():.3f}x (SE {standard_error(ratios):.3f}), median "
            f"{np.median(ratios):.3f}x, "
            f"{int(np.sum(ratios >= 1))} of {len(ratios)} at least 1.0x; first half "
            f"{summary['halves'][0]:.3f}x, second half {summary['halves'][1]:.3f}x",
            f"routing ms per step: {first} {routing[first]:.2f}, {second} {routing[second]:.2f}; "
            f"{first} / {second} with routing included {summary['with_routing']:.3f}x",
        ]
    )


def plot(summaries: dict[int, dict], model: str, path: Path) -> None:
    """FAE's ratio per pair of stretches, one line per world size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axis = plt.subplots(figsize=(7, 3.5))
    for world_size, summary in summaries.items():
        axis.plot(
            summary["ratios"], marker=".", label=f"{world_size} rank(s): mean {summary['ratios'].mean():.3f}x"
        )
    axis.axhline(1.0, color="gray", linewidth=0.8)
    axis.set_xlabel("pair of stretches")
    first, second = next(iter(summaries.values()))["samples_per_second"]
    axis.set_ylabel(f"{first} / {second} samples/s")
    axis.set_title(f"{model.upper()} on CPU, both models in one process")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[int, dict]:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    started = time.perf_counter()
    size = f"{args.num_users:,} users" if args.model == "tbsm" else f"{args.num_samples:,} inputs"
    print(
        f"data: {args.model.upper()}, {size} (synthetic), scale {args.scale}, dim {args.dim}, batch "
        f"{args.batch_size} per rank, FAE budget {args.budget}, order {args.order}, {args.epochs} epochs, "
        f"stretches of {args.stretch} steps, pipeline sparse"
    )
    summaries = {}
    for world_size in args.world_sizes:
        out = Path(args.out) / f"ws{world_size}"
        forwarded = list(sys.argv[1:] if argv is None else argv)  # the worker reads the same options
        command = [*launcher(world_size), __file__, *forwarded, "--out", str(out), "--worker"]
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            tail = "\n".join(run.stderr.splitlines()[-ERROR_TAIL_LINES:])
            raise RuntimeError(f"{' '.join(command)} failed with exit status {run.returncode}:\n{tail}")
        summaries[world_size] = summarize(json.loads((out / "stretches.json").read_text()), args.warmup_pairs)
        print(report(world_size, summaries[world_size], args.stretch))
    modes = "" if args.modes == ["fae", "torchrec"] else "_" + "_".join(args.modes)
    figure = Path(args.figures) / f"bench_interleaved{modes}.png"
    plot(summaries, args.model, figure)
    print(f"\nwrote {figure}; total wall time {time.perf_counter() - started:.0f} s")
    return summaries


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # too few stretches for the options given
        fail(str(error))
