"""Host memory of checkpoints: the DLRM example's peak RSS without checkpoints, saving them, and resuming
from one, against the tables with their optimizer state (issue 49).

Each run is the example (``examples/train_dlrm_fae.py``) as a user launches it, on its built-in synthetic
data at Criteo Kaggle's table sizes times ``--scale``: first without checkpoints, then saving one every
``--checkpoint-every`` steps, then resuming from the last of them (which loads it, and trains what is
left of the epoch: nothing when the last step was saved). Printed per world size: each run's peak RSS
(the largest rank's, of ``metrics.json``'s ``peak_rss_gib_ranks``), what saving and loading add to the run
without checkpoints, and that as a share of the tables with their optimizer state (the goal: at most
10%), and that share of Criteo Terabyte's tables at the same dimension and optimizer (as if it grew with
the tables; a bounded buffer does not).

    python benchmarks/bench_checkpoint.py                  # Kaggle sizes, 1 rank: about 8 minutes here
    python benchmarks/bench_checkpoint.py --scale 0.05 --num-samples 20k --world-sizes 1 2
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.example_runs import run_example
from fae_torchrec.arguments import positive_int

#: What the checkpoints may add to the run's peak, as a share of the tables with their optimizer state.
GOAL_SHARE = 0.10
#: Criteo Terabyte's rows (TorchRec's DLRM sizes) against Kaggle's, for the extrapolation.
TERABYTE_ROWS, KAGGLE_ROWS = 177_944_275, 33_762_577


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--num-samples", type=positive_int, default="60000", help="synthetic inputs")
    parser.add_argument("--batch-size", type=positive_int, default=2048, help="per-rank batch size")
    parser.add_argument("--optimizer", default="adagrad", help="embedding optimizer (its state is saved)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=10, help="steps between saves")
    parser.add_argument("--world-sizes", type=positive_int, nargs="+", default=[1], help="ranks per run")
    parser.add_argument("--out", help="the runs' folder (default: a temporary one, removed after)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[int, dict[str, dict]]:
    args = parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_checkpoint-"))
    common = [
        "--scale", str(args.scale), "--num-samples", str(args.num_samples), "--batch-size",
        str(args.batch_size), "--optimizer", args.optimizer,
    ]  # fmt: skip
    print(
        f"DLRM example, {args.num_samples:,} synthetic inputs, Kaggle's tables x {args.scale}, batch "
        f"{args.batch_size} per rank, {args.optimizer}; peak RSS of the largest rank (GiB)"
    )
    results: dict[int, dict[str, dict]] = {}
    started = time.perf_counter()
    try:
        for world in args.world_sizes:
            folder, checkpoints = out / f"ws{world}", out / f"ws{world}" / "checkpoints"
            saving = [*common, "--checkpoint-dir", str(checkpoints)]
            runs = {
                "none": run_example(common, folder / "none", world),
                "save": run_example(
                    [*saving, "--checkpoint-every", str(args.checkpoint_every)], folder / "save", world
                ),
                "resume": run_example([*saving, "--resume"], folder / "resume", world),
            }
            results[world] = runs
            print_runs(world, runs, args.scale)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    print(f"{time.perf_counter() - started:.0f} s")
    return results


def print_runs(world: int, runs: dict[str, dict], scale: float) -> None:
    """One world size's runs: peaks, what checkpoints add and its share of the tables with state, and
    that share of Terabyte's tables (the conservative extrapolation: as if it grew with the tables)."""
    tables = runs["none"]["tables_with_state_gib"]
    terabyte = tables * TERABYTE_ROWS / KAGGLE_ROWS / scale
    base = max(runs["none"]["peak_rss_gib_ranks"])
    print(
        f"world size {world}: tables with optimizer state {tables:.2f} GiB (Terabyte's {terabyte:.0f} GiB); "
        f"without checkpoints {base:.2f}"
    )
    for name, what in (("save", "saving"), ("resume", "resuming (a load)")):
        peak = max(runs[name]["peak_rss_gib_ranks"])
        share = (peak - base) / tables
        verdict = "met" if share <= GOAL_SHARE else "NOT met"
        print(
            f"  {what}: {peak:.2f}, {peak - base:+.3f} GiB, {share:+.1%} of the tables with state (goal "
            f"<= {GOAL_SHARE:.0%}: {verdict}); at Terabyte's sizes {share * terabyte:+.1f} GiB"
        )


if __name__ == "__main__":
    main()
