"""Planning time: FAE's planner (knob and plan) against TorchRec's default planner, by number of GPUs.

One profile of synthetic data at Kaggle table sizes (FAE's 5% sample and a holdout), then for each
world size a dry run of both planners on the same CUDA topology, timed one after the other in this
process: FAE's ``choose_hot_set`` and ``plan`` of the chosen split, with how many runs of TorchRec's
planner it made and how long they took, and TorchRec's ``EmbeddingShardingPlanner`` on the unsplit
tables. Wall and CPU seconds; run it on an otherwise idle machine.

    python benchmarks/bench_planning.py                      # 8, 32 and 128 GPUs x 64 MiB: ~15 minutes
    python benchmarks/bench_planning.py --world-sizes 2 4 --scale 0.01 --num-samples 100k
    python benchmarks/bench_planning.py --processes 2        # the knob's budgets two at a time
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec.distributed.sharding_plan import get_default_sharders

from fae_torchrec import AccessProfiler
from fae_torchrec.arguments import positive_int
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.units import format_bytes, parse_bytes
from planner import FAEShardingPlanner
from planner.baseline import torchrec_default_plan
from planner.topology import make_topology


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``work()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--num-samples", type=positive_int, default="2M", help="synthetic inputs profiled (5%% sampled)"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--hbm-cap", type=parse_bytes, default="64MiB", help="HBM per GPU")
    parser.add_argument("--batch-size", type=int, default=2048, help="per-GPU batch size")
    parser.add_argument("--candidates", type=int, default=6, help="budgets FAE's knob tries")
    parser.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="budgets FAE's knob plans at once (worker processes)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, force=True)  # dry-run noise
    warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)

    data = SyntheticCriteo(args.num_samples, batch_size=1 << 16, scale=args.scale)
    stats = AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=100_000).profile(
        data, total=args.num_samples, progress=True
    )
    print(
        f"profile: {stats.num_sampled:,} of {stats.num_inputs:,} synthetic inputs (Kaggle table sizes x "
        f"{args.scale}, dim 16); HBM {format_bytes(args.hbm_cap)} per GPU, batch {args.batch_size} per GPU, "
        f"{args.candidates} budgets besides none for FAE's knob"
        + (
            f", {args.processes} at once in worker processes (CPU s: this process's only)"
            if args.processes > 1
            else ""
        )
    )
    print(
        f"{'GPUs':>5} | {'FAE wall s':>10} {'CPU s':>7} {'TorchRec runs':>13} {'in them s':>9} | "
        f"{'TorchRec default wall s':>23} {'CPU s':>7} | {'FAE/TorchRec wall':>17}"
    )
    for world_size in args.world_sizes:
        topology = make_topology(world_size, hbm_cap=args.hbm_cap)
        fae = FAEShardingPlanner(
            topology,
            stats,
            batch_size=args.batch_size,
            num_candidates=args.candidates,
            processes=args.processes,
        )
        fae_wall, fae_cpu = timed(
            lambda fae=fae: fae.plan(fae.meta_module(fae.choose_hot_set()), get_default_sharders())
        )
        base_wall, base_cpu = timed(
            lambda topology=topology: torchrec_default_plan(stats.tables, topology, args.batch_size)
        )
        runs = fae.torchrec_runs
        print(
            f"{world_size:>5} | {fae_wall:>10.1f} {fae_cpu:>7.1f} {len(runs):>13} {sum(runs):>9.1f} | "
            f"{base_wall:>23.1f} {base_cpu:>7.1f} | {fae_wall / base_wall:>16.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
