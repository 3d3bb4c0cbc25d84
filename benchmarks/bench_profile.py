"""Profiling and hot/cold classification throughput of FAE next to a naive full count, in one run.

Each of ``--processes`` worker processes generates its share of the built-in synthetic data (Kaggle
table sizes by default; ``generate`` times making it chunk by chunk, as a stream) and then, in step
with the others, times three passes over it:

* ``fae profile``: :class:`AccessProfiler` at ``--sample`` (FAE's 5% sample, holdout included);
* ``naive full count``: the same profiler counting every input, i.e. profiling the whole data set;
* ``classify``: :meth:`HotSet.is_hot_input` on every input, with the hot set for ``--budget``;
* ``partition``: :meth:`HotColdPartition.of` on every input (in memory, so that the figure is the
  work, not the disk): classification, the offline remap of every id to its part id
  (``HotSet.signed_part_ids``, which training then splits by sign) and the copy into the two parts.

Throughputs are ids (or inputs) of the whole data over the slowest worker's wall time, with the
seconds per million inputs, and the last lines extrapolate linearly to Criteo Kaggle (45,840,617
inputs x 26 ids).

    python benchmarks/bench_profile.py                  # 2 processes, 4M inputs
    python benchmarks/bench_profile.py --processes 1 --num-samples 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time

from fae_torchrec.data.criteo import KAGGLE_INPUTS
from fae_torchrec.data.synthetic import CHUNK_SIZE


def _worker(args: argparse.Namespace, rank: int, barrier, results) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from fae_torchrec import AccessProfiler, HotColdPartition
    from fae_torchrec.data import SyntheticCriteo
    from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
    from fae_torchrec.stats import FeatureIds
    from fae_torchrec.units import parse_bytes

    data = SyntheticCriteo(args.num_samples, scale=args.scale, seed=args.seed)
    chunks = range(rank, data.num_chunks, args.processes)
    tables = data.table_configs(args.dim)
    timings: dict[str, float] = {}

    def timed(name, work):
        """Best of ``--repeat`` runs, all workers in step (the first run pays for fresh memory)."""
        best = float("inf")
        for _ in range(args.repeat):
            barrier.wait()
            start = time.perf_counter()
            value = work()
            best = min(best, time.perf_counter() - start)
        timings[name] = best
        return value

    timed("generate", lambda: sum(len(data.chunk(i)) for i in chunks))
    blocks = [data.chunk(i) for i in chunks]
    batches = [block.to_batch(DEFAULT_CAT_NAMES) for block in blocks]
    for batch in batches:  # KJTs compute and cache their lengths on first use: keep it untimed
        FeatureIds.of(batch)

    def profile(fraction, holdout):
        profiler = AccessProfiler(tables, fraction, seed=rank, holdout_size=holdout)
        for batch in batches:
            profiler.update(batch)
        return profiler.stats()

    holdout = args.holdout // args.processes
    stats = timed("fae profile", lambda: profile(args.sample, holdout))
    timed("naive full count", lambda: profile(1.0, 0))
    hot_set = stats.hot_set(parse_bytes(args.budget))
    hot_set.hot_mask(0)  # build the lookup tables outside the timed pass
    hot = timed("classify", lambda: sum(int(hot_set.is_hot_input(b).sum()) for b in batches))
    timed("partition", lambda: HotColdPartition.of(blocks, hot_set, DEFAULT_CAT_NAMES))
    results.put((rank, sum(b.labels.numel() for b in batches), hot, timings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=4_000_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--sample", type=float, default=0.05)
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--holdout", type=int, default=100_000, help="holdout inputs in all")
    parser.add_argument("--repeat", type=int, default=2, help="runs per pass; the best counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if -(-args.num_samples // CHUNK_SIZE) < args.processes:
        parser.error(f"--num-samples {args.num_samples}: fewer chunks of {CHUNK_SIZE} than --processes")

    context = mp.get_context("spawn")
    barrier, results = context.Barrier(args.processes), context.Queue()
    workers = [
        context.Process(target=_worker, args=(args, rank, barrier, results)) for rank in range(args.processes)
    ]
    for worker in workers:
        worker.start()
    reports = []
    while len(reports) < len(workers):
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode]
            if failed:  # the others wait at a barrier for it: stop them
                for worker in workers:
                    worker.terminate()
                raise SystemExit(f"a worker failed with exit code {failed[0]}") from None
    for worker in workers:
        worker.join()
    inputs = sum(r[1] for r in reports)
    hot = sum(r[2] for r in reports)
    wall = {name: max(r[3][name] for r in reports) for name in reports[0][3]}
    ids = 26 * inputs

    print(
        f"data: {inputs:,} synthetic inputs x 26 ids, scale {args.scale}, dim {args.dim}; "
        f"{args.processes} process(es), budget {args.budget}, sample {args.sample:.0%}"
    )
    print(f"{'pass':<18}{'seconds':>10}{'ids/s':>16}{'inputs/s':>16}{'s per 1M inputs':>18}")
    for name, seconds in wall.items():
        print(
            f"{name:<18}{seconds:>10.2f}{ids / seconds:>16,.0f}{inputs / seconds:>16,.0f}"
            f"{1e6 * seconds / inputs:>18.3f}"
        )
    print(f"generator: {inputs / wall['generate'] / args.processes:,.0f} samples/s per process")
    print(f"hot-input share at {args.budget}: {hot / inputs:.2%}")
    speedup = wall["naive full count"] / wall["fae profile"]
    print(f"ratio naive full count / fae profile: {speedup:.2f}x")
    scale = KAGGLE_INPUTS / inputs
    fae = (wall["fae profile"] + wall["classify"]) * scale
    naive = (wall["naive full count"] + wall["classify"]) * scale
    print(
        f"extrapolated to Criteo Kaggle ({KAGGLE_INPUTS:,} inputs) on {args.processes} "
        f"process(es): FAE profile + classify {fae:.1f} s (target <= 30 s), "
        f"naive full count + classify {naive:.1f} s; partition with the offline remap "
        f"{wall['partition'] * scale:.1f} s"
    )


if __name__ == "__main__":
    main()
