"""Calibrate bench_traffic's step models on CUDA GPUs with FBGEMM: the effective host-device bandwidth of
scattered rows by row size, the cache machinery's cost per cache and step, the cost per missed and
evicted row, and, with 2 or more GPUs, the collectives of table-wise, row-wise and data-parallel layouts.

For each embedding dimension (``--dims``; rows of dim x 4 bytes), one FBGEMM table-batched embedding
(TBE) holds the 26 tables of the built-in synthetic data at Kaggle sizes x ``--scale``, and training
steps (forward, and backward with FBGEMM's fused SGD) are timed one by one with CUDA events. Every
placement runs the same batches of the stream bench_traffic replays: ``--warmup-steps`` untimed
batches, then the same ``--steps`` fresh batches in every timed pass, ``--repeats`` times:

- every row in HBM (``EmbeddingLocation.DEVICE``): ``hbm``;
- every row in UVM without a cache (``MANAGED``): ``uvm``, whose rows move as FBGEMM's kernels move
  them (``cache_model.host_access``); the bandwidth at the row size is those bytes over ``uvm - hbm``;
- an LRU cache (``MANAGED_CACHING``) 4 times the distinct rows of the batches, invalidated, warmed with
  the warm-up batches, then run over the timed batches twice: ``cold`` (their misses fill empty ways,
  nothing is evicted) and ``hit`` (every lookup hits, which FBGEMM's cache as ``cache_model`` replays it
  confirms): ``hit - hbm`` is the machinery (linearize, unique, lookup, prefetch: once per cache and
  step), reported as measured with its spread over the repeats, and refused where the repeats disagree
  on its sign;
- an LRU cache of ``--miss-share`` of the timed batches' distinct rows, invalidated and warmed the same
  way: ``miss``, whose misses evict. The missed and evicted rows of each ``cold`` and ``miss`` step are
  counted by replaying its ids through ``cache_model``'s LRU, and the least-squares fit of the time above
  the same batch's ``hit`` step on them gives the cost per missed row and per evicted row.

With 2 or more GPUs (``torch.cuda.device_count()``) one process per GPU (NCCL) times the collectives of a
step of the 26 tables at ``--collective-dim``, for per-GPU batches of ``--collective-batch-sizes``:
table-wise's all-to-all of the pooled embeddings (forward) and of their gradients (backward), row-wise's
reduce-scatter of partial pooled sums (forward) and its all-gather (backward), and data parallel's
all-reduce of ``--all-reduce-mib`` gradients; each is fitted as latency + bytes / bandwidth over the
sizes (bytes: the pooled embeddings of the global batch, or the gradients). With one GPU they are
skipped.

Everything is written to ``--out`` (a ``calibration.Calibration``), which ``bench_traffic.py
--calibration FILE`` prices the steps with, at each point's row size, beside the stated assumptions. At
the defaults the dim-256 tables take 35 GB in HBM and as much of host memory (``--scale`` shrinks them).

    .venv/bin/python benchmarks/bench_calibrate.py            # on a CUDA machine, FBGEMM's CUDA build
    .venv/bin/python benchmarks/bench_traffic.py --points benchmarks/figures/traffic_points.json \\
        --calibration benchmarks/figures/calibration.json

Without CUDA it exits with status 2 and says so: nothing here can time a GPU step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.arguments import fail
from benchmarks.common.cache_model import WAYS, SetAssociativeLRU, cache_sets, host_access
from benchmarks.common.calibration import (
    ELEMENT_BYTES,
    Calibration,
    Collective,
    bandwidth_gbps,
    fit_collective,
    fit_miss_costs,
    machinery_us,
)
from fae_torchrec.arguments import fraction, non_negative_int, positive_float, positive_int
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.synthetic import CHUNK_SIZE

#: Slots of the all-hit cache per distinct row of the batches it sees: enough that no set of 32 ways
#: overflows (``calibrate`` refuses a replayed miss).
HIT_SLOTS_PER_ROW = 4
#: The collectives of a step, by layout: table-wise's all-to-all of the pooled embeddings (forward) and of
#: their gradients (backward), row-wise's reduce-scatter of partial pooled sums (forward) and its
#: all-gather (backward), and data parallel's all-reduce of the gradients.
COLLECTIVES = (
    "tw_all_to_all",
    "tw_all_to_all_backward",
    "rw_reduce_scatter",
    "rw_all_gather_backward",
    "dp_all_reduce",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dims", type=positive_int, nargs="+", default=[16, 32, 64, 128, 256], help="embedding dimensions"
    )
    parser.add_argument("--scale", type=positive_float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--batch-size", type=positive_int, default=2048, help="inputs per step (per GPU)")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per pass")
    parser.add_argument("--warmup-steps", type=positive_int, default=5, help="untimed steps first")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed passes per placement")
    parser.add_argument(
        "--miss-share",
        type=fraction,
        default=0.25,
        help="the missing cache's slots as a share of the timed batches' distinct rows",
    )
    parser.add_argument("--collective-dim", type=positive_int, default=128, help="pooled embeddings' dim")
    parser.add_argument(
        "--collective-batch-sizes", type=positive_int, nargs="+", default=[512, 2048, 8192], help="per GPU"
    )
    parser.add_argument("--all-reduce-mib", type=positive_int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures/calibration.json"))
    return parser.parse_args(argv)


def step_bytes(ids: np.ndarray, dim: int) -> float:
    """Bytes a step of a TBE without a cache moves in its busier direction, host to device: its rows as
    FBGEMM's kernels access them (``cache_model.host_access``). ``ids``: (inputs, tables) row ids."""
    tables = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    _, uses = np.unique(np.stack([tables.ravel(), ids.ravel()]), axis=1, return_counts=True)
    moved_in, _ = host_access(np.full(len(uses), float(dim * ELEMENT_BYTES)), uses)
    return float(moved_in.sum())


def batches(data: SyntheticCriteo, batch_size: int, count: int) -> list[np.ndarray]:
    """The first ``count`` batches of row ids (inputs, tables) of ``data``, the stream bench_traffic
    replays."""
    ids = np.concatenate([data.chunk(i).ids for i in range(-(-count * batch_size // CHUNK_SIZE))])
    return [ids[i * batch_size : (i + 1) * batch_size] for i in range(count)]


@dataclass(frozen=True)
class Pass:
    """One pass of a TBE over batches of the stream (their indices): timed or not, its cache invalidated
    first or not; ``kind`` names what its timings measure."""

    kind: str
    batches: tuple[int, ...]
    timed: bool
    reset: bool = False


def schedule(placement: str, warmup: int, steps: int, repeats: int) -> list[Pass]:
    """The passes of a placement ("hbm", "uvm", "hit" or "miss"): every timed pass goes over the same
    batches ``warmup .. warmup + steps - 1``; the untimed warm-up over the ones before runs once for
    "hbm" and "uvm", and for the caches after each invalidation, once per repeat. "hit"'s cache runs
    each repeat's timed batches twice: "cold" (they fill it), then "hit" (they all hit)."""
    warm = Pass("warm-up", tuple(range(warmup)), timed=False)
    timed = tuple(range(warmup, warmup + steps))
    if placement in ("hbm", "uvm"):
        return [warm, *(Pass(placement, timed, timed=True) for _ in range(repeats))]
    if placement == "hit":
        return [replace(warm, reset=True), Pass("cold", timed, True), Pass("hit", timed, True)] * repeats
    if placement == "miss":
        return [replace(warm, reset=True), Pass("miss", timed, True)] * repeats
    raise ValueError(f"unknown placement {placement!r}")


def linear_rows(stream: list[np.ndarray], rows: list[int]) -> list[np.ndarray]:
    """Each batch's distinct rows as indices into its TBE (table offset + id), as FBGEMM's cache hashes
    them."""
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    return [np.unique(batch.astype(np.int64) + offsets) for batch in stream]


def cache_size(slots: float, total_rows: int) -> tuple[int, float]:
    """The sets of an FBGEMM cache of ``slots`` rows (at most the TBE's ``total_rows``;
    ``cache_model.cache_sets``) and the load factor that makes FBGEMM allocate exactly them."""
    sets = cache_sets(min(slots, total_rows))
    return sets, sets * WAYS / total_rows


class _CountingLRU(SetAssociativeLRU):
    """FBGEMM's LRU cache as ``cache_model`` replays it, keeping the last batch's missed and evicted rows."""

    missed = evicted = 0

    def _insert(
        self, sets: np.ndarray, keys: np.ndarray, groups: np.ndarray, widths: np.ndarray, uses: np.ndarray
    ) -> np.ndarray:
        evicted = super()._insert(sets, keys, groups, widths, uses)
        self.missed, self.evicted = len(keys), int((evicted >= 0).sum())
        return evicted


def count_misses(linear: list[np.ndarray], num_sets: int, passes: list[Pass]) -> dict[str, np.ndarray]:
    """The missed and evicted rows of each timed step of ``passes`` through one LRU cache of ``num_sets``
    sets (emptied where a pass resets it), replayed with ``cache_model``: per timed kind, an array
    (2, repeats, steps) of misses and evictions. ``linear``: each batch's rows (``linear_rows``)."""
    counts: dict[str, list[list[tuple[int, int]]]] = {}
    cache = _CountingLRU([num_sets])
    for one in passes:
        if one.reset:
            cache = _CountingLRU([num_sets])
        steps = []
        for b in one.batches:
            keys = linear[b]
            cache.access(np.zeros(len(keys), dtype=np.int64), keys, keys)
            steps.append((cache.missed, cache.evicted))
        if one.timed:
            counts.setdefault(one.kind, []).append(steps)
    return {kind: np.moveaxis(np.array(runs), -1, 0) for kind, runs in counts.items()}


def calibrate(
    device: str,
    timings: dict[int, dict[str, np.ndarray]],
    moved: dict[int, np.ndarray],
    counts: dict[str, np.ndarray],
    world_size: int = 1,
    collectives: dict[str, Collective] | None = None,
) -> Calibration:
    """The calibration from each dimension's step times (ms, (repeats, steps) of the same batches per
    kind: ``hbm``, ``uvm``, ``cold``, ``hit``, ``miss``), the bytes each UVM step moved, and the caches'
    missed and evicted rows per step (``count_misses``). ``ValueError`` naming the dimension where a
    UVM step was not slower, where the all-hit cache missed, or where the repeats disagree on the sign of
    the machinery's cost."""
    if counts["hit"][0].any():
        raise ValueError(f"the all-hit cache missed {int(counts['hit'][0].sum())} rows in its hit passes")
    excess_counts = np.concatenate([counts["cold"], counts["miss"]], axis=2)
    sizes: dict[str, dict] = {"bandwidth_gbps": {}, "machinery_us": {}, "miss_us": {}, "evict_us": {}}
    for dim, times in timings.items():
        size = dim * ELEMENT_BYTES
        try:
            sizes["bandwidth_gbps"][size] = bandwidth_gbps(times["hbm"], times["uvm"], moved[dim])
            machinery = sizes["machinery_us"][size] = machinery_us(times["hbm"], times["hit"])
            if not machinery.sign_known:
                raise ValueError(
                    f"the cache machinery's repeats disagree on its sign ({machinery} us): rerun with more "
                    "--steps or --repeats"
                )
            excess = np.concatenate([times["cold"] - times["hit"], times["miss"] - times["hit"]], axis=1)
            sizes["miss_us"][size], sizes["evict_us"][size] = fit_miss_costs(excess, *excess_counts)
        except ValueError as error:
            raise ValueError(f"dim {dim}: {error}") from error
    return Calibration(device, **sizes, world_size=world_size, collectives=collectives or {})


@dataclass(frozen=True)
class CollectivePlan:
    """The collectives to time: the pooled embeddings of ``tables`` tables of ``dim`` for each per-rank
    batch size, the all-reduce of each of ``all_reduce_bytes``; ``calls`` timed calls per size after
    ``warmup``."""

    world_size: int
    tables: int
    dim: int
    batch_sizes: tuple[int, ...]
    all_reduce_bytes: tuple[int, ...]
    calls: int = 20
    warmup: int = 5

    def payloads(self, name: str) -> list[int]:
        """Each size's payload (bytes): the pooled embeddings of the global batch, or the gradients."""
        if name == "dp_all_reduce":
            return list(self.all_reduce_bytes)
        return [b * self.world_size * self.tables * self.dim * ELEMENT_BYTES for b in self.batch_sizes]

    def tables_of(self) -> list[int]:
        """The tables of each rank under table-wise sharding, as even as they go."""
        share, more = divmod(self.tables, self.world_size)
        return [share + (rank < more) for rank in range(self.world_size)]


def _collective(
    name: str, plan: CollectivePlan, rank: int, size: int, device: torch.device
) -> tuple[Callable[[], object], torch.Tensor, torch.Tensor]:
    """One collective of ``plan`` at its ``size``-th size on this rank: the call, its output, and the
    output it must give the first time (the all-reduce's input is zeroed after that)."""
    world = plan.world_size
    if name == "dp_all_reduce":
        gradients = torch.ones(plan.all_reduce_bytes[size] // ELEMENT_BYTES, device=device)
        return lambda: dist.all_reduce(gradients), gradients, torch.full_like(gradients, world)
    batch, row = plan.batch_sizes[size], plan.dim
    chunks = [batch * t * row for t in plan.tables_of()]  # each rank's tables of one rank's inputs
    ranks = torch.arange(world, dtype=torch.float32, device=device)
    if name == "tw_all_to_all":  # this rank's tables of the global batch -> every table of its own inputs
        sent, received = (
            torch.full((world * chunks[rank],), float(rank), device=device),
            torch.empty(sum(chunks), device=device),
        )
        expected = torch.repeat_interleave(ranks, torch.tensor(chunks, device=device))
        return (
            lambda: dist.all_to_all_single(received, sent, chunks, [chunks[rank]] * world),
            received,
            expected,
        )
    if name == "tw_all_to_all_backward":
        sent, received = (
            torch.full((sum(chunks),), float(rank), device=device),
            torch.empty(world * chunks[rank], device=device),
        )
        expected = torch.repeat_interleave(ranks, chunks[rank])
        return (
            lambda: dist.all_to_all_single(received, sent, [chunks[rank]] * world, chunks),
            received,
            expected,
        )
    local = batch * plan.tables * row  # every table of one rank's inputs
    if name == "rw_reduce_scatter":  # partial sums of the global batch -> the sums of its own inputs
        sent, received = torch.ones(world * local, device=device), torch.empty(local, device=device)
        return lambda: dist.reduce_scatter_single(received, sent), received, torch.full_like(received, world)
    if name == "rw_all_gather_backward":
        sent, received = (
            torch.full((local,), float(rank), device=device),
            torch.empty(world * local, device=device),
        )
        return lambda: dist.all_gather_single(received, sent), received, torch.repeat_interleave(ranks, local)
    raise ValueError(f"unknown collective {name!r}")


def _time_calls(call: Callable[[], object], calls: int, device: torch.device) -> torch.Tensor:
    """Each call's time (us): CUDA events on a GPU, the wall clock elsewhere."""
    if device.type != "cuda":
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e6)
        return torch.tensor(times, dtype=torch.float64)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)
    ]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize(device)
    return torch.tensor([start.elapsed_time(end) * 1e3 for start, end in events], dtype=torch.float64)


def time_collectives(rank: int, plan: CollectivePlan, device: torch.device) -> dict[str, list[float]]:
    """In a process group of ``plan.world_size`` ranks: per collective, the median over calls of the
    slowest rank's time (us) at each size, after checking each call's output once."""
    medians: dict[str, list[float]] = {}
    for name in COLLECTIVES:
        medians[name] = []
        for size in range(len(plan.payloads(name))):
            call, output, expected = _collective(name, plan, rank, size, device)
            call()
            if not torch.equal(output, expected):
                raise RuntimeError(f"{name} on rank {rank} gave a wrong output at size {size}")
            output.zero_()
            for _ in range(plan.warmup):
                call()
            dist.barrier()
            times = _time_calls(call, plan.calls, device).to(device)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            medians[name].append(float(times.median()))
    return medians


def _collectives_rank(rank: int, plan: CollectivePlan, store: str, out: str) -> None:
    """One GPU's process: join the NCCL group, time the collectives, rank 0 writes them to ``out``."""
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=rank, world_size=plan.world_size, device_id=device
    )
    try:
        medians = time_collectives(rank, plan, device)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(medians))


def fit_collectives(plan: CollectivePlan, medians: dict[str, list[float]]) -> dict[str, Collective]:
    """Each collective's latency and bandwidth over its sizes; ``ValueError`` naming the collective."""
    fitted = {}
    for name in COLLECTIVES:
        try:
            fitted[name] = fit_collective(plan.payloads(name), medians[name])
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from error
    return fitted


def measure_collectives(plan: CollectivePlan) -> dict[str, list[float]]:
    """Time ``plan`` on ``plan.world_size`` GPUs, one process each (NCCL)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "collectives.json"
        mp.spawn(
            _collectives_rank, args=(plan, str(Path(folder) / "store"), str(out)), nprocs=plan.world_size
        )
        return json.loads(out.read_text())


def _tbe(rows: list[int], dim: int, location: int, load_factor: float) -> torch.nn.Module:
    """FBGEMM's training TBE over tables of ``rows``, all at ``location``, with fused SGD."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return SplitTableBatchedEmbeddingBagsCodegen(
        [(n, dim, location, ComputeDevice.CUDA) for n in rows],
        cache_algorithm=CacheAlgorithm.LRU,
        cache_load_factor=load_factor,
        learning_rate=0.01,
        device=torch.device("cuda"),
    )


def _run_passes(
    tbe: torch.nn.Module, stream: list[torch.Tensor], passes: list[Pass]
) -> dict[str, np.ndarray]:
    """Run ``passes`` of training steps (each batch's lookups in table-major order, one per input and
    table); per timed kind, each step's ms as (repeats, steps)."""
    offsets = torch.arange(len(stream[0]) + 1, dtype=torch.int64, device="cuda")
    events: dict[str, list[list[tuple[torch.cuda.Event, torch.cuda.Event]]]] = {}
    for one in passes:
        if one.reset:
            tbe.reset_cache_states()
        steps = []
        for b in one.batches:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            tbe(stream[b], offsets).sum().backward()
            end.record()
            steps.append((start, end))
        if one.timed:
            events.setdefault(one.kind, []).append(steps)
    torch.cuda.synchronize()
    return {
        kind: np.array([[s.elapsed_time(e) for s, e in run] for run in runs]) for kind, runs in events.items()
    }


def prepare(args: argparse.Namespace) -> tuple[list, list[int], dict, dict[str, list[Pass]], dict]:
    """What a run needs before its first CUDA call, and prints: the stream's batches, the tables' rows,
    the caches' sets and load factors, each placement's passes, and the caches' misses and evictions per
    timed step as ``cache_model`` replays them."""
    count = args.warmup_steps + args.steps
    data = SyntheticCriteo(count * args.batch_size, scale=args.scale, seed=args.seed)
    rows = [config.num_embeddings for config in data.table_configs()]
    stream = batches(data, args.batch_size, count)
    linear = linear_rows(stream, rows)
    seen = len(np.unique(np.concatenate(linear)))
    timed_rows = len(np.unique(np.concatenate(linear[args.warmup_steps :])))
    caches = {
        "hit": cache_size(HIT_SLOTS_PER_ROW * seen, sum(rows)),
        "miss": cache_size(args.miss_share * timed_rows, sum(rows)),
    }
    passes = {
        p: schedule(p, args.warmup_steps, args.steps, args.repeats) for p in ("hbm", "uvm", "hit", "miss")
    }
    counts = {}
    for placement, (sets, _) in caches.items():
        counts |= count_misses(linear, sets, passes[placement])
    print(
        f"{count} batches of {args.batch_size} inputs, {args.steps} timed in every pass after "
        f"{args.warmup_steps}: {timed_rows:,} distinct rows timed, {seen:,} with the warm-up; caches of "
        + ", ".join(f"{sets * WAYS:,} rows ({name})" for name, (sets, _) in caches.items())
        + "; misses per step replayed: "
        + ", ".join(f"{kind} {c[0].mean():,.0f} (evicting {c[1].mean():,.0f})" for kind, c in counts.items())
    )
    return stream, rows, caches, passes, counts


def main(argv: list[str] | None = None) -> Calibration:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        fail("bench_calibrate.py times FBGEMM's kernels on a CUDA GPU, and none is visible here")
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    started = time.perf_counter()
    stream, rows, caches, passes, counts = prepare(args)
    prepared = [torch.from_numpy(np.ascontiguousarray(b.T).ravel()).to("cuda") for b in stream]
    locations = {
        "hbm": (EmbeddingLocation.DEVICE, 0.2),
        "uvm": (EmbeddingLocation.MANAGED, 0.2),
        **{name: (EmbeddingLocation.MANAGED_CACHING, factor) for name, (_, factor) in caches.items()},
    }
    timings, moved = {}, {}
    for dim in args.dims:
        times = {}
        for placement, (location, load_factor) in locations.items():
            tbe = _tbe(rows, dim, location, load_factor)
            times |= _run_passes(tbe, prepared, passes[placement])
            del tbe
            torch.cuda.empty_cache()
        timings[dim] = times
        moved[dim] = np.array([step_bytes(b, dim) for b in stream[args.warmup_steps :]])
        print(
            f"dim {dim}: mean step ms (median over {args.repeats} repeats) "
            + ", ".join(f"{kind} {np.median(t.mean(axis=1)):.3f}" for kind, t in times.items())
            + f"; a UVM step moves {moved[dim].mean() / 2**20:.1f} MiB host to device"
        )
    world_size, collectives = torch.cuda.device_count(), {}
    if world_size >= 2:
        plan = CollectivePlan(
            world_size, len(rows), args.collective_dim, tuple(args.collective_batch_sizes),
            tuple(mib << 20 for mib in args.all_reduce_mib),
        )  # fmt: skip
        medians = measure_collectives(plan)
        for name in COLLECTIVES:
            sizes = zip(plan.payloads(name), medians[name], strict=True)
            print(
                f"{name} at {world_size} GPUs: "
                + ", ".join(f"{b / 2**20:.1f} MiB {us:.0f} us" for b, us in sizes)
            )
    else:
        print(f"{world_size} GPU visible: collectives not measured (they need 2 or more)")
    try:
        if world_size >= 2:
            collectives = fit_collectives(plan, medians)
        calibration = calibrate(torch.cuda.get_device_name(), timings, moved, counts, world_size, collectives)
    except ValueError as error:
        fail(str(error))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calibration.save(args.out)
    print(calibration.describe())
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return calibration


if __name__ == "__main__":
    main()
