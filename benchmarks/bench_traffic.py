"""Host-device embedding traffic and step time: FAE against TorchRec's planners, at equal HBM.

For every point of the grid (embedding dim, GPUs, HBM per GPU) the same statistics plan the model
several ways, each a dry run of TorchRec's planner on a CUDA topology:

- FAE: ``FAEShardingPlanner`` (its knob picks the hot budget), hot rows in HBM, cold rows in
  ``fused_uvm_caching`` with sized caches, two ways: planned for the prefetch pipeline ("FAE pp", the
  planner's default) and without it ("FAE"); with no hot rows each knob also tries TorchRec's
  configurations that train with its pipeline, and where it keeps one the tables name it ("FAE hot":
  the hot budget "FAE" chose, its cold caches planned for the prefetch pipeline);
- TorchRec's 18 configurations a user sets (``planner.torchrec_configs``): its default
  ``EmbeddingShardingPlanner`` or its scale-up caches (``fused_uvm_caching`` with
  ``AccessCacheStatistics`` from the same statistics, ``EmbeddingOffloadScaleupProposer`` sizing
  them), each with and without ``CacheParams(prefetch_pipeline=True)``, with TorchRec's choice of
  sharding types or table-, column- and table-column-wise only on the tables it offloads ("tw-uvm") or on
  every table ("tw-all"), with LRU or LFU caches (LFU without the prefetch pipeline, which FBGEMM does not
  pipeline; the proposer sizes LFU caches as LRU ones, its only model). TorchRec's best is the
  fastest of those that place, named per point;
- (c) every table in HBM (the speed limit; step only).

**Profile.** The statistics are FAE's profile of other inputs than the replayed ones (``id_stream``).
DLRM (the default, Criteo-like inputs over Kaggle's tables x ``--scale``): 5% of an epoch (``--epoch``,
Criteo Kaggle's 45.8M inputs by default) sampled, and a holdout, from the data set's chunks after the
replayed ones, so one hot set serves every length replayed. TBSM (``--model tbsm``): the Taobao-like
histories of ``--num-users`` users, as ``bench_hot_share.py`` makes them, over the TBSM reference run's
tables (987,994 users, 4,162,024 items, 9,439 categories) x ``--scale``; an input is 21 steps of a user,
an item and a category, hot only when all 63 ids are. The profile samples 20% of the training inputs
(FAE's TBSM setting) and holds out ``--holdout`` of the others, drawn at random; the stream is the rest,
in training order. The script checks that the profile and the stream share no input, and prints the
hot-input share the knob estimated next to the share measured on the replayed stream.

**Traffic** replays the stream through the plans' UVM caches with ``cache_model`` (FBGEMM's
set-associative LRU and LFU, with the prefetch pipeline's locking where a plan asks for it; see its
docstring for what a miss, an eviction and a row read in host memory cost). The first ``--warmup``
inputs fill the caches; traffic is counted on the ``--num-samples`` inputs after them, per input. FAE's
stream is its cold steps: hot steps touch HBM only. (d) is Belady's optimal cache on equal
terms: it holds as many rows as the device memory TorchRec's reservation leaves for embeddings, starts
the warm-up preloaded, for free, with the rows it serves best (those used soonest), as the plans' HBM
rows are preloaded, and warms and is counted on the same inputs as every cache.

**Two step estimates**, in ms per step:

- TorchRec's perf model: each planner's prediction. FAE's is ``share x hot step + (1 - share) x cold
  step`` with the knob's estimated share. Without the prefetch pipeline the perf model prices a
  ``fused_uvm_caching`` lookup by the load factor, whatever the cache achieves; with it, at HBM speed
  plus a prefetch of the misses its ``CacheStatistics`` expect.
- A traffic model: each plan's own layout (its sharding types, shards and ranks) priced by TorchRec's
  perf model with every row in HBM, plus the bytes of a step over the busiest rank's link, in its
  busier direction, over PCIe Gen4 x16 (31.5 GB/s) or Gen5 x16 (63.0 GB/s): theoretical bandwidths per
  direction, reads and writes overlapping, so transfers take the least time they can. With the prefetch
  pipeline ("FAE pp", TorchRec's "pp" configurations) the prefetched transfers overlap the step: the
  larger of the two (generous to both: FBGEMM keeps the backward from overlapping a prefetch), plus the
  bytes the lookup kernels read in host memory themselves (conflict misses, hits lost to a miss,
  ``fused_uvm`` rows), which no prefetch moves. For FAE this is ``share x hot step +
  (1 - share) x cold step`` with the share measured on the stream: a hot step is its hot part's own
  kernels and collectives (TorchRec prices a data-parallel hot part's all-reduce), a cold step its
  layout in HBM with the transfers of ``1 / (1 - share)`` average steps (its cold steps carry all of its
  traffic). The cache machinery's fixed cost per step (FBGEMM's linearize, unique, lookup, sort and
  insert kernels) is left out for every plan: no published figure for it was found. Both models leave
  out FAE's own costs (remapping ids, routing inputs).

Each FAE plan is then set against TorchRec's best by each model: a win (only where it keeps hot rows:
a plan without them is one of TorchRec's configurations or FAE's cold caches alone, the planner's choice
and not FAE's gain), level (within 2%) or a loss. ``--calibration`` (a GPU's, ``bench_calibrate.py``) and
``--published`` (the bandwidths fitted to TorchRec's published runs, ``bench_published.py``) add columns
to the decision table.

**Convergence.** At ``--convergence-points`` (one point per panel) one replay, with the same profile
and plans, counts traffic on the first 1M, 2M, ... inputs after the warm-up (``--convergence-lengths``),
and the last line says whether doubling the default length moves any headline ratio by more than 5%.
Where the devices hold nearly the whole model, traffic is mostly first uses of rows never seen
before, whose rate falls with the length (the data's distinct rows grow as a power of it), so no
length converges there; BENCHMARKS.md says where and by how much.

**TBSM's defaults.** Dim 16 and a per-GPU batch of 256 (the reference run's), 1 and 4 GPUs with 16 MiB
to 256 MiB each: below the 315 MiB model, which needs some 370 MiB on one GPU, or 100 MiB each on four,
once TorchRec has reserved its share (the grid drops 4 GPUs x 128 MiB and up, where it fits, and at
1 GPU x 16 MiB the scale-up planner finds no plan). Every row is replayed (``--sampling 1``). At 50,000
users the profile leaves about 205,000 inputs (5.6 training inputs a user, 80% unsampled, less the
holdout of 20,000): the warm-up of 50,000 and the 100,000 counted fit, and the convergence lengths stop
there; doubling the length needs twice the users (``--num-users 100000``, below). These users' inputs
use some 355,000 rows (22 MiB at dim 16), which Belady's memory holds at every default point (d = 0):
what moves is mostly rows used for the first time.

    python benchmarks/bench_traffic.py     # the default grid at 16M inputs: about 25 minutes on 2 cores
    python benchmarks/bench_traffic.py --num-samples 200k --warmup 100k --epoch 400k --scale 0.2 \
        --dims 128 --world-sizes 1 --caps 128MiB --convergence-lengths
    python benchmarks/bench_traffic.py --model tbsm      # TBSM at the reference sizes: about 3 minutes
    python benchmarks/bench_traffic.py --model tbsm --num-users 100000 \
        --convergence-lengths 25k 50k 100k 200k         # the doubling of the default length

Prints the traffic, the steps under each model, FAE's wins and losses against TorchRec's best and the
convergence table, and writes traffic.png, step_time.png, hot_share.png and every point's figures
(``traffic_points.json``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from itertools import product
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from benchmarks.common.arguments import fail
from benchmarks.common.cache_model import BatchedKeys, belady_moves, sampled_rows
from benchmarks.common.calibration import ELEMENT_BYTES, Calibration
from benchmarks.common.id_stream import IdStream, synthetic_stream, taobao_stream
from benchmarks.common.plan_traffic import CacheGroups, Traffic, cache_groups, replay
from benchmarks.common.step_models import (
    DLRM_MLPS,
    FAE,
    FAE_STEPS,
    LOOKAHEAD,
    PCIE,
    STEP_MODELS,
    FAEFigures,
    Point,
    Terms,
    best_plan,
    break_even,
    deciding_term,
    decision,
    dlrm_training_flops,
    pipelined,
    torchrec_best,
    transfer_bound,
)
from benchmarks.common.training_data import NUM_USERS, describe, model_parser
from fae_torchrec import HotSet
from fae_torchrec.arguments import fraction, non_negative_int, positive_float, positive_int
from fae_torchrec.command_line import PROFILE_SAMPLE, add_taobao_arguments
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import KAGGLE_INPUTS
from fae_torchrec.data.source import BlockSource
from fae_torchrec.recipes.sources import open_taobao_source
from fae_torchrec.stats import hot_share_curve
from fae_torchrec.stats.hot_set import COLD
from fae_torchrec.units import format_bytes, parse_bytes
from planner import FAEShardingPlanner
from planner.baseline import BaselinePlan, default_planner, dry_run, hbm_planner, plan_configs
from planner.report import FAEPlanReport
from planner.topology import make_topology
from planner.torchrec_configs import TorchRecConfig, torchrec_configs

logger = logging.getLogger("bench_traffic")
#: HBM per GPU of "all in HBM" (c): enough for any model here.
UNLIMITED_HBM = 1 << 40
#: The sweeps of the terms the step models leave out: effective bandwidth as a share of the link's
#: theoretical one, and the cache machinery's fixed cost per cache and step (us; the break-even search
#: stops at ``BREAK_EVEN_TOP_US``).
BANDWIDTH_SHARES = (1.0, 0.5, 1 / 3, 0.2, 0.1)
MACHINERY_US = (0, 5, 10, 20, 50, 100)
BREAK_EVEN_TOP_US = 500
#: The figures of every grid point at the default length, written to ``--out`` for later models.
POINTS_FILE = "traffic_points.json"
#: Bytes per input to GiB per million inputs.
PER_MILLION = 1e6 / (1 << 30)
#: FAE's plans: its knob with the cold caches planned for the prefetch pipeline (the planner's default)
#: and without it, as TorchRec's configurations plan caches both ways, and the hot budget the knob chose
#: without it with the caches planned for the prefetch pipeline ("FAE hot": FAE's hot rows where the
#: knob, pricing pipelined caches by TorchRec's perf model, may keep none).
FAE_PLANS = {
    "FAE pp": CacheParams(prefetch_pipeline=True),
    "FAE": CacheParams(prefetch_pipeline=False),
    "FAE hot": CacheParams(prefetch_pipeline=True),
}
#: Per model: the stream's lengths, the grid, the per-GPU batch and the row sampling (see the module's
#: docstring for TBSM's).
DEFAULTS = {
    "dlrm": {
        "num_samples": "16M",
        "warmup": "4M",
        "convergence_lengths": ["1M", "2M", "4M", "8M", "16M", "32M"],
        "convergence_points": ["16:1:512MiB", "16:8:256MiB", "128:1:2GiB", "128:8:512MiB"],
        "dims": [16, 128],
        "world_sizes": [1, 8],
        "caps": ["256MiB", "512MiB", "1GiB", "2GiB", "4GiB", "8GiB"],
        "batch_size": 2048,
        "sampling": 16,
    },
    "tbsm": {
        "num_samples": "100k",
        "warmup": "50k",
        "convergence_lengths": ["25k", "50k", "100k"],
        "convergence_points": ["16:1:32MiB", "16:4:16MiB"],
        "dims": [16],
        "world_sizes": [1, 4],
        "caps": ["16MiB", "32MiB", "64MiB", "128MiB", "256MiB"],
        "batch_size": 256,
        "sampling": 1,
    },
}


class FixedPlans:
    """TorchRec's plans that do not depend on the statistics, made once: (a) per grid point and (c)
    per embedding dim and GPUs."""

    def __init__(self, tables: Callable[[int], list[EmbeddingBagConfig]], batch_size: int) -> None:
        self.tables = tables
        self.batch_size = batch_size
        self.plans: dict[tuple, BaselinePlan] = {}

    def default(self, dim: int, world_size: int, hbm_cap: int) -> BaselinePlan:
        topology = make_topology(world_size, hbm_cap=hbm_cap)
        return self._made(
            ("a", dim, world_size, hbm_cap),
            default_planner(topology, self.batch_size, tables=self.tables(dim)),
            dim,
        )

    def hbm(self, dim: int, world_size: int) -> BaselinePlan:
        topology = make_topology(world_size, hbm_cap=UNLIMITED_HBM)
        planner = hbm_planner(topology, self.tables(dim), self.batch_size)
        return self._made(("c", dim, world_size), planner, dim)

    def _made(self, key: tuple, planner: EmbeddingShardingPlanner, dim: int) -> BaselinePlan:
        if key not in self.plans:
            self.plans[key] = dry_run(planner, self.tables(dim))
        return self.plans[key]


def measure_point(
    stream: IdStream,
    dim: int,
    world_size: int,
    hbm_cap: int,
    fixed: FixedPlans,
    args: argparse.Namespace,
    lengths: list[int],
) -> dict[int, Point]:
    """Plan every way at one grid point and replay the stream through the plans' caches: one Point
    per length, counting that many inputs after the warm-up (all from one replay)."""
    stats = stream.stats.with_embedding_dim(dim)
    topology = make_topology(world_size, hbm_cap=hbm_cap)
    batch = args.batch_size
    plans: dict[str, BaselinePlan] = {}
    default = {TorchRecConfig(): fixed.default(dim, world_size, hbm_cap)}  # planned already for the grid
    for config, planned in plan_configs(torchrec_configs(), topology, stats, batch, known=default).items():
        if isinstance(planned, PlannerError):  # the point keeps the configurations that place
            where = f"dim {dim}, {world_size} GPUs x {format_bytes(hbm_cap)}"
            logger.info("%s: TorchRec's %s places no plan", where, config.name)
        else:
            plans[config.name] = planned
    global_batch = batch * world_size
    warm = args.warmup

    def in_batches(inputs: int) -> int:
        return steps_of(inputs, global_batch)

    table_index = {c.name: t for t, c in enumerate(stats.tables)}
    ends = [in_batches(warm + n) for n in lengths]
    groups = {name: cache_groups(plan.plan) for name, plan in plans.items()}
    replayed: dict[tuple, list[Traffic]] = {}  # configurations with the same caches move the same rows
    moved: dict[str, list[Traffic]] = {}
    for name, plan_groups in groups.items():
        key = plan_groups.signature
        if key not in replayed:
            replayed[key] = replay(
                plan_groups,
                stream.inputs // global_batch,
                stream.tables,
                stream.ids,
                table_index,
                stream.sampling,
                in_batches(warm),
                ends,
            )
        moved[name] = replayed[key]
    fae_plans: dict[str, tuple[FAEPlanReport, np.ndarray]] = {}
    for name, cache_params in FAE_PLANS.items():
        budget = fae_plans["FAE"][0].hot_budget_bytes if name == "FAE hot" else None
        fae = FAEShardingPlanner(
            topology,
            stats,
            batch_size=batch,
            hot_budget_bytes=budget,
            num_candidates=args.knob_candidates,
            cache_params=cache_params,
        )
        hot_set = fae.choose_hot_set()
        meta = fae.meta_module(hot_set)
        fae_plan = fae.plan(meta, get_default_sharders())
        cold_inputs = ~stream.hot_inputs(hot_set)
        groups[name] = cache_groups(
            fae_plan, lambda name: name.removesuffix(f"_{COLD}") if name.endswith(f"_{COLD}") else None
        )
        moved[name] = _replay_cold_steps(
            stream, hot_set, groups[name], cold_inputs, table_index, global_batch, warm, lengths
        )
        fae_plans[name] = fae.report, cold_inputs
    row_bytes = dim * 4
    capacity = float(fae.device_memory(meta).sum()) / row_bytes
    belady = np.r_[0, np.cumsum(belady_rows(stream, global_batch, max(ends), capacity, args.belady_sampling))]
    hbm = fixed.hbm(dim, world_size)
    step = {name: plan.totals.step for name, plan in plans.items()}
    step |= {name: report.step for name, (report, _) in fae_plans.items()} | {"c": hbm.totals.step}
    in_hbm = {name: plan.step_in_hbm for name, plan in plans.items()}
    points = {}
    for i, (n, end) in enumerate(zip(lengths, ends, strict=True)):
        counted = float(belady[min(end, len(belady) - 1)] - belady[min(in_batches(warm), len(belady) - 1)])
        points[n] = Point(
            dim,
            world_size,
            hbm_cap,
            n,
            global_batch,
            {
                name: FAEFigures(
                    report.hot_budget_bytes,
                    report.hot_input_share,
                    float(np.mean(~cold_inputs[warm : warm + n])),
                    report.hot_step,
                    report.cold_step_in_hbm,
                    report.torchrec_config,
                )
                for name, (report, cold_inputs) in fae_plans.items()
            },
            {name: m[i].bytes / n for name, m in moved.items()} | {"d": counted * row_bytes / n},
            {name: m[i].busiest_link() / n for name, m in moved.items()},
            step,
            in_hbm,
            {name: g.busiest_rank_caches for name, g in groups.items()},
            {name: m[i].direct.busiest_link() / n for name, m in moved.items()},
        )
    return points


def steps_of(inputs: int, global_batch: int) -> int:
    """The steps ``inputs`` inputs take, the last one short."""
    return -(-inputs // global_batch)


def _replay_cold_steps(
    stream: IdStream,
    hot_set: HotSet,
    groups: CacheGroups,
    cold_inputs: np.ndarray,
    table_index: dict[str, int],
    global_batch: int,
    warm: int,
    lengths: list[int],
) -> list[Traffic]:
    """FAE's traffic: its cold steps (hot steps read HBM only), the cold inputs in stream order in
    batches of ``global_batch``, each cold lookup through the cold parts' caches ``groups``."""
    cold_before = np.r_[0, np.cumsum(cold_inputs)]  # cold inputs before each input
    cold_lookup = cold_inputs[stream.inputs] & (stream.ranks >= stream.num_hot(hot_set))
    return replay(
        groups,
        cold_before[stream.inputs[cold_lookup]] // global_batch,
        stream.tables[cold_lookup],
        _cold_ids(hot_set, stream.tables[cold_lookup], stream.ids[cold_lookup]),
        table_index,
        stream.sampling,
        steps_of(int(cold_before[warm]), global_batch),
        [steps_of(int(cold_before[warm + n]), global_batch) for n in lengths],
    )


def _cold_ids(hot_set: HotSet, tables: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Ids of cold rows in their table's cold part."""
    cold = np.empty_like(ids)
    for t in np.unique(tables):
        mine = tables == t
        cold[mine] = hot_set.remap(int(t), ids[mine])[1]
    return cold


def belady_rows(stream: IdStream, global_batch: int, end: int, capacity: float, sampling: int) -> np.ndarray:
    """Rows Belady's cache of ``capacity`` rows moves in each batch before ``end``, preloaded as the
    stream starts (before the warm-up, as the plans' HBM rows are); replayed on ``1/sampling`` of the
    rows (a subset of the stream's own sample)."""
    rows = stream.rows()
    batches = stream.inputs // global_batch
    keep = sampled_rows(rows, sampling) & (batches < end)
    moved_in, moved_out = belady_moves(BatchedKeys.of(batches[keep], rows[keep]), int(capacity / sampling))
    return (moved_in + moved_out) * sampling


def grid(args: argparse.Namespace, fixed: FixedPlans) -> list[tuple[int, int, int]]:
    """Grid points whose HBM cap makes TorchRec's default plan use UVM (others need no offload)."""
    points = []
    for dim in args.dims:
        for world_size in args.world_sizes:
            for cap in args.caps:
                where = f"dim {dim}, {world_size} GPUs x {format_bytes(cap)}"
                try:
                    kernels = fixed.default(dim, world_size, cap).kernels
                except PlannerError:
                    logger.info("%s: TorchRec finds no plan", where)
                    continue
                if kernels["fused_uvm"] + kernels["fused_uvm_caching"]:
                    points.append((dim, world_size, cap))
                else:
                    logger.info("%s: the model fits in HBM", where)
    return points


def _where(p: Point) -> str:
    return f"{p.dim:>4} {p.world_size:>4} {format_bytes(p.hbm_cap):>9}"


def _ratio(x: float, y: float) -> str:
    if y == 0:
        return "inf" if x > 0 else "-"
    return f"{x / y:.2f}"


#: The least traffic of TorchRec's configurations, of those planned for the prefetch pipeline, and the
#: traffic ratios of the tables: TorchRec's least against FAE's plan of the same pipeline, FAE's against
#: Belady's.
LEAST, LEAST_PP = "TorchRec least", "TorchRec least pp"
TRAFFIC_RATIOS = (
    (LEAST, "FAE"),
    (LEAST_PP, "FAE pp"),
    (LEAST_PP, "FAE hot"),
    ("FAE", "d"),
    ("FAE pp", "d"),
)


def traffic_of(p: Point) -> dict[str, float]:
    """The point's traffic per plan, with TorchRec's least (of all its configurations, and of those
    planned for the prefetch pipeline)."""
    least = {}
    for name, names in ((LEAST, p.torchrec), (LEAST_PP, [n for n in p.torchrec if pipelined(n)])):
        if names:
            least[name] = min(p.traffic[n] for n in names)
    return p.traffic | least


def _traffic_ratios(p: Point) -> list[str]:
    t = traffic_of(p)
    return [_ratio(t[x], t[y]) if {x, y} <= set(t) else "-" for x, y in TRAFFIC_RATIOS]


def _cell(values: dict[str, float], name: str, width: int, scale: float = 1.0) -> str:
    """``name``'s value (times ``scale``), or "-" where the point has no such plan."""
    return f"{values[name] * scale:>{width}.3f}" if name in values else f"{'-':>{width}}"


def _fae_plan(f: FAEFigures) -> str:
    """An FAE plan's hot budget, or the TorchRec configuration it is where it keeps no hot rows."""
    return format_bytes(f.hot_budget) if f.hot_rows else f"0: {f.torchrec_config or 'FAE caches'}"


def print_traffic(points: list[Point]) -> None:
    print(
        "traffic: GiB moved host-device per 1M inputs (both directions), after the warm-up; per FAE plan its "
        "hot budget (or, without hot rows, the TorchRec configuration its knob chose), the hot-input share "
        "its knob estimated and the share measured on the counted inputs; TorchRec least: the least of its "
        "configurations (pp: of those planned for the prefetch pipeline)"
    )
    names = (*FAE, LEAST, LEAST_PP, "d")
    fae = " | ".join(f"{name:>7}: {'plan':>22} {'est':>6} {'measured':>8}" for name in FAE_PLANS)
    ratios = [f"{x}/{y}" for x, y in TRAFFIC_RATIOS]
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>9} | {fae} | "
        + " ".join(f"{n:>8}" for n in names)
        + " | "
        + " ".join(f"{r:>{max(len(r), 6)}}" for r in ratios)
    )
    for p in points:
        shares = " | ".join(
            f"{'':>7}  {_fae_plan(f):>22} {f.hot_share:>6.1%} {f.measured_share:>8.1%}"
            for f in p.fae.values()
        )
        t = traffic_of(p)
        print(
            f"{_where(p)} | {shares} | "
            + " ".join(_cell(t, n, 8, PER_MILLION) for n in names)
            + " | "
            + " ".join(f"{r:>{max(len(n), 6)}}" for r, n in zip(_traffic_ratios(p), ratios, strict=True))
        )


def print_torchrec_grid(points: list[Point]) -> None:
    """Every TorchRec configuration's traffic and step at every point, by each model: "-" where it
    places no plan."""
    configs = list(dict.fromkeys(name for p in points for name in p.torchrec))
    width = max(map(len, [*configs, "configuration"]))
    heads = [f"{p.dim}:{p.world_size}:{format_bytes(p.hbm_cap).replace(' ', '')}" for p in points]
    widths = [max(len(h), 7) for h in heads]
    tables = [("traffic GiB per 1M inputs", None, PER_MILLION)]
    tables += [(f"step ms, {model}", model, 1.0) for model in STEP_MODELS]
    print(
        "TorchRec's configurations (planner.torchrec_configs: default or scale-up planner; pp: caches "
        "planned for the prefetch pipeline; tw-uvm / tw-all: sharding types table-, column- or "
        "table-column-wise on the tables the plan offloads / on every table; LFU caches), per point "
        "dim:GPUs:HBM per GPU; * the best by that model"
    )
    for title, model, scale in tables:
        print(title)
        print(
            f"{'configuration':<{width}} | "
            + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True))
        )
        bests = [best_plan(p.steps(model)) if model else None for p in points]
        for name in configs:
            cells = []
            for p, w, best in zip(points, widths, bests, strict=True):
                values = p.steps(model) if model else p.traffic
                cell = f"{values[name] * scale:.3f}{'*' if name == best else ''}" if name in values else "-"
                cells.append(f"{cell:>{w}}")
            print(f"{name:<{width}} | " + " ".join(cells))


def print_steps(points: list[Point]) -> None:
    print(
        "step models, the sparse part of a step only. TorchRec's perf model: each planner's prediction; "
        "FAE: share x hot step + (1 - share) x cold step, with its knob's estimated share (it counts a "
        "prefetch as blocking, whatever the pipeline: FAE la as FAE hot). Traffic model: each plan's own "
        "layout priced by TorchRec's perf model with every row in HBM, plus the busiest link's bytes per "
        "step / PCIe bandwidth per direction (theoretical, reads and writes overlapped), or the larger of "
        "the two where the prefetch pipeline overlaps them (TorchRec's pp configurations; generous to them: "
        "FBGEMM keeps the backward from overlapping a prefetch); FAE's cold steps carry all of its traffic "
        "(the measured share): share x hot step + (1 - share) x cold step, or with the prefetch pipeline "
        "(FAE pp, FAE hot, FAE la) timed over a random order of hot and cold steps, a cold step's transfer "
        "overlapping the step before it, and with look-ahead (FAE la) also the hot steps since the last cold "
        "one. FBGEMM's fixed cost per step of the cache machinery is left out here (swept below), and so are "
        "FAE's remap and routing. best: the shortest of TorchRec's configurations, named."
    )
    titles = {"perf": "TorchRec's perf model"} | {
        g: f"traffic model, PCIe {g} x16 at {bw / 1e9:.1f} GB/s per direction (theoretical)"
        for g, bw in PCIE.items()
    }
    ratios = [f"best/{name}" for name in FAE_STEPS] + [f"{name}/c" for name in FAE_STEPS]
    for model in STEP_MODELS:
        print(f"step ms, {titles[model]}")
        print(
            f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>9} | "
            + " ".join(f"{n:>8}" for n in (*FAE_STEPS, "best"))
            + f" {'TorchRec best':<22} {'c':>8} | "
            + " ".join(f"{r:>11}" for r in ratios)
        )
        for p in points:
            s = p.steps(model)
            values = [_ratio(torchrec_best(s), s[name]) for name in FAE_STEPS]
            values += [_ratio(s[name], s["c"]) for name in FAE_STEPS]
            print(
                f"{_where(p)} | "
                + " ".join(_cell(s, n, 8) for n in FAE_STEPS)
                + f" {torchrec_best(s):>8.3f} {best_plan(s):<22} {s['c']:>8.3f} | "
                + " ".join(f"{v:>11}" for v in values)
            )


def _verdict(point: Point, fae: str, model: str, terms: Terms) -> str:
    """FAE against TorchRec's best at ``point``: the ratio of the steps (best / FAE), win, level or
    lose, and the term that decides it."""
    steps = point.steps(model, terms)
    ratio = torchrec_best(steps) / steps[fae]
    figures = point.figures(fae)
    if not figures.hot_rows:  # the planner chose one of TorchRec's configurations
        return f"{ratio:.2f} {decision(ratio, False)} {figures.torchrec_config or 'no hot rows'}"
    return f"{ratio:.2f} {decision(ratio)} {deciding_term(point, fae, model, terms)}"


#: A column of the decision table beyond the plain models: its title and each point's terms, priced by
#: the traffic model at PCIe Gen4 (a GPU's calibration, TorchRec's published runs' fitted bandwidths).
Column = tuple[str, Callable[[Point], Terms]]


def print_decision_table(points: list[Point], dense: dict[int, float], extra: list[Column]) -> None:
    """Per grid point and FAE plan, FAE against TorchRec's best by each model (sparse part only), by the
    traffic model at PCIe Gen4 for the whole step (``dense``: the dense part's ms by embedding
    dimension; none where empty), and in the ``extra`` columns."""
    columns: list[tuple[str, str, Callable[[Point], Terms]]] = [
        (m, m, lambda p: Terms()) for m in STEP_MODELS
    ]
    if dense:
        columns.append(("Gen4 whole", "Gen4", lambda p: Terms(dense_ms=dense[p.dim])))
    columns += [(title, "Gen4", terms_of) for title, terms_of in extra]
    print(
        "decision: TorchRec's best step / FAE's (best: the shortest of TorchRec's configurations), win above "
        "1.02 (only with hot rows: a plan without them is TorchRec's configuration, named, level at best), "
        "level within 2%, lose below 0.98, and the term that decides it (layout: the plans' steps with every "
        "row in HBM; offload: what keeping rows in host memory adds, cache pricing or exposed transfers)"
    )
    for fae in FAE_STEPS:
        print(f"{fae:<20} | " + " | ".join(f"{title:>32}" for title, _, _ in columns))
        for p in points:
            cells = [_verdict(p, fae, model, terms_of(p)) for _, model, terms_of in columns]
            print(f"{_where(p)} | " + " | ".join(f"{c:>32}" for c in cells))


def print_extra(points: list[Point], extra: list[Column], calibration: Calibration | None) -> None:
    """FAE against TorchRec's best by the traffic model in each ``extra`` column: with a GPU's measured
    bandwidth and machinery (``calibration``), with the bandwidths fitted to TorchRec's published runs."""
    if calibration is not None:
        print(calibration.describe())
    for title, terms_of in extra:
        for fae in FAE_STEPS:
            print(f"  {fae} against TorchRec's best ({title}): {_tally(points, fae, 'Gen4', terms_of)}")


def _tally(points: list[Point], fae: str, model: str, terms_of: Callable[[Point], Terms]) -> str:
    """At how many points FAE wins, is level or loses (each point's terms ``terms_of(point)``), and the
    range of best / FAE."""
    ratios, kinds = [], []
    for p in points:
        steps = p.steps(model, terms_of(p))
        ratios.append(torchrec_best(steps) / steps[fae])
        kinds.append(decision(ratios[-1], p.figures(fae).hot_rows))
    counts = {kind: kinds.count(kind) for kind in ("win", "level", "lose")}
    spread = f"{min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else "-"
    without = sum(not p.figures(fae).hot_rows for p in points)
    return (
        f"win {counts['win']:>2}, level {counts['level']:>2}, lose {counts['lose']:>2} ({spread}; "
        f"{without} without hot rows)"
    )


def print_decisions(points: list[Point]) -> None:
    """Per FAE plan and step model: at how many points FAE's step wins against TorchRec's best, is
    level with it (within 2%), or loses, and the range of the ratios."""
    for name in FAE_STEPS:
        for model in STEP_MODELS:
            print(
                f"{name} against TorchRec's best ({model}): {_tally(points, name, model, lambda p: Terms())}"
            )


def print_sweeps(points: list[Point], dense: dict[int, float]) -> None:
    """FAE against TorchRec's best as the terms the models leave out grow: the effective bandwidth, the
    cache machinery's fixed cost per cache and step (with the break-even costs at which FAE wins by
    1.1x and 1.5x), and the dense part of the step (``dense``: ms by embedding dimension)."""
    print(
        "sweep: effective host-device bandwidth, as a share of PCIe Gen4's theoretical 31.5 GB/s (scattered "
        "rows move slower than the link's peak); traffic model, sparse part"
    )
    for share in BANDWIDTH_SHARES:
        terms = Terms(bandwidth_share=share)
        cells = [f"{fae}: {_tally(points, fae, 'Gen4', lambda p, t=terms: t)}" for fae in FAE_STEPS]
        print(f"  {share:>5.2f} ({31.5 * share:>5.2f} GB/s) | " + " | ".join(cells))
    print(
        "sweep: the cache machinery's fixed cost per cache and step (us), paid by every step of TorchRec's "
        "cached plans and by FAE's cold steps; traffic model at Gen4 and TorchRec's perf model, sparse part"
    )
    for cost in MACHINERY_US:
        terms = Terms(machinery_ms=cost / 1e3)
        cells = [
            f"{fae} {model}: {_tally(points, fae, model, lambda p, t=terms: t)}"
            for fae in FAE_STEPS
            for model in ("Gen4", "perf")
        ]
        print(f"  {cost:>5g} us | " + " | ".join(cells))
    top = BREAK_EVEN_TOP_US / 1e3
    print(
        f"break-even: the machinery cost per cache and step (us, up to {BREAK_EVEN_TOP_US:g}) at which FAE's "
        "step is 1.1x and 1.5x shorter than TorchRec's best (-: not below that); caches on the busiest rank"
    )
    keys = [  # look-ahead is one-step prefetch to TorchRec's perf model, which counts a prefetch as blocking
        (fae, model, target)
        for fae in FAE_STEPS
        for model in ("Gen4", "perf")
        if not (fae == LOOKAHEAD and model == "perf")
        for target in (1.1, 1.5)
    ]
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>9} | caches FAE pp, FAE, FAE hot, best (Gen4) | "
        + " ".join(f"{f'{fae} {model} {target}x':>17}" for fae, model, target in keys)
    )
    found = {key: break_even(points, *key, Terms(), top) for key in keys}
    for i, p in enumerate(points):
        best = best_plan(p.steps("Gen4"))
        caches = ", ".join(str(p.caches.get(name, 0)) for name in (*FAE, best))
        cells = [found[key][i] for key in keys]
        print(
            f"{_where(p)} | {caches:>38} | "
            + " ".join(f"{'-' if c is None else f'{1e3 * c:.0f}':>17}" for c in cells)
        )
    if not dense:
        print("whole step: the dense part is not priced for this model")
        return
    print(
        "whole step: the dense part added to every plan's step, "
        + ", ".join(f"{ms:.3f} ms at dim {dim}" for dim, ms in sorted(dense.items()))
    )
    for fae in FAE_STEPS:
        for model in STEP_MODELS:
            tally = _tally(points, fae, model, lambda p: Terms(dense_ms=dense[p.dim]))
            print(f"  {fae} against TorchRec's best ({model}): {tally}")


def print_ceilings(points: list[Point]) -> None:
    """Where TorchRec's best is transfer-bound (traffic models, sparse part), its step over (c)'s: every
    row in HBM and nothing moved, the most that any placement (FAE's, a planned cold tier's) can gain."""
    print(
        "ceiling: TorchRec's best step / (c)'s (every row in HBM, nothing moved) where TorchRec's best is "
        "transfer-bound (-: it is not), traffic model, sparse part, at "
        + ", ".join(f"{share:.2f}" for share in BANDWIDTH_SHARES)
        + " of the link's bandwidth: the most any placement can gain there"
    )
    for model, p in product(PCIE, points):
        cells = []
        for share in BANDWIDTH_SHARES:
            terms = Terms(bandwidth_share=share)
            steps = p.steps(model, terms)
            best = best_plan(steps)
            bound = transfer_bound(p, best, model, terms)
            cells.append(f"{steps[best] / steps['c']:>5.2f}" if bound else f"{'-':>5}")
        if any(cell.strip() != "-" for cell in cells):
            print(f"  {model} {_where(p)} | " + " ".join(cells))


def dense_ms(model: str, args: argparse.Namespace, points: list[Point]) -> dict[int, float]:
    """The dense part of a step by embedding dimension (ms): DLRM's training FLOPs per input
    (``step_models.dlrm_training_flops``) times the per-GPU batch, at ``--dense-efficiency`` of
    ``--gpu-tflops``; empty for TBSM, whose dense part is not priced, and for dimensions that DLRM's
    reference configurations do not have."""
    if model != "dlrm" or any(p.dim not in DLRM_MLPS for p in points):
        return {}
    rate = args.gpu_tflops * 1e12 * args.dense_efficiency
    return {p.dim: 1e3 * dlrm_training_flops(p.dim) * p.global_batch / p.world_size / rate for p in points}


def headline(p: Point) -> dict[str, float]:
    """The ratios the convergence table follows: traffic of TorchRec's plans against FAE's and FAE's
    against Belady, and TorchRec's best step against each FAE plan's."""
    t = traffic_of(p)
    ratios = {f"{x}/{y}": (t.get(x, np.nan), t.get(y, np.nan)) for x, y in TRAFFIC_RATIOS}
    for model in STEP_MODELS:
        steps = p.steps(model)
        ratios |= {f"best/{name} {model}": (torchrec_best(steps), steps[name]) for name in FAE_STEPS}
    return {name: x / y if y else np.inf for name, (x, y) in ratios.items()}


def _change(before: dict[str, float], after: dict[str, float]) -> float:
    """The largest relative change of a finite ratio."""
    changes = [
        abs(after[n] / before[n] - 1) for n in before if np.isfinite(before[n] * after[n]) and before[n]
    ]
    return max(changes, default=0.0)


def print_convergence(by_length: dict[int, dict[tuple, Point]], keys: list[tuple], default: int) -> None:
    """The headline ratios of ``keys`` at each stream length, with the largest change from the length
    before, and whether doubling the default length moves any ratio by more than 5%."""
    measured = [p for length in sorted(by_length) for p in by_length[length].values() if p.key in keys]
    if not measured:
        return
    names = list(headline(measured[0]))
    print(
        "convergence: headline ratios by inputs counted after the warm-up (one profile, one replay per "
        "point); change: the largest from the length before"
    )
    shown = (*FAE_PLANS, LEAST, "d")
    print(
        f"{'dim':>4} {'GPUs':>4} {'HBM/GPU':>9} {'inputs':>11} "
        + " ".join(f"{f'{name} budget':>16}" for name in FAE_PLANS)
        + " | GiB per 1M: "
        + " ".join(f"{n:>6}" for n in shown)
        + " | "
        + " ".join(f"{n:>{max(len(n), 6)}}" for n in names)
        + " | change"
    )
    for key in keys:
        previous = None
        for point in (p for p in measured if p.key == key):
            ratios = headline(point)
            change = f"{_change(previous, ratios):.1%}" if previous else ""
            print(
                f"{_where(point)} {point.num_inputs:>11,} "
                + " ".join(f"{format_bytes(f.hot_budget):>16}" for f in point.fae.values())
                + " | "
                + " " * 12
                + " ".join(f"{traffic_of(point).get(n, np.nan) * PER_MILLION:>6.3f}" for n in shown)
                + " | "
                + " ".join(f"{ratios[n]:>{max(len(n), 6)}.2f}" for n in names)
                + f" | {change}"
            )
            previous = ratios
    doubled = by_length.get(2 * default, {})
    changes = {
        key: _change(headline(p), headline(doubled[key]))
        for key, p in by_length[default].items()
        if key in doubled
    }
    if not changes:
        print(f"doubling: add {2 * default:,} to --convergence-lengths to check the default length")
        return
    within = [key for key, change in changes.items() if change <= 0.05]
    worst = max(changes, key=changes.get)
    print(
        f"doubling the default {default:,} inputs to {2 * default:,} moves every headline ratio by at most "
        f"5% at {len(within)} of {len(changes)} points; the most: {changes[worst]:.1%} at dim {worst[0]}, "
        f"{worst[1]} GPUs x {format_bytes(worst[2])}"
    )


def print_first_uses(stream: IdStream, warmup: int, lengths: list[int]) -> None:
    """Rows used for the first time in the stream, per counted input, at each length: the traffic no
    cache avoids, whose rate falls with the length."""
    _, first = np.unique(stream.rows(), return_index=True)
    first = stream.inputs[first]
    rates = [
        stream.sampling * np.count_nonzero((first >= warmup) & (first < warmup + n)) / n for n in lengths
    ]
    print(
        "rows used for the first time per counted input: "
        + ", ".join(f"{rate:.3f} at {n:,}" for rate, n in zip(rates, lengths, strict=True))
    )


def plot(points: list[Point], stream: IdStream, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    panels = sorted({(p.dim, p.world_size) for p in points})
    width = max(len(panels), 1)
    figures = (
        ("traffic.png", [("traffic", (*FAE, LEAST, "d"), "GiB per 1M inputs")]),
        (
            "step_time.png",
            [
                ("perf", (*FAE_STEPS, BEST, "c"), "step ms, TorchRec's perf model"),
                ("Gen4", (*FAE_STEPS, BEST, "c"), "step ms, PCIe Gen4"),
            ],
        ),
    )
    for name, rows in figures:
        fig, axes = plt.subplots(len(rows), width, figsize=(4.5 * width, 3.8 * len(rows)), squeeze=False)
        for row, (what, labels, unit) in zip(axes, rows, strict=True):
            for ax, (dim, world) in zip(row, panels, strict=False):
                mine = [p for p in points if (p.dim, p.world_size) == (dim, world)]
                caps = [p.hbm_cap / (1 << 30) for p in mine]
                for label in labels:
                    values = [_plotted(p, what).get(label, np.nan) for p in mine]
                    ax.plot(caps, [v or np.nan for v in values], marker="o", label=_LEGEND[label])  # log axis
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("HBM per GPU (GiB)")
                ax.set_ylabel(unit)
                ax.set_title(f"dim {dim}, {world} GPU{'s' if world > 1 else ''}")
            row[0].legend(fontsize=7)
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
    ax.plot(budgets / (1 << 20), measured, linestyle="--", label="measured on the replayed stream")
    ax.set_xscale("log")
    ax.set_xlabel("hot-row budget (MiB, dim 16)")
    ax.set_ylabel("hot-input share")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "hot_share.png", dpi=110)
    plt.close(fig)


#: TorchRec's best configuration at each point, in the step plots.
BEST = "TorchRec best"


def _plotted(p: Point, what: str) -> dict[str, float]:
    """What the plots show of a point: traffic (GiB per 1M inputs) or the steps by a model (ms), with
    TorchRec's least traffic and best step."""
    if what == "traffic":
        return {name: value * PER_MILLION for name, value in traffic_of(p).items()}
    steps = p.steps(what)
    return steps | {BEST: torchrec_best(steps)}


_LEGEND = {
    "FAE pp": "FAE, prefetch pipeline",
    "FAE hot": "FAE's hot rows, prefetch pipeline",
    "FAE la": "FAE's hot rows, look-ahead prefetch (priced)",
    "FAE": "FAE",
    LEAST: "TorchRec's least (its 18 configurations)",
    BEST: "TorchRec's best (its 18 configurations)",
    "c": "(c) all in HBM",
    "d": "(d) Belady, preloaded",
}


def grid_point(text: str) -> tuple[int, int, int]:
    """``dim:GPUs:HBM per GPU``, e.g. ``128:8:512MiB``."""
    dim, world, cap = text.split(":")
    return int(dim), int(world), parse_bytes(cap)


def add_dense_options(parser: argparse.ArgumentParser) -> None:
    """The options that price the dense part of a step (:func:`dense_ms`)."""
    parser.add_argument(
        "--gpu-tflops",
        type=positive_float,
        default=156.0,
        help="the GPU's peak for the dense part of a step (default: an A100's TF32 tensor cores, dense)",
    )
    parser.add_argument(
        "--dense-efficiency",
        type=fraction,
        default=0.3,
        help="the share of --gpu-tflops the dense part runs at (the MLPs and interaction of DLRM's reference "
        "configurations, forward and backward)",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, model = model_parser(argv, __doc__.split("\n")[0], default="dlrm")
    default = DEFAULTS[model]
    parser.add_argument(
        "--num-samples",
        type=positive_int,
        default=default["num_samples"],
        help="inputs counted after the warm-up (e.g. 16M)",
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=default["warmup"], help="inputs that warm the caches first"
    )
    if model == "dlrm":
        parser.add_argument(
            "--epoch",
            type=positive_int,
            default=KAGGLE_INPUTS,
            help=f"inputs of an epoch; the profile samples {100 * PROFILE_SAMPLE['dlrm']:.0f}%%",
        )
    else:
        add_taobao_arguments(parser, num_users=NUM_USERS, scale=1.0)
        parser.add_argument(
            "--holdout",
            type=positive_int,
            default="20k",
            help="the profile's holdout, out of the unsampled inputs",
        )
    parser.add_argument(
        "--convergence-lengths",
        type=positive_int,
        nargs="*",
        default=default["convergence_lengths"],
        help="inputs counted at the convergence points (twice --num-samples checks the default)",
    )
    parser.add_argument(
        "--convergence-points",
        type=grid_point,
        nargs="*",
        default=default["convergence_points"],
        help="dim:GPUs:HBM per GPU of the convergence table's points",
    )
    if model == "dlrm":
        parser.add_argument("--scale", type=float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--dims", type=int, nargs="+", default=default["dims"])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=default["world_sizes"])
    parser.add_argument("--caps", type=parse_bytes, nargs="+", default=default["caps"])
    parser.add_argument("--batch-size", type=int, default=default["batch_size"], help="per-GPU batch size")
    parser.add_argument(
        "--sampling", type=int, default=default["sampling"], help="replay 1/N of the rows (SHARDS)"
    )
    parser.add_argument(
        "--belady-sampling", type=int, default=default["sampling"], help="Belady replays 1/N of the rows"
    )
    parser.add_argument(
        "--knob-candidates", type=positive_int, default=4, help="hot budgets FAE's knob tries"
    )
    add_dense_options(parser)
    parser.add_argument(
        "--calibration",
        type=Path,
        help="price the steps also with a GPU's effective bandwidth and cache machinery cost, as "
        "benchmarks/bench_calibrate.py measures and writes them",
    )
    parser.add_argument(
        "--published",
        type=Path,
        help="price the steps also at the lowest and highest effective bandwidths fitted to TorchRec's "
        "published runs, as benchmarks/bench_published.py writes them (benchmarks/figures/published.json)",
    )
    parser.add_argument(
        "--points",
        type=Path,
        help=f"print the tables, decisions and sweeps of a run's {POINTS_FILE} instead of planning and "
        "replaying (to try other --gpu-tflops or --dense-efficiency)",
    )
    if model == "dlrm":
        parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/figures") / ("" if model == "dlrm" else model),
        help=f"where the figures and {POINTS_FILE} go (default: benchmarks/figures; TBSM's: its tbsm folder)",
    )
    args = parser.parse_args(argv)
    args.caps = [parse_bytes(c) if isinstance(c, str) else c for c in args.caps]
    args.convergence_lengths = [
        positive_int(x) if isinstance(x, str) else x for x in args.convergence_lengths
    ]
    args.convergence_points = [grid_point(x) if isinstance(x, str) else x for x in args.convergence_points]
    if args.belady_sampling % args.sampling:
        parser.error("--belady-sampling must be a multiple of --sampling")
    return args


def check_disjoint(stream: IdStream, args: argparse.Namespace) -> None:
    """Raise unless the profile read other inputs than the replay, and print what each read."""
    if stream.profile_overlaps():
        raise AssertionError("the profile reads inputs of the replayed stream")
    sampled, held = stream.stats.num_sampled, len(stream.stats.holdout)
    if args.model == "tbsm":
        trained = stream.stats.num_inputs
        print(
            f"{stream.num_inputs:,} inputs replayed (the first training inputs the profile did not read, in "
            f"training order); profile: {sampled:,} sampled inputs ({sampled / trained:.1%} of the "
            f"{trained:,} training inputs) and a holdout of {held:,} of the others: disjoint (checked)"
        )
        return
    replayed, profiled = stream.replayed, stream.profiled
    print(
        f"{stream.num_inputs:,} inputs replayed (data set inputs {replayed.start:,} to "
        f"{replayed.stop - 1:,}); profile: {sampled:,} sampled inputs ({sampled / args.epoch:.1%} of an "
        f"epoch of {args.epoch:,}) and a holdout of {held:,}, from inputs {profiled.start:,} to "
        f"{profiled.stop - 1:,}: disjoint (checked)"
    )


def open_data(args: argparse.Namespace) -> BlockSource:
    """The data ``--model`` reads: Criteo-like inputs over Kaggle's tables x ``--scale`` (only its
    table configs: ``synthetic_stream`` makes the inputs), or TBSM's source."""
    if args.model == "dlrm":
        return SyntheticCriteo(0, scale=args.scale)
    try:
        return open_taobao_source(args, args.batch_size)
    except ValueError as error:
        fail(str(error))


def replayed_stream(args: argparse.Namespace, source: BlockSource, num_inputs: int) -> IdStream:
    """The stream of ``num_inputs`` inputs replayed, with FAE's profile of others."""
    if args.model == "dlrm":
        return synthetic_stream(
            num_inputs, epoch=args.epoch, scale=args.scale, seed=args.seed, sampling=args.sampling
        )
    try:
        return taobao_stream(
            source, num_inputs, seed=args.seed, sampling=args.sampling, holdout_size=args.holdout
        )
    except ValueError as error:
        fail(f"{error}: shorten --warmup or the lengths, or raise --num-users")


def describe_data(args: argparse.Namespace, source: BlockSource) -> str:
    """What the counted inputs are, in words."""
    if args.model == "dlrm":
        return (
            f"synthetic inputs counted after a warm-up of {args.warmup:,} (Kaggle table sizes x {args.scale})"
        )
    return f"training inputs counted after a warm-up of {args.warmup:,} ({describe(args, source)})"


def print_models(points: list[Point], dense: dict[int, float], args: argparse.Namespace) -> None:
    """Every table of the grid's points: traffic, the steps by each model, FAE against TorchRec's best,
    the decision table and the sweeps (``dense``: the dense part's ms by embedding dimension), and the
    steps priced with ``--calibration`` and ``--published`` where given."""
    found = calibration(args)
    extra = [("calibrated", lambda p: found.terms(p.dim * ELEMENT_BYTES))] if found else []
    extra += [
        (f"published fit {gbps:.1f} GB/s", lambda p, g=gbps: Terms(bandwidth_share=g * 1e9 / PCIE["Gen4"]))
        for gbps in published_bandwidths(args)
    ]
    print_traffic(points)
    print_torchrec_grid(points)
    print_steps(points)
    print_decisions(points)
    print_decision_table(points, dense, extra)
    print_sweeps(points, dense)
    print_ceilings(points)
    print_extra(points, extra, found)


def calibration(args: argparse.Namespace) -> Calibration | None:
    """The ``--calibration`` file's figures, if one is given; a bad one exits with status 2 naming it."""
    if args.calibration is None:
        return None
    try:
        return Calibration.load(args.calibration)
    except ValueError as error:
        fail(f"--calibration {error}")


def published_bandwidths(args: argparse.Namespace) -> list[float]:
    """The lowest and highest effective bandwidths (GB/s) that reproduce TorchRec's published training
    runs (``--published``, as ``bench_published.py`` fits them; its eval run, on another config and
    another pipeline, left out), none without the option; a file that is not one exits with status 2
    naming it."""
    if args.published is None:
        return []
    try:
        saved = json.loads(args.published.read_text())
        training = {name for name, run in saved["runs"].items() if run["pipeline"] != "eval"}
        fitted = [
            float(c["fitted"]["gbps"])
            for c in saved["comparisons"]
            if c["variant"] in training and c["fitted"].get("gbps") is not None
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        fail(f"--published {args.published}: not a file written by bench_published.py ({error!r})")
    fitted = [gbps for gbps in fitted if np.isfinite(gbps) and gbps > 0]
    if not fitted:
        fail(f"--published {args.published}: no fitted bandwidth in it")
    return sorted({min(fitted), max(fitted)})


def load_points(path: Path) -> tuple[str, list[Point]]:
    """The model and points a run wrote to ``--out`` (``POINTS_FILE``); a missing or foreign file exits
    with status 2 naming it."""
    try:
        saved = json.loads(path.read_text())
        return saved["model"], [Point.from_dict(point) for point in saved["points"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        fail(f"--points {path}: not a {POINTS_FILE} written by bench_traffic.py ({error!r})")


def main(argv: list[str] | None = None) -> list[Point]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s", force=True)  # dry-run noise
    # its one error here is that its miss-rate curves are LRU's when it sizes LFU caches
    logging.getLogger("torchrec.distributed.planner.proposers").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
    logger.setLevel(logging.INFO)
    if args.points is not None:
        model, points = load_points(args.points)
        print_models(points, dense_ms(model, args, points), args)
        return points
    started = time.perf_counter()
    source = open_data(args)
    fixed = FixedPlans(source.table_configs, args.batch_size)
    grid_points = grid(args, fixed)
    lengths = {key: [args.num_samples] for key in grid_points}
    for key in args.convergence_points:
        if wanted := sorted({*lengths.get(key, []), *args.convergence_lengths}):
            lengths[key] = wanted
    longest = max(max(n) for n in lengths.values()) if lengths else args.num_samples
    stream = replayed_stream(args, source, args.warmup + longest)
    check_disjoint(stream, args)
    by_length: dict[int, dict[tuple, Point]] = {}
    for (dim, world_size, cap), wanted in lengths.items():
        try:
            measured = measure_point(stream, dim, world_size, cap, fixed, args, wanted)
        except PlannerError as error:
            logger.warning("dim %d, %d GPUs x %s: no plan: %s", dim, world_size, format_bytes(cap), error)
            continue
        for length, point in measured.items():
            by_length.setdefault(length, {})[point.key] = point
        where = f"dim {dim}, {world_size} GPUs x {format_bytes(cap)}"
        logger.info("%s: done at %.0f s", where, time.perf_counter() - started)
    points = [by_length[args.num_samples][k] for k in grid_points if k in by_length.get(args.num_samples, {})]
    plot(points, stream, args.out)
    saved = {"model": args.model, "points": [asdict(p) for p in points]}
    (args.out / POINTS_FILE).write_text(json.dumps(saved, indent=1))
    print(
        f"{args.num_samples:,} {describe_data(args, source)}, per-GPU batch {args.batch_size}, "
        f"replayed on 1/{args.sampling} of the rows "
        f"(Belady 1/{args.belady_sampling}); every cache, Belady's included, warms on the same inputs; (d) "
        "Belady holds the device memory TorchRec leaves for embeddings and starts the warm-up preloaded with "
        "the rows it serves best, as the plans' HBM rows are; TorchRec's scale-up configurations' caches "
        "have the sizes its scale-up proposer gives LRU caches, for LFU too (its only model)"
    )
    print_models(points, dense_ms(args.model, args, points), args)
    print_convergence(by_length, args.convergence_points, args.num_samples)
    print_first_uses(stream, args.warmup, sorted(by_length))
    print(f"figures in {args.out}; {time.perf_counter() - started:.0f} s")
    return points


if __name__ == "__main__":
    main()
