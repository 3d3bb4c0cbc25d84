"""What a re-plan costs at Criteo Kaggle's sizes: the decision, the row move and the re-partition, in seconds
and bytes, and its peak memory against training's, on this machine.

Builds the DLRM example's FAE run (``fae_torchrec.recipes``: the data profiled and partitioned, the model
planned and sharded by DMP with its tables set) at Kaggle's table sizes (``--scale 1.0``: 33.8M rows) on
time-ordered synthetic days whose popularity rotates (``--days 2 --drift``), trains the first
``--watch-steps`` steps of the schedule and watches them as training would (``Replanning.observe``: the
recent counts of every rank's inputs), then times a check (``Replanning.upcoming``: a sample of the inputs
left to train; ``Replanner.decide``: the recent counts as statistics, FAE's hot set of the run's budget,
both hot sets' shares on that sample) and the move to its hot set (``Replanning``'s own: the new hot part
planned, only the rows that change part moved rank to rank and the hot part alone made anew, ``move_rows``;
the untrained inputs and the full data partitioned again). The re-plan is forced: the cost is what is
measured, whatever the decision.

Peak memory is each rank's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` before
each phase): training's over the trained steps, the re-plan's over the check and the move; the largest
rank's is printed. The resident set varies by about 0.1 GiB between runs here, more than what a re-plan
adds; ``--trace-allocations`` counts instead what the re-plan allocates and holds at its peak, by the
allocators' events (``benchmarks.common.allocations``: torch's profiler for tensors, ``tracemalloc`` for
numpy and Python), which do not vary between runs: the re-plan's in all and each phase's (the decision,
the move, the re-partition), the largest rank's; the trace slows the re-plan, so time it in a run
without. Run on one rank, or under ``torchrun`` for several (gloo on CPU)::

    python benchmarks/bench_replan.py                       # ~2 min on 2 cores, ~4 GB
    python benchmarks/bench_replan.py --scale 2.0           # twice the tables
    python benchmarks/bench_replan.py --trace-allocations   # the bytes the re-plan holds, phase by phase
    python benchmarks/bench_replan.py --scale 0.05          # a small run: seconds

Prints each phase's seconds and bytes and writes them to ``bench_replan.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from itertools import islice
from pathlib import Path

import numpy as np
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.allocations import AllocationTrace, traced_allocations
from fae_torchrec.arguments import positive_int
from fae_torchrec.logs import torchrec_quiet
from fae_torchrec.recipes import DLRM
from fae_torchrec.recipes.build import build_training, init_distributed
from fae_torchrec.recipes.options import parse_args
from fae_torchrec.recipes.replan import Replanning
from fae_torchrec.train.runner import StepRunner
from fae_torchrec.units import format_bytes


def parse_options(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's options, and the example's (``--scale``, ``--num-samples``, ... pass through)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--watch-steps", type=positive_int, default=200, help="steps trained and watched before the check"
    )
    parser.add_argument("--out", default="runs/bench_replan", help="bench_replan.json and the run's files")
    parser.add_argument(
        "--trace-allocations",
        action="store_true",
        help="count the re-plan's allocations (torch's profiler, tracemalloc): bytes that do not vary "
        "between runs, as the resident set does; its seconds are then not comparable",
    )
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
    args = training.config
    build_seconds = time.perf_counter() - started
    replanning = Replanning(args, DLRM, training, training.data.partition, device)
    schedule = training.router.schedule(0)
    if own.watch_steps >= len(schedule):
        print(
            f"--watch-steps {own.watch_steps}: the epoch has {len(schedule)} steps at {world} rank(s); "
            "leave some to re-plan for",
            file=sys.stderr,
        )
        sys.exit(2)
    runner = StepRunner(args.pipeline, training.model, training.optimizer, device, fae=training.fae)
    resident = _reset_peak()
    started = time.perf_counter()
    trained = 0
    for routed, *_ in runner.train(islice(training.router.epoch(0), own.watch_steps)):
        replanning.observe(training.router.partition, schedule[routed.step])
        trained += 1
    replanning.flush()
    step_seconds = (time.perf_counter() - started) / trained
    training_peak = _peak()
    _reset_peak()
    watched = schedule[:trained]
    with traced_allocations() if own.trace_allocations else nullcontext(AllocationTrace()) as trace:
        phase = trace.phase if own.trace_allocations else lambda _: nullcontext()
        if own.trace_allocations:  # Replanning.move's own phases, traced apart
            for name, method in PHASES.items():
                setattr(replanning, method, _in_phase(getattr(replanning, method), phase, name))
        started = time.perf_counter()
        with phase("decision"):
            upcoming, remaining = replanning.upcoming(
                training.router.partition, schedule[trained:], 0, trained
            )
            decision = replanning.replanner.decide(
                remaining, args.batch_size * world, 0.0, 0.0, 0.0, upcoming
            )
        decide_seconds = time.perf_counter() - started
        replanning.move(trained, training, runner.paused(), watched, decision)
    replan_peak = _peak()
    move = replanning.last_move
    peaks = [None] * world
    dist.all_gather_object(peaks, (resident, training_peak, replan_peak))
    resident, training_peak, replan_peak = max(peaks, key=lambda p: p[2])
    traces = [None] * world
    dist.all_gather_object(traces, trace)
    trace = max(traces, key=lambda t: t.whole.total_bytes)
    phases = ("plan", "move_rows") if move["path"] == "rows" else ("spill", "shard", "load")
    move_seconds = sum(move[f"{phase}_seconds"] for phase in phases)
    result = {
        "options": vars(own) | {"example": {k: v for k, v in asdict(args).items() if k != "replan"}},
        "world_size": world,
        "table_rows": int(sum(t.num_embeddings for t in training.tables)),
        "build_seconds": build_seconds,
        "trained_steps": trained,
        "step_ms": 1000 * step_seconds,
        "watch_bytes_per_table": replanning.counts.bytes_per_table().tolist(),
        "decision_seconds": decide_seconds,
        "rows_moved": decision.rows_moved,
        "bytes_moved": decision.bytes_moved,
        "share_now": decision.current.share,
        "share_proposed": decision.proposed.share,
        **move,
        "move_seconds": move_seconds,
        "move_us_per_moved_row": 1e6 * move_seconds / max(decision.rows_moved, 1),
        "replan_seconds": decide_seconds + sum(v for k, v in move.items() if k.endswith("_seconds")),
        "resident_gib": resident,
        "training_peak_gib": training_peak,
        "replan_peak_gib": replan_peak,
        "replan_extra_gib": replan_peak - training_peak,
        "replan_over_training": replan_peak / training_peak,
        "traced_allocations": own.trace_allocations,
        "allocations": asdict(trace),
    }
    if rank == 0:
        _report(result)
        out = Path(own.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_replan.json").write_text(json.dumps(result, indent=1, default=str))
    return result


#: The phases of ``Replanning.move`` that ``--trace-allocations`` counts apart, by the method that runs each.
PHASES = {"move": "_move_rows", "re-partition": "_partition_again"}


def _in_phase(method: Callable, phase: Callable[[str], AbstractContextManager], name: str) -> Callable:
    """``method`` run inside ``phase(name)``."""

    def run(*args, **kwargs):
        with phase(name):
            return method(*args, **kwargs)

    return run


def _status_gib(field: str) -> float:
    """A field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in GiB."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / (1 << 20)  # in kB


def _reset_peak() -> float:
    """Reset this process's peak resident set to the resident set now (``/proc/self/clear_refs``), which
    is returned, in GiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_gib("VmRSS")


def _peak() -> float:
    """This process's peak resident set since the last ``_reset_peak``, in GiB."""
    return _status_gib("VmHWM")


def _report(r: dict) -> None:
    rows, ranks = f"{r['table_rows']:,} rows", f"{r['world_size']} rank(s)"
    most = format_bytes(int(np.max(r["watch_bytes_per_table"])))
    moved = f"{r['rows_moved']:,} rows move ({format_bytes(r['bytes_moved'])} with state)"
    shares = f"{100 * r['share_now']:.1f}% hot now, {100 * r['share_proposed']:.1f}% after"
    build = f"the run's build (profile, partition, plan, DMP) took {r['build_seconds']:.1f} s"
    print(f"re-plan at {rows}, {ranks}; {build}")
    print(
        f"training: {r['trained_steps']} steps trained and watched, {r['step_ms']:.1f} ms a step; "
        f"recent counts at most {most} per table"
    )
    print(f"decision: {r['decision_seconds']:.2f} s; {moved}; recent inputs {shares}")
    per_row = f"{r['move_us_per_moved_row']:.1f} us per moved row"
    if r["path"] == "rows":
        rows = f"{r['leaving_rows']:,} rows leave the hot part, {r['entering_rows']:,} enter it"
        gathered = f"{format_bytes(r['gathered_bytes'])} of hot rows with state assembled per rank"
        print(
            f"move, only the rows that change part: plan {r['plan_seconds']:.1f} s, move "
            f"{r['move_rows_seconds']:.1f} s ({rows}; {gathered}): {per_row}"
        )
    else:
        spilled, held = format_bytes(r["spilled_bytes"]), format_bytes(r["state_bytes"])
        print(
            f"move through files: spill {r['spill_seconds']:.1f} s ({spilled} of tables with state written, "
            f"{held} of other state held per rank), plan and shard {r['shard_seconds']:.1f} s, load "
            f"{r['load_seconds']:.1f} s: {per_row}"
        )
    written = format_bytes(r["partition_bytes"])
    inputs = f"{r['repartitioned_inputs']:,} inputs"
    print(f"re-partition: {r['partition_seconds']:.1f} s for {inputs} ({written} written)")
    print(f"re-plan in all: {r['replan_seconds']:.1f} s")
    print(
        f"peak memory (largest rank): training {r['training_peak_gib']:.2f} GiB, re-plan "
        f"{r['replan_peak_gib']:.2f} GiB: {r['replan_over_training']:.2f}x, "
        f"{r['replan_extra_gib']:+.2f} GiB (resident before training {r['resident_gib']:.2f} GiB)"
    )
    if r["traced_allocations"]:
        held = r["allocations"]
        parts = [f"{name} {_held(a)}" for name, a in held["phases"].items()]
        move = held["phases"]["move"]
        per_row = (move["tensor_bytes"] + move["python_bytes"]) / max(r["rows_moved"], 1)
        whole = _held(held["whole"])
        print(
            f"allocations held at their peak (traced; the trace slows the seconds above), tensors + numpy "
            f"and Python: {', '.join(parts)} ({per_row:.0f} bytes per moved row); the re-plan {whole}"
        )


def _held(allocations: dict) -> str:
    """An ``Allocations``' (as a dict) peaks: tensors + numpy and Python."""
    return f"{format_bytes(allocations['tensor_bytes'])} + {format_bytes(allocations['python_bytes'])}"


if __name__ == "__main__":
    with torchrec_quiet():
        main()
