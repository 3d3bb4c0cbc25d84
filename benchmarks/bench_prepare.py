"""The offline pass (``prepare_data``: profile, hot set, partition written to disk) on one rank and on
several, on the same inputs, in one run (issue 49).

The data: ``--num-samples`` inputs of the built-in synthetic Criteo at Kaggle's table sizes x ``--scale``,
written once (untimed) as npy days in TorchRec's layout (``BinaryCriteoUtils.tsv_to_npys``'s) and read
with ``CriteoNpyReader``, as a user's preprocessed Criteo is (``--source synthetic``: generated while it
is read instead). Each world size of ``--world-sizes`` runs ``prepare_data`` on gloo ranks (one process
a rank, one thread each), timed from a barrier to the partition open on every rank, FAE's 5% sample, a
holdout and every ``--val-every``-th input held out; ``--repeat`` runs of each world size, taken in turns.
Printed per world size: the seconds of its fastest run (of the slowest rank), seconds per million
inputs, the ratio to one rank, and whether the statistics and the partition's arrays are those one rank
made, byte for byte; then the estimate for Criteo Terabyte's 4.4 billion inputs on N ranks: one rank's
seconds per input over N, times the efficiency measured at the largest world size here (``--ranks``; an
estimate, assuming the storage keeps up and each rank has a core of its own).

    python benchmarks/bench_prepare.py                    # 4M inputs, Kaggle's tables, 1 and 2 ranks, 3 runs
    python benchmarks/bench_prepare.py --num-samples 200k --scale 0.01
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fae_torchrec.arguments import positive_int

#: Criteo Terabyte's inputs (24 days).
TERABYTE_INPUTS = 4_373_472_329
#: Inputs of each npy day written for the run.
DAY_INPUTS = 1 << 20
#: Rows of an array hashed at a time.
DIGEST_ROWS = 1 << 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=positive_int, default="4M", help="synthetic inputs")
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--source", choices=("npy", "synthetic"), default="npy")
    parser.add_argument("--world-sizes", type=positive_int, nargs="+", default=[1, 2], help="ranks per run")
    parser.add_argument("--budget", default="256MiB", help="hot rows' bytes")
    parser.add_argument("--val-every", type=positive_int, default=10, help="held-out inputs: one in N")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs of each world size, taken in turns; the fastest counts")  # fmt: skip
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[8, 64, 512],
                        help="ranks of the Terabyte estimate")  # fmt: skip
    parser.add_argument("--out", help="the runs' folder (default: a temporary one, removed after)")
    return parser.parse_args(argv)


def _source(args: argparse.Namespace, data: Path):
    from fae_torchrec.data import CriteoNpyReader, SyntheticCriteo

    synthetic = SyntheticCriteo(args.num_samples, scale=args.scale, seed=0)
    if args.source == "synthetic":
        return synthetic
    prefixes = sorted({str(path)[: -len("_labels.npy")] for path in data.glob("day_*_labels.npy")})
    return CriteoNpyReader(prefixes, table_sizes=synthetic.table_sizes)


def _write_days(args: argparse.Namespace, data: Path) -> None:
    """The synthetic inputs as npy days of ``DAY_INPUTS`` (dense as TorchRec stores it, before its log)."""
    from fae_torchrec.data import SyntheticCriteo
    from fae_torchrec.data.block import rebatch

    synthetic = SyntheticCriteo(args.num_samples, scale=args.scale, seed=0)
    for day, block in enumerate(rebatch(synthetic.raw_blocks(), DAY_INPUTS)):
        prefix = data / f"day_{day}"
        np.save(f"{prefix}_dense.npy", np.expm1(block.dense))
        np.save(f"{prefix}_sparse.npy", block.ids)
        np.save(f"{prefix}_labels.npy", block.labels[:, None])


def _rank(rank: int, world_size: int, args: argparse.Namespace, folder: Path) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from fae_torchrec import prepare_data
    from fae_torchrec.logs import torchrec_quiet
    from fae_torchrec.units import parse_bytes

    store = folder / f"store-{world_size}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        source = _source(args, folder / "data")
        tables = source.table_configs(16)
        directory = folder / f"partition-{world_size}"
        dist.barrier()
        started, busy = time.perf_counter(), _busy_seconds()
        with torchrec_quiet():
            prepared = prepare_data(
                source, tables, directory, sample=0.05, batch_size=2048, hot_budget=parse_bytes(args.budget),
                val_every=args.val_every, seed=0,
            )  # fmt: skip
        dist.barrier()
        seconds = time.perf_counter() - started
        cores = None if busy is None else (_busy_seconds() - busy) / seconds
        if rank == 0:
            result = {"seconds": seconds, "cores": cores, "digest": _digest(prepared),
                      "hot_share": len(prepared.partition.hot) / len(prepared.partition.is_hot)}  # fmt: skip
            (folder / f"result-{world_size}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _busy_seconds() -> float | None:
    """The CPU seconds the whole machine has spent busy (user and kernel, its own threads included, such
    as writeback), from ``/proc/stat`` (None where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:
        return None
    user, nice, system, _, _, irq, softirq, steal = (int(field) for field in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _digest(prepared) -> str:
    """One hash of the statistics (counts, holdout), the validation inputs and the partition's arrays
    (however many files hold them), read a block of rows at a time."""
    digest = hashlib.sha256()
    stats, partition = prepared.stats, prepared.partition
    arrays = [*stats.seen_rows, *stats.seen_counts, stats.holdout.rows, stats.holdout.owners,
              prepared.validation.ids, prepared.validation.dense, partition.is_hot]  # fmt: skip
    arrays += [getattr(part, field) for part in (partition.hot, partition.cold)
               for field in ("dense", "ids", "labels", "part_ids")]  # fmt: skip
    for array in arrays:
        for start in range(0, max(len(array), 1), DIGEST_ROWS):
            digest.update(np.ascontiguousarray(array[start : start + DIGEST_ROWS]).tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> dict[int, dict]:
    import torch.multiprocessing as mp

    args = parse_args(argv)
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_prepare-"))
    shutil.rmtree(folder / "data", ignore_errors=True)  # an earlier run's days would be read too
    (folder / "data").mkdir(parents=True)
    try:
        if args.source == "npy":
            _write_days(args, folder / "data")
        runs: dict[int, list[dict]] = {world_size: [] for world_size in args.world_sizes}
        for _ in range(args.repeat):  # in turns, so that the machine's drift is spread over both
            for world_size in args.world_sizes:
                os.sync()  # what an earlier write left dirty is not flushed in the next run's time
                mp.spawn(_rank, args=(world_size, args, folder), nprocs=world_size)
                runs[world_size].append(json.loads((folder / f"result-{world_size}.json").read_text()))
                shutil.rmtree(folder / f"partition-{world_size}")
        results = {}
        for world_size, done in runs.items():
            digests = {run["digest"] for run in done}
            results[world_size] = min(done, key=lambda run: run["seconds"]) | {
                "digest": digests.pop() if len(digests) == 1 else "runs differ",
                "all_seconds": [run["seconds"] for run in done],
            }
    finally:
        if not args.out:
            shutil.rmtree(folder, ignore_errors=True)
    _report(args, results)
    return results


def _report(args: argparse.Namespace, results: dict[int, dict]) -> None:
    first = min(results)
    base = results[first]
    print(
        f"offline pass (prepare_data): {args.num_samples:,} synthetic inputs ({args.source}), Kaggle's "
        f"tables x {args.scale}, budget {args.budget}, one input in {args.val_every} held out; "
        f"hot-input share {base['hot_share']:.1%}; measured here"
    )
    print(f"fastest of {args.repeat} runs each, taken in turns (all runs' seconds in brackets); cores: "
          "the machine's busy CPU seconds (kernel threads too) per second of the fastest run")  # fmt: skip
    print(f"{'ranks':>5} {'seconds':>9} {'s per 1M':>9} {'ratio':>7} {'cores':>6}  same as {first} rank(s)")
    for world_size, result in results.items():
        seconds = result["seconds"]
        same = "yes" if result["digest"] == base["digest"] else "NO"
        every = ", ".join(f"{run:.2f}" for run in result["all_seconds"])
        cores = "n/a" if result["cores"] is None else f"{result['cores']:.2f}"
        print(f"{world_size:>5} {seconds:>9.2f} {1e6 * seconds / args.num_samples:>9.3f} "
              f"{base['seconds'] / seconds:>6.2f}x {cores:>6}  {same}  [{every}]")  # fmt: skip
    largest = max(results)
    efficiency = base["seconds"] * first / (results[largest]["seconds"] * largest)
    per_input = base["seconds"] * first / args.num_samples
    estimates = ", ".join(
        f"{ranks} ranks {TERABYTE_INPUTS * per_input / (ranks * efficiency) / 60:.0f} min"
        for ranks in args.ranks
    )
    print(
        f"estimate for Criteo Terabyte ({TERABYTE_INPUTS:,} inputs; one rank's {1e6 * per_input:.2f} s per "
        f"1M inputs, efficiency {efficiency:.0%} as at {largest} ranks here): 1 rank "
        f"{TERABYTE_INPUTS * per_input / 60:.0f} min, {estimates}"
    )


if __name__ == "__main__":
    main()
