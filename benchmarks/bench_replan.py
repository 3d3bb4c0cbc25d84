"""What a re-plan costs at Criteo Kaggle's sizes: the decision, the row move and the re-partition, in seconds
and bytes, on this machine.

Builds the DLRM example's FAE run (``fae_torchrec.recipes``: the data profiled and partitioned, the model
planned and sharded by DMP with its tables set) at Kaggle's table sizes (``--scale 1.0``: 33.8M rows) on
time-ordered synthetic days whose popularity rotates (``--days 2 --drift``), watches the first
``--watch-steps`` steps of the schedule as training would (``Replanning.observe``: the recent counts of
every rank's inputs), then times a check (``Replanning.upcoming``: a sample of the inputs left to train;
``Replanner.decide``: the recent counts as statistics, FAE's hot set of the run's budget, both hot
sets' shares on that sample) and the move to its
hot set (``Replanning``'s own: the training state gathered in the unsplit layout, the new model planned and
sharded, the state loaded into it, the untrained inputs and the full data partitioned again). The
re-plan is forced: the cost is what is measured, whatever the decision. Run on one rank, or under
``torchrun`` for several (gloo on CPU; the gather then all-reduces every table)::

    python benchmarks/bench_replan.py                       # ~3 min on 2 cores, ~8 GB
    python benchmarks/bench_replan.py --scale 0.05          # a small run: seconds

Prints each phase's seconds and bytes and writes them to ``bench_replan.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fae_torchrec.arguments import positive_int
from fae_torchrec.recipes import DLRM
from fae_torchrec.recipes.build import build_training, init_distributed
from fae_torchrec.recipes.options import parse_args
from fae_torchrec.recipes.replan import Replanning
from fae_torchrec.units import format_bytes


def parse_options(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's options, and the example's (``--scale``, ``--num-samples``, ... pass through)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--watch-steps", type=positive_int, default=200, help="steps watched before the check"
    )
    parser.add_argument("--out", default="runs/bench_replan", help="bench_replan.json and the run's files")
    own, rest = parser.parse_known_args(argv)
    example = [
        "--scale", "1.0", "--num-samples", "500000", "--days", "2", "--drift", "0.0001", "--order", "time",
        "--budget", "64MiB", "--batch-size", "2048", *rest, "--out", own.out, "--replan", "every", "1",
    ]  # fmt: skip
    return own, parse_args(DLRM, example)


def main(argv: list[str] | None = None) -> dict:
    own, args = parse_options(argv)
    rank, world, device = init_distributed()
    started = time.perf_counter()
    training = build_training(args, rank, world, device, DLRM)
    build_seconds = time.perf_counter() - started
    replanning = Replanning(args, DLRM, training, training.data.partition, device)
    schedule = training.router.schedule(0)
    watched = schedule[: own.watch_steps]
    started = time.perf_counter()
    for step in watched:
        replanning.observe(training.router.partition, step)
    replanning.flush()
    watch_seconds = (time.perf_counter() - started) / len(watched)
    started = time.perf_counter()
    upcoming, remaining = replanning.upcoming(
        training.router.partition, schedule[len(watched) :], 0, len(watched)
    )
    decision = replanning.replanner.decide(remaining, args.batch_size * world, 0.0, 0.0, 0.0, upcoming)
    decide_seconds = time.perf_counter() - started
    replanning.move(len(watched), training, training.model, watched, decision)
    move = replanning.last_move
    result = {
        "options": vars(own) | {"example": {k: v for k, v in vars(args).items() if k != "replan"}},
        "world_size": world,
        "table_rows": int(sum(t.num_embeddings for t in training.tables)),
        "build_seconds": build_seconds,
        "watch_ms_per_step": 1000 * watch_seconds,
        "watch_bytes_per_table": replanning.counts.bytes_per_table().tolist(),
        "decision_seconds": decide_seconds,
        "rows_moved": decision.rows_moved,
        "bytes_moved": decision.bytes_moved,
        "share_now": decision.current.share,
        "share_proposed": decision.proposed.share,
        **move,
        "replan_seconds": decide_seconds + sum(v for k, v in move.items() if k.endswith("_seconds")),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20),
    }
    if rank == 0:
        _report(result)
        out = Path(own.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_replan.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def _report(r: dict) -> None:
    rows, ranks = f"{r['table_rows']:,} rows", f"{r['world_size']} rank(s)"
    most = format_bytes(int(np.max(r["watch_bytes_per_table"])))
    moved = f"{r['rows_moved']:,} rows move ({format_bytes(r['bytes_moved'])} with state)"
    shares = f"{100 * r['share_now']:.1f}% hot now, {100 * r['share_proposed']:.1f}% after"
    build = f"the run's build (profile, partition, plan, DMP) took {r['build_seconds']:.1f} s"
    print(f"re-plan at {rows}, {ranks}; {build}")
    print(f"watching: {r['watch_ms_per_step']:.2f} ms a step (in its thread), at most {most} per table")
    print(f"decision: {r['decision_seconds']:.2f} s; {moved}; recent inputs {shares}")
    state = format_bytes(r["state_bytes"])
    print(
        f"move: gather {r['gather_seconds']:.1f} s ({state} of state per rank), plan and shard "
        f"{r['shard_seconds']:.1f} s, load {r['load_seconds']:.1f} s"
    )
    written = format_bytes(r["partition_bytes"])
    inputs = f"{r['repartitioned_inputs']:,} inputs"
    print(f"re-partition: {r['partition_seconds']:.1f} s for {inputs} ({written} written)")
    print(f"re-plan in all: {r['replan_seconds']:.1f} s; peak memory {r['peak_rss_gib']:.1f} GiB")


if __name__ == "__main__":
    main()
