"""Bytes a planned cold tier moves (issue 48): slots planned from the schedule, against caches.

At each point (embedding dim, GPUs, HBM per GPU) of ``bench_traffic``'s grid, on its id stream (DLRM's
Criteo-like inputs, FAE's profile read on other inputs) and its plans (``bench_traffic.measure_point``:
FAE's LRU cold caches, TorchRec's configurations and Belady's cache (d) of the device memory TorchRec
leaves for embeddings), the slot plan (``fae_torchrec.train.slot_plan``) of:

- "planned": FAE's hot set (the knob's, cold caches planned for the prefetch pipeline, "FAE pp") in
  HBM and the rest of (d)'s rows as slots for the cold rows of FAE's cold steps (hot steps move
  nothing), one pool of slots for every cold table and rank;
- "planned, no hot": every row of (d) a slot, over every step: the plan that (d) bounds from below
  (a step's rows all sit in slots, where (d)'s cache holds a step's misses on top of its rows);
- "tier" and "tier, no hot": the same with the pools the tier has (``--cold-tier planned``), one per
  cold table, at least a step's rows and grown within ``FAEShardingPlanner.cold_slot_budget`` where the
  plans copy fewest rows per byte (``allocate_slots``); a tier whose floors alone exceed (d)'s memory is
  named, not planned.

Each over the whole stream (the epoch FAE's router orders) and with a look-ahead of ``--windows``
steps. Slots start empty at the stream's start and warm over ``--warmup`` inputs, as the caches do;
bytes (weights, both directions, as the caches' are counted; the planned tier also moves optimizer
state) are the plan's own copies in and write-backs over the counted inputs, per input, scaled back
from the row sample. Also the plan's time and the memory of its arrays per 1M inputs of the stream
(measured on the row sample, where it plans ``1/--sampling`` of the ids and slots).

    python benchmarks/bench_slot_plan.py --num-samples 4M --warmup 2M    # both points: about 4.5 minutes
    python benchmarks/bench_slot_plan.py --num-samples 16M --warmup 4M --points 128:1:2GiB  # under 11 minutes
    python benchmarks/bench_slot_plan.py --num-samples 16M --warmup 4M --windows 1024 4096 --compare belady
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec.distributed.planner.types import PlannerError

from benchmarks.bench_traffic import (
    BANDWIDTH_SHARES,
    FAE_PLANS,
    LEAST,
    PER_MILLION,
    FixedPlans,
    add_dense_options,
    belady_rows,
    dense_ms,
    grid_point,
    measure_point,
    steps_of,
    traffic_of,
)
from benchmarks.common.arguments import fail
from benchmarks.common.calibration import ELEMENT_BYTES
from benchmarks.common.id_stream import IdStream, synthetic_stream
from benchmarks.common.step_models import PCIE, Point, Terms, best_plan, tier_step, transfer_bound
from fae_torchrec.arguments import non_negative_int, positive_int
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import KAGGLE_INPUTS
from fae_torchrec.train.slot_plan import allocate_slots, min_slots, plan_slots
from fae_torchrec.units import format_bytes
from planner import FAEShardingPlanner
from planner.topology import make_topology

#: FAE's plan whose hot set the planned tier keeps in HBM.
FAE_PLAN = "FAE pp"
#: The tier's host work per cold step (ms) beyond the caching tier's routing (its remap, and what its
#: epochs' plans cost the step when made ahead), measured on CPU by ``bench_interleaved.py --modes planned
#: fae`` at 2 ranks, batch 2048 per rank (BENCHMARKS section 9: 0.85 at 60f6a53, 0.71 to 0.83 since;
#: the larger kept).
HOST_MS = 0.85


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--num-samples", type=positive_int, default="2M", help="inputs counted after the warm-up"
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default="1M", help="inputs that warm slots and caches"
    )
    parser.add_argument(
        "--epoch",
        type=positive_int,
        default=KAGGLE_INPUTS,
        help="inputs of an epoch; the profile samples 5%%",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument(
        "--points",
        type=grid_point,
        nargs="+",
        default=["128:1:2GiB", "128:8:512MiB"],
        help="dim:GPUs:HBM per GPU of each point",
    )
    parser.add_argument(
        "--windows", type=positive_int, nargs="*", default=[16, 64, 256], help="look-aheads (steps)"
    )
    parser.add_argument(
        "--aheads",
        type=non_negative_int,
        nargs="+",
        default=[0, 1],
        help="the tier rows' copies run this many cold steps early (a row each; --copy-ahead)",
    )
    parser.add_argument(
        "--host-ms",
        type=float,
        default=HOST_MS,
        help="the tier's host work per cold step (its plans and remap) that the step model adds",
    )
    add_dense_options(parser)
    parser.add_argument("--batch-size", type=positive_int, default=2048, help="per-GPU batch size")
    parser.add_argument("--sampling", type=positive_int, default=16, help="replay 1/N of the rows (SHARDS)")
    parser.add_argument(
        "--knob-candidates", type=positive_int, default=4, help="hot budgets FAE's knob tries"
    )
    parser.add_argument(
        "--compare",
        choices=("all", "belady"),
        default="all",
        help="all: every plan of bench_traffic (FAE's caches, TorchRec's configurations, d); belady: d alone",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.points = [grid_point(p) if isinstance(p, str) else p for p in args.points]
    args.belady_sampling = args.sampling
    return args


#: A pool of slots: its lookups' steps and row keys, and its slots (in the row sample).
Pool = tuple[np.ndarray, np.ndarray, int]


def planned_rows(
    stream: IdStream, dim: int, world_size: int, hbm_cap: int, args: argparse.Namespace
) -> tuple[dict[tuple[str, int], tuple[list[Pool], int]], int, int]:
    """Per planned tier and the cold steps its copies run early: its pools of slots and the step the
    counting starts at; and the rows of device memory (d's) and FAE's hot budget (bytes)."""
    topology = make_topology(world_size, hbm_cap=hbm_cap)
    fae = FAEShardingPlanner(
        topology,
        stream.stats.with_embedding_dim(dim),
        batch_size=args.batch_size,
        num_candidates=args.knob_candidates,
        cache_params=FAE_PLANS[FAE_PLAN],
    )
    hot_set = fae.choose_hot_set()
    capacity = int(fae.device_memory(fae.meta_module(hot_set)).sum()) // (dim * ELEMENT_BYTES)
    no_hot = FAEShardingPlanner(
        topology, stream.stats.with_embedding_dim(dim), batch_size=args.batch_size, hot_budget_bytes=0
    )
    global_batch = args.batch_size * world_size
    rows = stream.rows()
    cold_inputs = ~stream.hot_inputs(hot_set)
    cold_before = np.r_[0, np.cumsum(cold_inputs)]
    cold = cold_inputs[stream.inputs] & (stream.ranks >= stream.num_hot(hot_set))
    cold_steps = cold_before[stream.inputs[cold]] // global_batch
    every_step = stream.inputs // global_batch
    counted = {
        "cold": steps_of(int(cold_before[args.warmup]), global_batch),
        "every": steps_of(args.warmup, global_batch),
    }
    everything = np.ones(len(rows), dtype=bool)
    tiers = {
        ("planned", 0): (
            [(cold_steps, rows[cold], (capacity - hot_set.total_hot) // args.sampling)],
            counted["cold"],
        ),
        ("planned, no hot", 0): ([(every_step, rows, capacity // args.sampling)], counted["every"]),
    }
    budgets = {
        "tier": fae.cold_slot_budget(hot_set) / args.sampling,
        "tier, no hot": no_hot.cold_slot_budget(no_hot.choose_hot_set()) / args.sampling,
    }
    for ahead in args.aheads:
        tiers["tier", ahead] = (
            table_pools(stream, cold, cold_steps, budgets["tier"], dim, ahead),
            counted["cold"],
        )
        tiers["tier, no hot", ahead] = (
            table_pools(stream, everything, every_step, budgets["tier, no hot"], dim, ahead),
            counted["every"],
        )
    return tiers, capacity, fae.report.hot_budget_bytes


def table_pools(
    stream: IdStream, mask: np.ndarray, steps: np.ndarray, budget: float, dim: int, ahead: int
) -> list[Pool]:
    """The planned cold tier's pools of the lookups ``mask`` selects (``steps``: theirs), its copies
    ``ahead`` steps early: one per table, as a table-wise slot table is, at least the rows of ``ahead +
    1`` steps in a row (``min_slots``), grown within ``budget`` bytes (of the row sample) where the plans
    copy fewest rows per byte (``allocate_slots``), as the recipe sizes them."""
    tables, rows = stream.tables[mask], stream.rows()[mask]
    order = np.lexsort((steps, tables))
    table, step, row = tables[order], steps[order], rows[order]
    bounds = np.arange(int(steps.max(initial=-1)) + 2)
    pools = {}
    for t in np.unique(table).tolist():
        mine = table == t  # in step order
        pools[t] = (row[mine], np.searchsorted(step[mine], bounds))
    floor = {t: min_slots(*pool, ahead) for t, pool in pools.items()}
    row_bytes = dict.fromkeys(pools, float(dim * ELEMENT_BYTES))
    slots = allocate_slots(pools, row_bytes, budget, floor, ahead=ahead).slots
    return [(steps[tables == t], rows[tables == t], slots[t]) for t in pools]


def compared(
    stream: IdStream, key: tuple[int, int, int], fixed: FixedPlans, capacity: int, args: argparse.Namespace
) -> tuple[dict[str, float], str, Point | None]:
    """Bytes per input of (d), FAE's cold caches and TorchRec's least (all of ``bench_traffic``'s plans
    with ``--compare all``; (d) alone with ``belady``), the name of TorchRec's least, and the point's
    figures (``--compare all``)."""
    if args.compare == "belady":
        global_batch = args.batch_size * key[1]
        ends = [steps_of(n, global_batch) for n in (args.warmup, args.warmup + args.num_samples)]
        moved = belady_rows(stream, global_batch, ends[1], capacity, args.sampling)[ends[0] : ends[1]]
        return {"d": float(moved.sum()) * key[0] * ELEMENT_BYTES / args.num_samples}, "-", None
    point = measure_point(stream, *key, fixed, args, [args.num_samples])[args.num_samples]
    return traffic_of(point), min(point.torchrec, key=point.traffic.__getitem__), point


def measure(
    stream: IdStream, key: tuple[int, int, int], fixed: FixedPlans, args: argparse.Namespace
) -> list[str]:
    """The table's rows of one point: each planned tier, whole and windowed; with the point's figures
    (``--compare all``), the tiers' steps by the step model."""
    dim, world_size, hbm_cap = key
    tiers, capacity, hot_budget = planned_rows(stream, dim, world_size, hbm_cap, args)
    traffic, least, point = compared(stream, key, fixed, capacity, args)
    where = f"{dim:>4} {world_size:>4} {format_bytes(hbm_cap):>9} {format_bytes(hot_budget):>9}"
    lines, links = [], {}
    scale = dim * ELEMENT_BYTES * args.sampling / args.num_samples
    for (name, ahead), (pools, count_from) in tiers.items():
        num_steps = max(int(steps.max(initial=-1)) for steps, _, _ in pools) + 1
        slots = sum(pool[2] for pool in pools)
        if slots > capacity // args.sampling:  # a step's rows per table, more than the memory holds
            lines.append(
                f"{where} | {name}: {slots * args.sampling:,} slots, more than d's {capacity:,} rows"
            )
            continue
        whole = None
        for window in (None, *args.windows):
            try:
                replay = _replayed(pools, num_steps, count_from, window, ahead)
            except ValueError as error:
                lines.append(f"{where} | {name}: {error}")
                break
            moved = float(replay.loads.sum() - replay.first.sum() + replay.evictions.sum()) * scale
            start = float(replay.first.sum()) * scale
            whole = moved if window is None else whole
            if window is None:
                links[name, ahead] = _busiest(replay.loads, replay.evictions, world_size) * scale
            millions = stream.num_inputs / 1e6
            lines.append(
                f"{where} | {name:<15} {ahead:>1} {'epoch' if window is None else window:>5} "
                f"{slots * args.sampling:>11,} | {moved * PER_MILLION:>7.3f} {start * PER_MILLION:>6.3f} "
                f"{_cell(traffic, 'd')} {_cell(traffic, FAE_PLAN)} {_cell(traffic, LEAST)} | "
                f"{_ratio(moved, traffic['d']):>5} {_ratio(moved, traffic.get(LEAST)):>5} "
                f"{_ratio(moved, whole):>6} | {replay.seconds / millions:>6.2f} "
                f"{replay.nbytes / millions / (1 << 20):>6.1f}{'' if window else f'  {least}'}"
            )
    if point is None:
        return lines
    return lines + step_lines(point, links, where, args.host_ms, dense_ms("dlrm", args, [point])[dim])


def step_lines(
    point: Point, links: dict[tuple[str, int], float], where: str, host_ms: float, dense: float
) -> list[str]:
    """Per tier (``links``: its busiest link's bytes per input, by name and cold steps ahead), PCIe
    generation, part of the step (the sparse part; the whole step, ``dense`` ms added to every plan's)
    and host work per cold step (``host_ms``, then none; ``ceil``: none, and no copies either, the most
    any slot plan of the tier's layout could gain): TorchRec's best step over the tier's by the traffic
    model at each effective bandwidth, ``*`` where TorchRec's best is transfer-bound."""
    lines = []
    for (name, ahead), link in links.items():
        if not name.startswith("tier"):
            continue
        for model, part, host in product(PCIE, ("sparse", "whole"), (host_ms, 0.0, None)):
            cells = []
            for share in BANDWIDTH_SHARES:
                terms = Terms(dense_ms=dense if part == "whole" else 0.0, bandwidth_share=share)
                steps = point.steps(model, terms)
                best = best_plan(steps)
                tier = tier_step(
                    point, 0.0 if host is None else link, model, ahead, hot_rows=name == "tier",
                    terms=terms, host_ms=host or 0.0,
                )  # fmt: skip
                bound = "*" if transfer_bound(point, best, model, terms) else " "
                cells.append(f"{steps[best] / tier:>5.2f}{bound}")
            label = "ceil" if host is None else f"{host:.2f}"
            lines.append(
                f"{where} | {name:<15} {ahead:>1} | {model} {part:<6} {label:>4} | " + " ".join(cells)
            )
    return lines


@dataclass(frozen=True)
class Replay:
    """Slot plans replayed over the counted steps: per pool the rows copied in (first loads included)
    and written back, and the first loads (each pool's first ``slots`` rows); the plans' seconds and the
    bytes of their arrays."""

    loads: np.ndarray
    evictions: np.ndarray
    first: np.ndarray
    seconds: float
    nbytes: int


def _replayed(pools: list[Pool], num_steps: int, count_from: int, window: int | None, ahead: int) -> Replay:
    """The slot plans of ``pools`` over ``num_steps`` steps (look-ahead ``window``, copies ``ahead``
    steps early), counted from step ``count_from`` on."""
    loads, evictions, first = (np.zeros(len(pools)) for _ in range(3))
    seconds, nbytes = 0.0, 0
    for index, (steps, keys, slots) in enumerate(pools):
        order = np.argsort(steps, kind="stable")
        bounds = np.searchsorted(steps[order], np.arange(num_steps + 1))
        started = time.perf_counter()
        plan = plan_slots(keys[order], bounds, slots, window, ahead)
        seconds += time.perf_counter() - started
        nbytes += plan.nbytes
        loaded = plan.loads_per_step()
        first_fill = np.diff(np.minimum(np.r_[0, np.cumsum(loaded)], slots))
        loads[index] = loaded[count_from:].sum()
        evictions[index] = plan.evictions_per_step()[count_from:].sum()
        first[index] = first_fill[count_from:].sum()
    return Replay(loads, evictions, first, seconds, nbytes)


def _busiest(loads: np.ndarray, evictions: np.ndarray, ranks: int) -> float:
    """The busiest rank's copies in its busier direction, the pools placed whole on ``ranks`` ranks,
    most loads first on the rank with fewest (the balance a table-wise plan can at best have)."""
    placed_in, placed_out = np.zeros(ranks), np.zeros(ranks)
    for pool in np.argsort(-loads, kind="stable").tolist():  # one per table
        rank = int(np.argmin(placed_in))
        placed_in[rank] += loads[pool]
        placed_out[rank] += evictions[pool]
    return float(np.maximum(placed_in, placed_out).max())


def _cell(traffic: dict[str, float], name: str) -> str:
    return f"{traffic[name] * PER_MILLION:>7.3f}" if name in traffic else f"{'-':>7}"


def _ratio(x: float, y: float | None) -> str:
    if y is None:
        return "-"
    if y == 0:
        return "inf" if x > 0 else "-"
    return f"{x / y:.2f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s", force=True)
    logging.getLogger("torchrec.distributed.planner.proposers").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
    started = time.perf_counter()
    source = SyntheticCriteo(0, scale=args.scale)
    fixed = FixedPlans(source.table_configs, args.batch_size)
    stream = synthetic_stream(
        args.warmup + args.num_samples,
        epoch=args.epoch,
        scale=args.scale,
        seed=args.seed,
        sampling=args.sampling,
    )
    if stream.profile_overlaps():
        fail("the profile reads inputs of the replayed stream")
    print(
        f"{args.num_samples:,} synthetic inputs counted after a warm-up of {args.warmup:,} (Kaggle table "
        f"sizes x {args.scale}), per-GPU batch {args.batch_size}, on 1/{args.sampling} of the rows. GiB "
        "moved host-device per 1M inputs (weights, both directions): planned, the slot plan's own copies "
        "with its first rows loaded for free as d's are (start: what loading them costs); d: Belady's "
        "cache of the same device memory; FAE pp: FAE's LRU cold caches; TorchRec: the fewest bytes of "
        "its configurations (named at the end). hot: FAE pp's hot budget; a: the tier's copies run that many "
        "cold steps early (--copy-ahead); W: look-ahead in steps "
        "(epoch: the whole stream); / epoch: bytes against the whole-stream plan; s and MiB: the plan's "
        "time and arrays per 1M inputs of the stream (measured here, CPU, on the row sample)"
    )
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM':>9} {'hot':>9} | {'tier':<15} {'a':>1} {'W':>5} {'slots':>11} | "
        f"{'planned':>7} {'start':>6} {'d':>7} {FAE_PLAN:>7} {'TorchRec':>7} | {'/ d':>5} {'/ TR':>5} "
        f"{'/epoch':>6} | {'s':>6} {'MiB':>6}"
    )
    if args.compare == "all":
        print(
            "then per tier (whole-stream plans), PCIe generation, part of the step (sparse; whole: with "
            "DLRM's dense part at --dense-efficiency of --gpu-tflops) and host ms (the tier's own work per "
            "cold step, added to it; ceil: no host work and no copies, the most any slot plan of the tier's "
            "layout could gain): TorchRec's best step / the tier's by the traffic model (no cache "
            "machinery), at effective bandwidths of "
            + ", ".join(f"{share:.2f}" for share in BANDWIDTH_SHARES)
            + " of the link's; *: TorchRec's best is transfer-bound there. The tier's step: FAE pp's layout, "
            "its copies on the busiest rank's link (tables placed largest first on the least loaded rank), "
            "run a cold steps early"
        )
    for key in args.points:
        try:
            print("\n".join(measure(stream, key, fixed, args)))
        except PlannerError as error:
            print(f"dim {key[0]}, {key[1]} GPUs x {format_bytes(key[2])}: no plan: {error}")
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
