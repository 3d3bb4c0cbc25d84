"""Host-device embedding traffic and predicted step time: FAE against TorchRec's planners, at equal HBM.

For every point of the grid (embedding dim, GPUs, HBM per GPU) the same statistics plan the model four
ways, each a dry run of TorchRec's planner on a CUDA topology:

- FAE: ``FAEShardingPlanner`` (its knob picks the hot budget), hot rows in HBM, cold rows in
  ``fused_uvm_caching`` with sized caches;
- (a) TorchRec's default ``EmbeddingShardingPlanner``;
- (b) every table ``fused_uvm_caching`` with ``AccessCacheStatistics`` from the same statistics and
  ``EmbeddingOffloadScaleupProposer`` sizing the caches;
- (c) every table in HBM (the speed limit; predicted step only).

Traffic replays the id stream of the built-in synthetic data (Kaggle table sizes) through the plans'
UVM caches with ``cache_model`` (FBGEMM's set-associative LRU; see its docstring for what a miss and an
eviction cost); (d) is Belady's optimal cache holding as many rows as the device memory TorchRec's
reservation leaves for embeddings. FAE's stream is its cold steps: hot steps touch HBM only. The first
``--warmup`` of the stream fills the caches; traffic is counted on the rest and scaled to one epoch.
Predicted step times are TorchRec's perf model (ms); FAE's is ``share x hot step + (1 - share) x cold
step`` with its estimated hot-input share.

    python benchmarks/bench_traffic.py                 # the default grid, about 8 minutes on 2 cores
    python benchmarks/bench_traffic.py --num-samples 200000 --dims 16 --world-sizes 1 --caps 64MiB

Prints one table and the ratios against the issue's goals, and writes traffic.png, step_time.png and
hot_share.png to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec.distributed.planner.types import PlannerError, Topology
from torchrec.distributed.sharding_plan import get_default_sharders

from benchmarks.common.cache_model import BatchedKeys, belady_traffic, sampled_rows
from benchmarks.common.id_stream import IdStream, synthetic_stream
from benchmarks.common.plan_traffic import cache_groups, replay
from fae_torchrec import AccessStats, HotSet, format_bytes, hot_share_curve, parse_bytes
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.stats.hot_set import COLD
from planner import FAEShardingPlanner
from planner.baseline import default_planner, dry_run, hbm_planner, scaleup_planner

logger = logging.getLogger("bench_traffic")
#: HBM per GPU of "all in HBM" (c): enough for any model here.
UNLIMITED_HBM = 1 << 40
#: Bytes per input to GiB per million inputs.
PER_MILLION = 1e6 / (1 << 30)


@dataclass(frozen=True)
class Point:
    """Figures of one grid point; traffic in bytes per input (after the warm-up), steps in ms."""

    dim: int
    world_size: int
    hbm_cap: int
    hot_budget: int
    hot_share: float
    traffic: dict[str, float]
    step: dict[str, float]
    hot_step: float
    cold_step: float


def measure_point(
    stream: IdStream, dim: int, world_size: int, hbm_cap: int, args: argparse.Namespace
) -> Point:
    """Plan the four ways at one grid point and replay the stream through the plans' caches."""
    stats = stream.stats.with_embedding_dim(dim)
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap)
    batch = args.batch_size
    fae = FAEShardingPlanner(topology, stats, batch_size=batch, num_candidates=args.knob_candidates)
    hot_set = fae.choose_hot_set()
    meta = fae.meta_module(hot_set)
    fae_plan = fae.plan(meta, get_default_sharders())
    report = fae.report
    default = dry_run(default_planner(topology, batch), stats.tables)
    scaleup = dry_run(scaleup_planner(topology, stats, batch), stats.tables)
    unlimited = Topology(world_size=world_size, compute_device="cuda", hbm_cap=UNLIMITED_HBM)
    hbm = dry_run(hbm_planner(unlimited, stats.tables, batch), stats.tables)

    row_bytes = dim * 4
    global_batch = batch * world_size
    warm_inputs = int(args.warmup * stream.num_inputs)
    per_input = 1.0 / (stream.num_inputs - warm_inputs)
    table_index = {c.name: t for t, c in enumerate(stats.tables)}
    batches = stream.inputs // global_batch
    count_from = -(-warm_inputs // global_batch)

    def baseline_traffic(plan) -> float:
        moved = replay(
            cache_groups(plan),
            batches,
            stream.tables,
            stream.ids,
            table_index,
            stream.sampling,
            count_from,
            row_bytes,
        )
        return per_input * moved.bytes

    cold_inputs = ~stream.hot_inputs(hot_set)
    cold_position = np.cumsum(cold_inputs) - 1
    cold_lookup = cold_inputs[stream.inputs] & (stream.ranks >= stream.num_hot(hot_set))
    cold_ids = _cold_ids(hot_set, stream.tables[cold_lookup], stream.ids[cold_lookup])
    fae_groups = cache_groups(
        fae_plan, lambda name: name.removesuffix(f"_{COLD}") if name.endswith(f"_{COLD}") else None
    )
    fae_traffic = replay(
        fae_groups,
        cold_position[stream.inputs[cold_lookup]] // global_batch,
        stream.tables[cold_lookup],
        cold_ids,
        table_index,
        stream.sampling,
        -(-int(cold_inputs[:warm_inputs].sum()) // global_batch),
        row_bytes,
    )
    capacity = float(fae.device_memory(meta).sum()) / row_bytes
    traffic = {
        "FAE": per_input * fae_traffic.bytes,
        "a": baseline_traffic(default.plan),
        "b": baseline_traffic(scaleup.plan),
        "d": per_input * _belady(stream, global_batch, count_from, capacity, args.belady_sampling, row_bytes),
    }
    step = {"FAE": report.step, "a": default.totals.step, "b": scaleup.totals.step, "c": hbm.totals.step}
    return Point(
        dim,
        world_size,
        hbm_cap,
        report.hot_budget_bytes,
        report.hot_input_share,
        traffic,
        step,
        report.hot_step,
        report.cold_step,
    )


def _cold_ids(hot_set: HotSet, tables: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Ids of cold rows in their table's cold part."""
    cold = np.empty_like(ids)
    for t in np.unique(tables):
        mine = tables == t
        cold[mine] = hot_set.remap(int(t), ids[mine])[1]
    return cold


def _belady(
    stream: IdStream, global_batch: int, count_from: int, capacity: float, sampling: int, row_bytes: int
) -> float:
    """Bytes Belady's cache of ``capacity`` rows moves, replayed on ``1/sampling`` of the rows (a
    subset of the stream's own sample, since ``sampling`` is a multiple of the stream's)."""
    rows = stream.rows()
    keep = sampled_rows(rows, sampling)
    rows, batches = rows[keep], stream.inputs[keep] // global_batch
    distinct = BatchedKeys.of(batches, rows)
    per_batch = [distinct.keys[distinct.batch(b)] for b in range(len(distinct))]
    moved_in, moved_out = belady_traffic(per_batch, int(capacity / sampling), count_from)
    return float(moved_in + moved_out) * sampling * row_bytes


def grid(args: argparse.Namespace, stats: AccessStats) -> list[tuple[int, int, int]]:
    """Grid points whose HBM cap makes TorchRec's default plan use UVM (others need no offload)."""
    points = []
    for dim in args.dims:
        tables = stats.with_embedding_dim(dim).tables
        for world_size in args.world_sizes:
            for cap in args.caps:
                topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=cap)
                try:
                    kernels = dry_run(default_planner(topology, args.batch_size), tables).kernels
                except PlannerError:
                    logger.info(
                        "dim %d, %d GPUs x %s: TorchRec finds no plan", dim, world_size, format_bytes(cap)
                    )
                    continue
                if kernels["fused_uvm"] + kernels["fused_uvm_caching"]:
                    points.append((dim, world_size, cap))
                else:
                    logger.info(
                        "dim %d, %d GPUs x %s: the model fits in HBM", dim, world_size, format_bytes(cap)
                    )
    return points


def print_table(points: list[Point]) -> None:
    gib = PER_MILLION
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>8} {'hot budget':>10} {'share':>6} | "
        f"{'traffic GiB per 1M inputs: FAE':>30} {'a':>7} {'b':>7} {'d':>7} | {'a/FAE':>6} {'b/FAE':>6} "
        f"{'FAE/d':>6} | {'step ms: FAE':>12} {'a':>6} {'b':>6} {'c':>6} | {'a/FAE':>6} {'b/FAE':>6} "
        f"{'FAE/c':>6}"
    )
    for p in points:
        t, s = p.traffic, p.step
        print(
            f"{p.dim:>4} {p.world_size:>4} {format_bytes(p.hbm_cap):>8} {format_bytes(p.hot_budget):>10} "
            f"{p.hot_share:>6.1%} | {t['FAE'] * gib:>30.3f} {t['a'] * gib:>7.3f} {t['b'] * gib:>7.3f} "
            f"{t['d'] * gib:>7.3f} | {_ratio(t['a'], t['FAE']):>6} {_ratio(t['b'], t['FAE']):>6} "
            f"{_ratio(t['FAE'], t['d']):>6} | {s['FAE']:>12.3f} {s['a']:>6.3f} {s['b']:>6.3f} "
            f"{s['c']:>6.3f} | "
            f"{_ratio(s['a'], s['FAE']):>6} {_ratio(s['b'], s['FAE']):>6} {_ratio(s['FAE'], s['c']):>6}"
        )


def print_rows(points: list[Point]) -> None:
    """Traffic in rows: full rows (``4 x dim`` bytes) moved per input, both directions."""
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>8} | {'rows moved per input: FAE':>25} "
        f"{'a':>7} {'b':>7} {'d':>7}"
    )
    for p in points:
        rows = [p.traffic[k] / (4 * p.dim) for k in ("FAE", "a", "b", "d")]
        print(
            f"{p.dim:>4} {p.world_size:>4} {format_bytes(p.hbm_cap):>8} | {rows[0]:>25.3f} "
            + " ".join(f"{r:>7.3f}" for r in rows[1:])
        )


def _ratio(x: float, y: float) -> str:
    if y == 0:
        return "inf" if x > 0 else "-"
    return f"{x / y:.2f}"


def print_goals(points: list[Point]) -> None:
    """How many points meet each goal of the issue."""
    goals = {
        "traffic a/FAE >= 5": [p.traffic["a"] >= 5 * p.traffic["FAE"] for p in points],
        "step a/FAE >= 2": [p.step["a"] >= 2 * p.step["FAE"] for p in points],
        "traffic b > FAE": [p.traffic["b"] > p.traffic["FAE"] for p in points],
        "step b > FAE": [p.step["b"] > p.step["FAE"] for p in points],
        "traffic FAE <= 1.5 d": [p.traffic["FAE"] <= 1.5 * p.traffic["d"] for p in points],
    }
    for goal, met in goals.items():
        print(f"goal {goal}: met at {sum(met)} of {len(met)} points")


def plot(points: list[Point], stream: IdStream, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    panels = sorted({(p.dim, p.world_size) for p in points})
    for name, field, labels, unit in (
        ("traffic.png", "traffic", ("FAE", "a", "b", "d"), "GiB per 1M inputs"),
        ("step_time.png", "step", ("FAE", "a", "b", "c"), "predicted step (ms)"),
    ):
        fig, axes = plt.subplots(
            1, max(len(panels), 1), figsize=(4.5 * max(len(panels), 1), 3.8), squeeze=False
        )
        for ax, (dim, world) in zip(axes[0], panels, strict=False):
            mine = [p for p in points if (p.dim, p.world_size) == (dim, world)]
            caps = [p.hbm_cap / (1 << 30) for p in mine]
            for label in labels:
                scale = PER_MILLION if field == "traffic" else 1.0
                values = [getattr(p, field)[label] * scale or np.nan for p in mine]  # log axis: no zeros
                ax.plot(caps, values, marker="o", label=_LEGEND[label])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("HBM per GPU (GiB)")
            ax.set_ylabel(unit)
            ax.set_title(f"dim {dim}, {world} GPU{'s' if world > 1 else ''}")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    ranking = stream.stats.ranking()
    fig, ax = plt.subplots(figsize=(6, 4))
    budgets = np.geomspace(1 << 16, max(float(ranking.cumulative_bytes[-1]), 1 << 17), 40)
    curve = hot_share_curve(ranking, budgets.astype(np.int64))
    measured = [np.mean(stream.worst_rank < ranking.num_hot_rows(int(b))) for b in budgets]
    ax.plot(budgets / (1 << 20), curve.share, label="estimated from the holdout")
    ax.fill_between(budgets / (1 << 20), curve.low, curve.high, alpha=0.3)
    ax.plot(budgets / (1 << 20), measured, linestyle="--", label="measured on the whole stream")
    ax.set_xscale("log")
    ax.set_xlabel("hot-row budget (MiB, dim 16)")
    ax.set_ylabel("hot-input share")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "hot_share.png", dpi=110)
    plt.close(fig)


_LEGEND = {
    "FAE": "FAE",
    "a": "(a) TorchRec default",
    "b": "(b) scale-up caches",
    "c": "(c) all in HBM",
    "d": "(d) Belady",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=4_000_000, help="inputs in the id stream")
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--caps", type=parse_bytes, nargs="+", default=["256MiB", "512MiB", "1GiB", "2GiB", "4GiB", "8GiB"]
    )
    parser.add_argument("--batch-size", type=int, default=2048, help="per-GPU batch size")
    parser.add_argument("--sampling", type=int, default=16, help="replay 1/N of the rows (SHARDS)")
    parser.add_argument("--belady-sampling", type=int, default=64, help="Belady replays 1/N of the rows")
    parser.add_argument("--warmup", type=float, default=0.25, help="share of the stream that warms caches")
    parser.add_argument("--knob-candidates", type=int, default=4, help="hot budgets FAE's knob tries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures"))
    args = parser.parse_args(argv)
    args.caps = [parse_bytes(c) if isinstance(c, str) else c for c in args.caps]
    if args.belady_sampling % args.sampling:
        parser.error("--belady-sampling must be a multiple of --sampling")
    return args


def main(argv: list[str] | None = None) -> list[Point]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s", force=True)  # dry-run noise
    warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
    logger.setLevel(logging.INFO)
    started = time.perf_counter()
    data = SyntheticCriteo(args.num_samples, batch_size=1 << 16, scale=args.scale, seed=args.seed)
    stream = synthetic_stream(data, sampling=args.sampling, seed=args.seed)
    logger.info(
        "id stream: %d inputs, %d lookups kept (1/%d of rows)",
        stream.num_inputs,
        len(stream.ids),
        args.sampling,
    )
    points = []
    for dim, world_size, cap in grid(args, stream.stats):
        try:
            points.append(measure_point(stream, dim, world_size, cap, args))
        except PlannerError as error:
            logger.warning(
                "dim %d, %d GPUs x %s: FAE finds no plan: %s", dim, world_size, format_bytes(cap), error
            )
    print(
        f"{args.num_samples:,} synthetic inputs (Kaggle table sizes x {args.scale}), per-GPU batch "
        f"{args.batch_size}, traffic after a {args.warmup:.0%} warm-up, replayed on 1/{args.sampling} of the "
        f"rows (Belady 1/{args.belady_sampling})"
    )
    print_table(points)
    print_rows(points)
    print_goals(points)
    plot(points, stream, args.out)
    print(f"figures in {args.out}; {time.perf_counter() - started:.0f} s")
    return points


if __name__ == "__main__":
    main()
