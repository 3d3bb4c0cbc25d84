"""The ``fae-torchrec`` command line: ``fae-torchrec profile ...`` and ``fae-torchrec plan ...``, with the
examples' defaults; ``plan --out`` writes a plan the examples train on (``--stats``, ``--plan``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from fae_torchrec.arguments import byte_size, fraction, non_negative_int, positive_int, unwritable_directory
from fae_torchrec.command_line import (
    CACHE_ALGORITHM_NAMES,
    OPTIMIZER_NAMES,
    HelpFormatter,
    add_data_arguments,
    add_taobao_arguments,
    model_chooser,
)
from fae_torchrec.defaults import DEFAULTS, add_val_every_argument
from fae_torchrec.logs import logger_level, torchrec_quiet
from fae_torchrec.threads import share_cores, usable_cores
from fae_torchrec.units import format_bytes, parse_bytes

if TYPE_CHECKING:  # torch, TorchRec and the planner are imported when a command runs, not for --help
    import torch
    from torchrec.distributed.planner.types import Topology
    from torchrec.distributed.types import CacheAlgorithm, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from fae_torchrec.stats.access_stats import AccessStats
    from fae_torchrec.stats.hot_set import HotSet
    from planner import FAEShardingPlanner
    from planner.report import FAEPlanReport

logger = logging.getLogger("fae_torchrec")

#: The ``fae-torchrec --help`` text (the module docstring carries reST markup).
DESCRIPTION = (
    "FAE's offline steps: profile a data set's accesses (profile), then plan it for this machine's devices "
    "or CUDA GPUs (plan)."
)
#: HBM per GPU of a dry run of CUDA GPUs on a machine without any.
DRY_RUN_HBM = "16GiB"
#: The embedding optimizers by CLI name ("none": weights only).
OPTIMIZERS = ("none", *OPTIMIZER_NAMES)


def _optimizer(name: str) -> type[torch.optim.Optimizer] | None:
    """The embedding optimizer class ``--optimizer`` names (None for ``none``); each row's state counted
    as TorchRec counts it."""
    from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS

    return None if name == "none" else EMBEDDING_OPTIMIZERS[name]


def _parser(argv: Sequence[str] | None) -> argparse.ArgumentParser:
    """The command line; ``profile`` takes the data options of the ``--model`` that ``argv`` names."""
    chooser, model = model_chooser(argv, default="dlrm")
    parser = argparse.ArgumentParser(
        prog="fae-torchrec", description=DESCRIPTION, formatter_class=HelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    profile = commands.add_parser(
        "profile",
        parents=[chooser],
        formatter_class=HelpFormatter,
        help="count row accesses on a sample, choose the hot set, estimate the hot-input share",
    )
    _add_profile_options(profile, model)
    plan = commands.add_parser(
        "plan",
        parents=[chooser],
        help="FAE's plan of this machine's devices (or a dry run of CUDA GPUs) beside TorchRec's plans",
        formatter_class=HelpFormatter,
    )
    _add_plan_options(plan, model)
    return parser


def _add_profile_options(profile: argparse.ArgumentParser, model: str) -> None:
    """``profile``'s options: the data of ``model``, the sample, the budget, the output."""
    defaults = DEFAULTS[model]  # the examples' too
    if model == "tbsm":
        add_taobao_arguments(profile, num_users=defaults.inputs, scale=defaults.scale)
    else:
        add_data_arguments(profile, num_samples=defaults.inputs, scale=defaults.scale)
        add_val_every_argument(profile)
    profile.add_argument("--dim", type=positive_int, default=defaults.dim, help="embedding dimension")
    profile.add_argument(
        "--sample",
        type=fraction,
        default=defaults.sample,
        help=f"fraction of training inputs counted (default {defaults.sample}, FAE's for {model})",
    )
    profile.add_argument("--sample-seed", type=non_negative_int, default=0, help="seed of the sample's draws")
    profile.add_argument(
        "--holdout", type=non_negative_int, default=100_000, help="inputs kept for estimates"
    )
    profile.add_argument(
        "--budget", type=byte_size, default=defaults.budget, help="hot-row budget, e.g. 256MiB"
    )
    profile.add_argument(
        "--optimizer", choices=sorted(OPTIMIZERS), default=defaults.optimizer,
        help="whose row state the budget holds",
    )  # fmt: skip
    profile.add_argument(
        "--batch-size",
        type=positive_int,
        default=defaults.batch_size,
        help="per-rank batch size (inputs read at a time)",
    )
    profile.add_argument("--out", default="stats.npz", help="statistics file; PNGs go beside it")


def _add_plan_options(plan: argparse.ArgumentParser, model: str) -> None:
    """``plan``'s options: the statistics, the devices, the budget and its knob, the caches, the output."""
    defaults = DEFAULTS[model]
    plan.add_argument("--stats", required=True, help="statistics file written by `profile`")
    plan.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        help="what to plan: cuda GPUs or the cpu (default: this machine's GPUs, else its CPU as one rank, "
        "as the examples train here; cuda when --world-size or --hbm-cap is given, a dry run on any machine)",
    )
    plan.add_argument(
        "--world-size",
        type=positive_int,
        help="ranks (default: this machine's GPUs, else 1)",
    )
    plan.add_argument(
        "--local-world-size",
        type=positive_int,
        help="ranks per host, as torchrun's LOCAL_WORLD_SIZE: TorchRec prices the links within a host and "
        "across hosts apart (default: every rank on one host)",
    )
    plan.add_argument(
        "--hbm-cap",
        type=byte_size,
        help=f"HBM per GPU (default: this machine's GPU memory, {DRY_RUN_HBM} in a dry run)",
    )
    plan.add_argument(
        "--batch-size", type=positive_int, default=defaults.batch_size, help="per-rank batch size"
    )
    plan.add_argument("--dim", type=positive_int, help="embedding dimension (default: the stats file's)")
    plan.add_argument(
        "--budget",
        type=byte_size,
        help="fix the hot-row budget instead of letting the knob choose (on --device cpu, which has no HBM "
        f"whose time the knob could price, default: the examples' {defaults.budget})",
    )
    _add_cache_options(plan, defaults.optimizer)


def _add_cache_options(plan: argparse.ArgumentParser, optimizer: str) -> None:
    """``plan``'s options of the knob's search, the optimizer state, the UVM caches and the output."""
    plan.add_argument("--candidates", type=positive_int, default=6, help="budgets the knob tries")
    cores = len(usable_cores())
    plan.add_argument(
        "--processes",
        type=positive_int,
        default=cores,
        help=f"budgets the knob plans at once, each in a forked worker process (default: the {cores} cores "
        "this process may use; 1 plans them one after another here)",
    )
    plan.add_argument(
        "--optimizer", choices=sorted(OPTIMIZERS), default=optimizer, help="whose row state the plan holds",
    )  # fmt: skip
    plan.add_argument(
        "--cache-algorithm",
        choices=CACHE_ALGORITHM_NAMES,
        default="lru",
        help="replacement policy of the UVM caches (FBGEMM pipelines prefetches of LRU caches only)",
    )
    plan.add_argument(
        "--prefetch-pipeline",
        action=argparse.BooleanOptionalAction,
        help="plan every UVM cache for TorchRec's prefetch pipeline (PrefetchTrainPipelineSparseDist, "
        "FAEPrefetchTrainPipeline), as TorchRec's strongest offload; --no-prefetch-pipeline for the other "
        "train pipelines (default: with LRU caches, which FBGEMM pipelines, and not with LFU ones)",
    )
    plan.add_argument(
        "--out",
        metavar="FILE",
        help="write the plan to FILE: the examples train on it with --stats STATS --plan FILE",
    )


#: What ``profile``'s two shares count: they differ by far (every id of an input must be hot for it to be).
PROFILE_LEGEND = (
    "hot accesses: the share of the sampled accesses (ids looked up) that fall on hot rows; "
    "hot-input share: the estimated share of inputs whose every id is hot (they train in hot steps)"
)


def _table_report(stats: AccessStats, hot_set: HotSet, optimizer: type | None) -> str:
    """Per table: rows, hot rows, their bytes and the share of the sampled accesses they take."""
    row_bytes = stats.layout.row_bytes(optimizer)
    width = max(12, *(len(config.name) + 2 for config in stats.tables))  # a schema's names may be long
    lines = [f"{'table':<{width}}{'rows':>12}{'hot rows':>12}{'hot bytes':>12}{'hot accesses':>18}"]
    total_hot = total_covered = 0
    for t, (config, ids, size) in enumerate(zip(stats.tables, hot_set.hot_ids, row_bytes, strict=True)):
        counts = stats.seen_counts[t]
        covered = int(counts[hot_set.is_hot(t, stats.seen_rows[t])].sum())
        share = covered / counts.sum() if counts.sum() else float("nan")
        total_hot += len(ids)
        total_covered += covered
        lines.append(
            f"{config.name:<{width}}{config.num_embeddings:>12,}{len(ids):>12,}"
            f"{format_bytes(len(ids) * size):>12}{100 * share:>17.2f}%"
        )
    all_rows = int(stats.layout.num_rows.sum())
    all_accesses = int(stats.table_accesses().sum())
    lines.append(
        f"{'total':<{width}}{all_rows:>12,}{total_hot:>12,}"
        f"{format_bytes(hot_set.hot_bytes(optimizer)):>12}"
        f"{100 * total_covered / all_accesses:>17.2f}%"
    )
    lines.append(PROFILE_LEGEND)
    return "\n".join(lines)


def profile(args: argparse.Namespace) -> None:
    import numpy as np

    from fae_torchrec.stats.hot_set import EVERYTHING_HOT
    from fae_torchrec.stats.hot_share import estimate_hot_share, hot_share_curve
    from fae_torchrec.stats.plots import plot_access_cdf, plot_hot_share
    from fae_torchrec.stats.profiler import AccessProfiler

    budget = parse_bytes(args.budget)
    optimizer = _optimizer(args.optimizer)
    _check_out_file(args.out)
    tables, batches, total = _profiled_batches(args)
    profiler = AccessProfiler(tables, args.sample, args.sample_seed, args.holdout)
    stats = profiler.profile(batches, total=total, progress=True)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    stats.save(args.out)
    ranking = stats.ranking(optimizer)
    hot_set = ranking.hot_set(budget)
    print(
        f"profiled {stats.num_sampled:,} of {stats.num_inputs:,} inputs; "
        f"budget {format_bytes(budget)} ({args.optimizer}, dim {args.dim}); "
        f"all tables {format_bytes(ranking.total_bytes)}"
    )
    print(_table_report(stats, hot_set, optimizer))
    stem = os.path.splitext(args.out)[0]
    written = [args.out, f"{stem}_access_cdf.png"]
    plot_access_cdf(stats, written[-1])
    everything_hot = hot_set.holds_every_row
    if len(stats.holdout):
        share = estimate_hot_share(stats, hot_set)
        everything_hot = everything_hot or share.share == 1.0
        print(f"estimated hot-input share: {share}")
        smallest = max(int(ranking.cumulative_bytes[0]), 1) if len(ranking.rows) else 1
        budgets = np.unique(np.geomspace(smallest, ranking.total_bytes, 48).astype(np.int64))
        written.append(f"{stem}_hot_share.png")
        plot_hot_share(hot_share_curve(ranking, budgets), written[-1], budget)
    else:
        print("estimated hot-input share: n/a (no holdout inputs: --holdout 0 or --sample 1)")
    if everything_hot:
        logger.warning(EVERYTHING_HOT, f"the tables' {format_bytes(ranking.total_bytes)}")
    print(f"wrote {', '.join(written)}")


def _profiled_batches(args: argparse.Namespace) -> tuple[list[EmbeddingBagConfig], Iterable, int | None]:
    """The tables, the batches ``profile`` reads and about how many there are (None when unknown): the
    training inputs as the examples hold them out, every ``--val-every``-th input of Criteo-layout data
    left out (as ``train_dlrm_fae.py`` leaves it out), TBSM's validation users of Taobao-layout data (as
    ``train_tbsm_fae.py``)."""
    from fae_torchrec.recipes.sources import open_source, open_taobao_source

    if args.model == "tbsm":
        source = open_taobao_source(args, args.batch_size)
        blocks = source.split_blocks(validation=False, every=None, block_size=args.batch_size)
        batches = (block.to_batch(source.feature_names) for block in blocks)
        return source.table_configs(args.dim), batches, source.num_train
    data = open_source(args, args.batch_size)[0]
    blocks = data.split_blocks(validation=False, every=args.val_every, block_size=args.batch_size)
    batches = (block.to_batch(data.feature_names) for block in blocks)
    inputs = getattr(data, "num_samples", None)  # known before reading: synthetic data, npy files
    return (
        data.table_configs(args.dim),
        batches,
        None if inputs is None else inputs - inputs // args.val_every,
    )


def _check_out_file(out: str, example: str = "stats.npz") -> None:
    """Raise ``ValueError`` naming ``--out`` unless a file can be written there (checked before the
    data is read or planned); ``example``: a file name to suggest for a directory."""
    if os.path.isdir(out):
        raise ValueError(f"--out {out}: is a directory; give a file path, e.g. {os.path.join(out, example)}")
    problem = unwritable_directory(os.path.dirname(os.path.abspath(out)))
    if problem is not None:
        raise ValueError(f"--out {out}: {problem}")


def plan(args: argparse.Namespace) -> None:
    from torchrec.distributed.types import CacheAlgorithm

    from fae_torchrec.stats.access_stats import AccessStats
    from planner.plan_file import PlanFile, file_digest
    from planner.topology import local_devices, make_topology

    device, world, hbm_cap = _planned_devices(args, local_devices())
    if args.out is not None:
        _check_out_file(args.out, "plan.pt")
    try:
        topology = make_topology(world, device, hbm_cap, args.local_world_size)
    except ValueError as error:
        local = f" --local-world-size {args.local_world_size}" if args.local_world_size else ""
        raise ValueError(f"--world-size {world}{local}: {error}") from error
    stats = AccessStats.load(args.stats)
    if args.dim is not None:
        stats = stats.with_embedding_dim(args.dim)
    algorithm = CacheAlgorithm[args.cache_algorithm.upper()]
    if args.prefetch_pipeline is None:
        args.prefetch_pipeline = algorithm == CacheAlgorithm.LRU
    elif args.prefetch_pipeline and algorithm != CacheAlgorithm.LRU:
        raise ValueError(
            f"--cache-algorithm {args.cache_algorithm} --prefetch-pipeline: FBGEMM pipelines the prefetches "
            "of LRU caches only; use --no-prefetch-pipeline or --cache-algorithm lru"
        )
    if args.budget is None and device == "cpu":  # every budget prices alike: the knob would choose on noise
        args.budget = DEFAULTS[args.model].budget
        logger.info("--device cpu: the hot-row budget is the examples' --budget %s", args.budget)
    devices = f"{world} x {device.upper()}" + (f", HBM {format_bytes(hbm_cap)} per GPU" if hbm_cap else "")
    where = f"--device {device} --world-size {world}" + (
        f" --hbm-cap {format_bytes(hbm_cap)}" if hbm_cap else ""
    )
    planner, hot_set, sharding_plan = _plan_fae(args, topology, stats, algorithm, devices, where)
    assert planner.report is not None  # its plan's
    _print_torchrec_plans(args, device, topology, stats, algorithm, planner.report)
    if args.out is not None:
        made_for = {
            "device": device,
            "world_size": world,
            "tables": stats.layout.describe(),
            "dim": stats.tables[0].embedding_dim,
            "optimizer": args.optimizer,
            "stats": file_digest(args.stats),
            "hot_set": hot_set.digest,
            "hot_bytes": hot_set.hot_bytes(_optimizer(args.optimizer)),
            "hot_rows": hot_set.total_hot,
            "batch_size": args.batch_size,
            "hbm_cap": hbm_cap,
            "prefetch_pipeline": args.prefetch_pipeline,
            "cache_algorithm": args.cache_algorithm,
            "stats_file": os.path.abspath(args.stats),
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        PlanFile(sharding_plan, made_for).save(args.out)
        print(f"wrote {args.out}; train on it with --stats {args.stats} --plan {args.out}")


def _plan_fae(
    args: argparse.Namespace,
    topology: Topology,
    stats: AccessStats,
    algorithm: CacheAlgorithm,
    devices: str,
    where: str,
) -> tuple[FAEShardingPlanner, HotSet, ShardingPlan]:
    """FAE's planner of ``args``' options, the hot set its knob chose and its plan, printed (``devices``
    and ``where`` name what was planned, the latter in a ``PlannerError``)."""
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.distributed.types import CacheParams

    from planner import FAEShardingPlanner

    start = time.perf_counter()
    try:
        planner = FAEShardingPlanner(
            topology,
            stats,
            batch_size=args.batch_size,
            hot_budget_bytes=None if args.budget is None else parse_bytes(args.budget),
            optimizer_class=_optimizer(args.optimizer),
            num_candidates=args.candidates,
            processes=args.processes,
            cache_params=CacheParams(algorithm=algorithm, prefetch_pipeline=args.prefetch_pipeline),
        )
    except ValueError as error:
        raise ValueError(f"--stats {args.stats}: {error}") from error
    try:
        # the knob logs each budget it tries as it goes: its search takes minutes at 128 GPUs
        with logger_level("planner", logging.INFO):
            hot_set = planner.choose_hot_set()
        if not hot_set.total_hot:
            logger.warning(
                "the plan keeps no hot row: a run on it trains cold steps only (FAE then is TorchRec alone); "
                "give --budget to keep some"
            )
        sharding_plan = planner.plan(planner.meta_module(hot_set), get_default_sharders())
    except PlannerError as error:
        raise PlannerError(f"{where}: {error}", error.error_type) from error
    seconds = time.perf_counter() - start
    runs = planner.torchrec_runs
    model = format_bytes(stats.ranking(_optimizer(args.optimizer)).total_bytes)
    print(
        f"{devices}, batch {args.batch_size} per rank, {args.optimizer}, model {model}; FAE planning took "
        f"{seconds:.1f} s in {args.processes} process(es), {len(runs)} runs of TorchRec's planner taking "
        f"{sum(runs):.1f} s together"
    )
    print(planner.report)
    return planner, hot_set, sharding_plan


def _print_torchrec_plans(
    args: argparse.Namespace,
    device: str,
    topology: Topology,
    stats: AccessStats,
    algorithm: CacheAlgorithm,
    fae: FAEPlanReport,
) -> None:
    """TorchRec's plans of the unsplit tables, with the same optimizer state, beside FAE's (``fae``): each
    configuration's predicted step, and the best one's over FAE's (a CPU has no cache to configure)."""
    from torchrec.distributed.planner.types import PlannerError

    from planner.baseline import plan_configs
    from planner.torchrec_configs import TorchRecConfig, torchrec_configs

    configs = torchrec_configs(args.prefetch_pipeline, algorithm) if device == "cuda" else [TorchRecConfig()]
    steps = {}
    optimizer = _optimizer(args.optimizer)
    for config, result in plan_configs(
        configs, topology, stats, args.batch_size, optimizer, progress=True
    ).items():
        if isinstance(result, PlannerError):
            print(f"TorchRec {config.name}: none fits")
            continue
        steps[config.name] = result.totals.step
        print(
            f"TorchRec {config.name}: predicted step {result.totals.step:.3f} ms; kernels "
            f"{dict(sorted(result.kernels.items()))}; max HBM per rank {format_bytes(max(result.totals.hbm))}"
        )
    if steps:
        best = min(steps, key=steps.__getitem__)
        ratio = steps[best] / fae.step
        print(f"predicted step ratio, TorchRec's best ({best}) / FAE: {ratio:.2f}x ({_whose(fae)})")


def _planned_devices(
    args: argparse.Namespace, local: tuple[str, int, int | None]
) -> tuple[str, int, int | None]:
    """The device type, world size and HBM per GPU (None on a CPU) that ``plan`` plans, ``local`` being
    this machine's (``planner.topology.local_devices``): by default this machine's devices; with
    ``--world-size`` or ``--hbm-cap`` on a machine without GPUs, a dry run of CUDA GPUs unless
    ``--device cpu`` says otherwise."""
    here, count, memory = local
    dry_run = args.world_size is not None or args.hbm_cap is not None
    device = args.device or ("cuda" if dry_run else here)
    world = args.world_size or (count if device == here else 1)
    if device == "cpu":
        if args.hbm_cap is not None:
            logger.warning("--hbm-cap %s ignored: --device cpu has no HBM to cap", args.hbm_cap)
        return device, world, None
    if args.hbm_cap is not None:
        return device, world, parse_bytes(args.hbm_cap)
    return device, world, memory if here == "cuda" else parse_bytes(DRY_RUN_HBM)


def _whose(report: FAEPlanReport) -> str:
    """Whose plan FAE's is: a gain is FAE's only where it keeps hot rows."""
    if report.hot_budget_bytes:
        return "FAE's hot rows"
    if report.torchrec_config:
        return f"no hot rows: the planner chose TorchRec's '{report.torchrec_config}', not FAE's gain"
    return "no hot rows: FAE's cold caches, not FAE's gain"


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    args = _parser(argv).parse_args(argv)
    from torchrec.distributed.planner.types import PlannerError  # after --help, which needs no torch

    threads = share_cores()
    if threads:
        logger.info("%s", threads)
    try:
        with torchrec_quiet():
            {"profile": profile, "plan": plan}[args.command](args)
    except (ValueError, OSError, PlannerError) as error:
        logger.error("%s", error)
        sys.exit(2)
    except MemoryError as error:
        logger.error("out of memory: %s (tables too large for this machine? see --tables, --scale)", error)
        sys.exit(2)


if __name__ == "__main__":
    main()
