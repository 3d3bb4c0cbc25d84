"""A run of the training recipe made ready to train: the process group, the prepared data, the planned and
sharded model, its optimizers and router."""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams, ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer

from fae_torchrec.collectives import on_rank_zero
from fae_torchrec.command_line import ColdTier, Pipeline
from fae_torchrec.modules import FAEEmbeddingBagCollection, load_initial_tables
from fae_torchrec.recipes.config import RecipeConfig, required
from fae_torchrec.recipes.family import ModelFamily
from fae_torchrec.recipes.options import order_seed
from fae_torchrec.recipes.slots import SlotLayout, SlotSizing, slot_sizing
from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.hot_set import EVERYTHING_HOT, HotSet
from fae_torchrec.stats.hot_share import estimate_hot_share
from fae_torchrec.tables import TableLayout
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.evaluation import repeated_inputs
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS, EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.prepare import NAMED_PARAMETERS, PreparedData, prepare_data
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.step import find_fae_module
from fae_torchrec.units import format_bytes, parse_bytes
from planner import FAEShardingPlanner
from planner.baseline import default_planner, hbm_planner, scaleup_planner
from planner.plan_file import PlanFile, file_digest
from planner.topology import links_gibps, make_topology

logger = logging.getLogger("fae_torchrec.recipes")
#: The share of validation inputs repeating training inputs from which a run warns (a public "Avazu
#: sample", 499 rows repeated 6 times, gave AUC 0.99).
REPEATS_WARNING = 0.05
#: ``prepare_data``'s parameters by the options that set them, for its messages.
_OPTIONS = {key: f"--{key.replace('_', '-')}" for key in NAMED_PARAMETERS}


def init_distributed() -> tuple[int, int, torch.device]:
    """Join torchrun's process group, or make a group of one for a plain ``python`` run; the rank, the
    world size and this rank's device."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = Path(tempfile.mkdtemp()) / "store"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:  # torchrun numbers the ranks of a host from 0 (LOCAL_RANK)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        return rank, world, torch.device("cuda", torch.cuda.current_device())
    return rank, world, torch.device("cpu")


@dataclass
class Training:
    """A run ready to train (:func:`build_training`): its config, data, plan, sharded model, dense
    optimizer and router, the first step's batches not yet read."""

    #: The run's options, those the device or a plan file decide filled in (the pipeline, a planned cold
    #: tier's copies ahead, a plan's hot budget): what the steps after the build read.
    config: RecipeConfig
    mode: str
    tables: list[EmbeddingBagConfig]
    data: PreparedData
    plan: ShardingPlan
    model: DistributedModelParallel
    optimizer: torch.optim.Optimizer
    router: BatchRouter
    fae: bool
    #: The statistics the plan was made from (the profile's, or a re-plan's recent counts).
    stats: AccessStats
    #: The planned cold tier (``--cold-tier planned``), else None.
    cold_tier: PlannedColdTier | None = None
    #: Its slots and the copies the plan priced, else None.
    slots: SlotLayout | None = None


#: The file in a re-plan's folder of the split module's plan, where only the rows that change part moved.
REPLAN_PLAN = "plan.pt"
#: The file in a re-plan's folder of its hot set (each table's hot ids).
REPLAN_HOT_SET = "hot_set.npz"


@dataclass(frozen=True)
class Replanned:
    """A re-plan to resume from: its folder (``stats.npz``, the recent counts that planned it, and its
    partitions) and the partition the saved router read (``partition``: the rest of the re-plan's
    epoch; ``full``: every input, for the epochs after it)."""

    folder: Path
    partition: str

    def hot_set(self, tables: list[EmbeddingBagConfig]) -> HotSet:
        """The re-plan's hot set, of ``tables``."""
        with np.load(self.folder / REPLAN_HOT_SET) as saved:
            return HotSet(tuple(tables), tuple(saved[f"arr_{t}"] for t in range(len(tables))))

    def plan_file(self) -> PlanFile | None:
        """The plan of the split module a re-plan that moved only the rows that change part sharded
        (its cold part kept the plan it had; None: the re-plan made the whole model anew)."""
        path = self.folder / REPLAN_PLAN
        return PlanFile(torch.load(path, weights_only=False), {}) if path.is_file() else None


def prepare(
    args: RecipeConfig,
    family: ModelFamily,
    plan_file: PlanFile | None = None,
    device: torch.device | None = None,
) -> tuple[list[EmbeddingBagConfig], PreparedData]:
    """The tables of ``args``' data and the data prepared for them (collective, :func:`prepare_data`):
    FAE's partition, or the baseline's, all cold, in ``--out``, profiled here or, with ``--stats``, the
    hot set chosen from its statistics (with ``plan_file``, the one the plan was made for, checked against
    it and the run on this rank's ``device`` before anything is written); the statistics saved there
    too."""
    source = family.open_source(args)
    tables = source.table_configs(args.dim)
    out = Path(args.out)
    directory = out / f"partition-{'baseline' if args.baseline else 'fae'}"
    stats = on_rank_zero(lambda: _load_stats(args, tables, plan_file, device)) if args.stats else None
    budget = parse_bytes(args.budget)  # with --plan, the plan's (_plan_file)
    data = prepare_data(
        source, tables, directory, sample=args.sample, batch_size=args.batch_size,
        hot_budget=None if args.baseline else budget, optimizer_class=EMBEDDING_OPTIMIZERS[args.optimizer],
        stats=stats, val_every=family.val_every(args), balance=args.balance, seed=args.seed,
        exclude_profiled=args.exclude_profiled,
        names={"data": f"--data {' '.join(args.data)}", **_OPTIONS, "stats": f"--stats {args.stats}"},
        progress=True,
    )  # fmt: skip
    if not (args.stats and Path(args.stats).resolve() == (out / "stats.npz").resolve()):
        on_rank_zero(lambda: data.stats.save(out / "stats.npz"))  # a failure ends every rank's run
    if not dist.is_initialized() or dist.get_rank() == 0:
        _describe(args, directory, data)
    return tables, data


def _load_stats(
    args: RecipeConfig,
    tables: list[EmbeddingBagConfig],
    plan_file: PlanFile | None,
    device: torch.device | None,
) -> AccessStats:
    """``--stats``' statistics for ``tables`` at ``--dim``; with ``plan_file``, the plan checked against
    the run (on ``device``) and its hot set against the one these statistics give for the plan's budget.
    Raises ``ValueError`` naming the option when the statistics are of other tables."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    run = {"world_size": world, "dim": args.dim, "tables": TableLayout.of(tables).describe()}
    stats_file = required(args.stats, "--stats")
    if plan_file is not None:
        where = "cpu" if device is None else device.type
        run |= {"device": where, "optimizer": args.optimizer, "stats": file_digest(stats_file)}
        _check_plan(args, plan_file, run)
    try:  # counted at any dim: the counts do not depend on it
        stats = AccessStats.load(stats_file).with_embedding_dim(args.dim)
    except (ValueError, OSError) as error:
        raise ValueError(f"--stats {args.stats}: {getattr(error, 'strerror', None) or error}") from error
    stats = stats.for_tables(tables, f"--stats {args.stats}")
    if plan_file is not None:
        hot_set = stats.hot_set(plan_file.made_for["hot_bytes"], EMBEDDING_OPTIMIZERS[args.optimizer])
        _check_plan(args, plan_file, {"hot_set": hot_set.digest})
    return stats


def _describe(args: RecipeConfig, folder: Path, data: PreparedData) -> None:
    """Log what ``prepare`` wrote and what to watch in it: the partition's size on disk, a budget that
    makes every input hot or none, and validation inputs that repeat training inputs (rank 0's part)."""
    logger.info("wrote the partition %s (%s on disk)", folder, format_bytes(disk_bytes(folder)))
    if not args.baseline:
        _check_hot_share(args, data)
    if data.validation is None:
        return
    repeats = repeated_inputs(data.validation, data.partition)
    share = repeats / len(data.validation)
    log = logger.warning if share >= REPEATS_WARNING else logger.info
    log(
        "%d of %d validation inputs (%.1f%%) repeat a training input's features (ids and dense values)%s",
        repeats, len(data.validation), 100 * share,
        ": the validation AUC then measures memory as much as generalisation; deduplicate the data or "
        "hold out by time" if share >= REPEATS_WARNING else "",
    )  # fmt: skip


def _check_hot_share(args: RecipeConfig, data: PreparedData) -> None:
    """Warn where the partition makes FAE pointless (every input hot, or none) or, with ``--stats``, holds
    far fewer hot inputs than the statistics expect (statistics of other data, which their count of
    inputs alone does not tell)."""
    hot_bytes = format_bytes(data.hot_set.hot_bytes(EMBEDDING_OPTIMIZERS[args.optimizer]))
    hot, cold = len(data.partition.hot), len(data.partition.cold)
    share = hot / (hot + cold)
    if data.hot_set.holds_every_row or not cold:
        logger.warning(EVERYTHING_HOT, f"the hot set's {hot_bytes}")
    elif not hot:
        stats_hint = f" or check that --stats {args.stats} is of --data" if args.stats else ""
        logger.warning(
            "no training input is entirely hot with the hot set of %s: FAE trains cold steps only, as "
            "TorchRec alone would; raise --budget%s", hot_bytes, stats_hint,
        )  # fmt: skip
    elif args.stats and share < (expected := estimate_hot_share(data.stats, data.hot_set)).low / 2:
        logger.warning(
            "--stats %s expects %s of the inputs entirely hot, the partition of --data has %.2f%%: are the "
            "statistics of this data?", args.stats, expected, 100 * share,
        )  # fmt: skip


def disk_bytes(folder: Path) -> int:
    """The bytes of the files in ``folder`` (not its subfolders)."""
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def build_training(
    args: RecipeConfig,
    rank: int,
    world: int,
    device: torch.device,
    family: ModelFamily,
    replanned: Replanned | None = None,
    saved_slots: SlotLayout | None = None,
) -> Training:
    """Prepare the data (:func:`prepare`), build and plan the model of ``args`` (FAE's, or the baseline's
    with ``--baseline``), shard it with DMP in its initial state and make its router. ``replanned``: a
    resumed run's last re-plan, whose hot set, statistics and partition replace the profile's;
    ``saved_slots``: a resumed run's planned cold tier's slots and their copies (the planner plans them
    alike)."""
    args = _resolve_device_options(args, device)
    plan_file = None
    if args.plan:
        plan_file = _plan_file(args, device)
        # what the hot set and a re-plan's are sized by from here on
        args = replace(args, budget=f"{plan_file.made_for['hot_bytes']}B")
    tables, data = prepare(args, family, plan_file, device)
    stats, partition, hot_set = data.stats, data.partition, None if args.baseline else data.hot_set
    if replanned is not None:
        stats = AccessStats.load(replanned.folder / "stats.npz", tables)
        partition = HotColdPartition.open(replanned.folder / replanned.partition)
        hot_set = replanned.hot_set(tables)
    # a resumed re-plan's hot set is not the plan's: planned again as the re-plan was, or sharded as the
    # re-plan's rows moved (the cold part's plan kept)
    plan_file = plan_file if replanned is None else replanned.plan_file()
    warmup = args.warmup if replanned is None else 0.0
    sizing = None
    if hot_set is not None and args.cold_tier == ColdTier.PLANNED:
        # a resumed run's slots as the run that saved sized them (its --epochs may differ)
        sizing = slot_sizing(args, [partition], data.validation, hot_set, world, warmup, saved_slots)
    plan, dmp, dense, slots = shard_model(
        args, family, tables, data.num_dense, stats, hot_set, world, device, plan_file, sizing
    )
    # the same initial tables on every rank and in both layouts, made a block at a time in the shards
    load_initial_tables(dmp.module.get_submodule(family.sparse_path), tables, args.seed)
    cold_tier = None
    if sizing is not None:
        cold_tier = PlannedColdTier(dmp, ahead=args.chosen_copy_ahead)
        cold_tier.load_initial_tables(tables, args.seed)
    router = make_router(args, partition, world, rank, dmp, warmup=warmup, cold_tier=cold_tier)
    mode = args.baseline or "fae"
    num_train = len(partition.hot) + len(partition.cold)
    assert data.validation is not None  # the recipe always holds some inputs out (--val-every, TBSM's split)
    logger.info(
        "%s: %d training inputs (%d hot, %.1f%%), %d validation inputs, %d ranks",
        mode, num_train, len(partition.hot), 100 * len(partition.hot) / num_train, len(data.validation),
        world,
    )  # fmt: skip
    return Training(
        args, mode, tables, data, plan, dmp, dense, router, hot_set is not None, stats, cold_tier, slots
    )


def _resolve_device_options(args: RecipeConfig, device: torch.device) -> RecipeConfig:
    """Refuse the options ``device`` cannot run; ``args`` with those whose default depends on it filled:
    the pipeline (prefetch on CUDA, where a cache can be prefetched into) and a planned cold tier's
    copies ahead (1 on CUDA; nothing runs beside a step on CPU)."""
    if args.optimizer == "adam" and device.type == "cpu":
        raise ValueError(
            "--optimizer adam: FBGEMM has no fused Adam on CPU; use it on GPU, or another optimizer"
        )
    if args.pipeline == Pipeline.PREFETCH and device.type != "cuda":
        raise ValueError(
            "--pipeline prefetch: TorchRec's prefetch pipeline runs on CUDA only; use --pipeline sparse here"
        )
    prefetching = device.type == "cuda" and args.cold_tier != ColdTier.PLANNED  # a planned tier has no cache
    if args.hbm_cap is not None and device.type == "cpu":
        logger.warning("--hbm-cap %s ignored: there is no device memory to cap on CPU", args.hbm_cap)
    copy_ahead = args.copy_ahead
    if args.cold_tier == ColdTier.PLANNED and copy_ahead is None:
        copy_ahead = int(device.type == "cuda")
    return replace(
        args,
        pipeline=args.pipeline or (Pipeline.PREFETCH if prefetching else Pipeline.SPARSE),
        copy_ahead=copy_ahead,
    )


def shard_model(
    args: RecipeConfig,
    family: ModelFamily,
    tables: list[EmbeddingBagConfig],
    num_dense: int,
    stats: AccessStats,
    hot_set: HotSet | None,
    world: int,
    device: torch.device,
    plan_file: PlanFile | None = None,
    slot_sizing: SlotSizing | None = None,
) -> tuple[ShardingPlan, DistributedModelParallel, CombinedOptimizer, SlotLayout | None]:
    """``args``' model of ``tables`` and ``num_dense`` dense features, split by ``hot_set`` (None: the
    baseline's, unsplit), planned from ``stats`` (or
    with ``plan_file``'s plan, made for ``hot_set``) and sharded by DMP with its tables not yet set, and
    its unfused optimizer (collective). With ``slot_sizing`` its cold part is a planned cold tier's slot
    tables, sized within the planner's budget for them (``cold_slot_budget``) and planned with their
    copies priced; their ``SlotLayout`` is returned too (else None)."""
    torch.manual_seed(args.seed)  # the same dense layers on every rank
    plan, model, layout = plan_model(
        args, family, tables, num_dense, stats, hot_set, world, device, plan_file, slot_sizing
    )
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=get_default_sharders())
    return plan, dmp, unfused_of(args)(dmp), layout


def unfused_of(args: RecipeConfig) -> Callable[[nn.Module], CombinedOptimizer]:
    """What makes a sharded model's unfused optimizer: data-parallel tables by the embedding optimizer's
    dense form, the dense layers by Adagrad."""
    return lambda dmp: unfused_optimizer(
        dmp, embedding_optimizer(args), lambda params: torch.optim.Adagrad(params, lr=args.dense_lr)
    )


def plan_model(
    args: RecipeConfig,
    family: ModelFamily,
    tables: list[EmbeddingBagConfig],
    num_dense: int,
    stats: AccessStats,
    hot_set: HotSet | None,
    world: int,
    device: torch.device,
    plan_file: PlanFile | None = None,
    slot_sizing: SlotSizing | None = None,
    cold_tables: Collection[str] | None = None,
) -> tuple[ShardingPlan, nn.Module, SlotLayout | None]:
    """The plan of :func:`shard_model`'s model (collective), the model on the meta device, and its
    ``SlotLayout`` (None without ``slot_sizing``); ``cold_tables``: the tables of the split module's cold
    part (``FAEEmbeddingBagCollection``)."""
    mode = args.baseline or "fae"
    hbm_cap = parse_bytes(args.hbm_cap) if args.hbm_cap is not None and device.type != "cpu" else None
    planner = None
    if plan_file is None:
        planner = _planner(
            mode, world, device, hbm_cap, stats, args.batch_size, parse_bytes(args.budget),
            args.pipeline == Pipeline.PREFETCH, optimizer_class=EMBEDDING_OPTIMIZERS[args.optimizer],
        )  # fmt: skip
    cold_slots = layout = None
    if slot_sizing is not None:
        assert planner is not None and hot_set is not None  # a planned tier refuses --plan and baselines
        layout = slot_sizing(planner.cold_slot_budget(hot_set))
        cold_slots, planner.slot_copies = layout.slots, layout.copied_bytes
    meta = torch.device("meta")  # the tables are made in their shards (load_initial_tables)
    sparse = (
        EmbeddingBagCollection(tables, device=meta)
        if hot_set is None
        else FAEEmbeddingBagCollection(
            tables, hot_set, device=meta, cold_slots=cold_slots, cold_tables=cold_tables
        )
    )
    model = family.build_model(sparse, args, num_dense)
    embedding_optimizer(args).apply(sparse)
    if plan_file is not None:
        plan = plan_file.at(family.sparse_path)
    else:
        assert planner is not None  # made above where there is no plan file
        try:
            plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
        except PlannerError as error:
            raise PlannerError(f"--hbm-cap {args.hbm_cap or 'default'}: {error}", error.error_type) from error
    given = f" (--plan {args.plan})" if plan_file is not None else ""
    logger.info("%s: plan kernels %s%s", mode, dict(kernels(plan)), given)
    return plan, model, layout


def _check_plan(args: RecipeConfig, plan_file: PlanFile, run: dict) -> None:
    """Raise ``ValueError`` naming ``--plan`` and the field where ``run`` is not what the plan was made
    for."""
    mismatch = plan_file.mismatch(run)
    if mismatch:
        raise ValueError(f"--plan {args.plan}: made for another run, {mismatch}")


def _plan_file(args: RecipeConfig, device: torch.device) -> PlanFile:
    """``--plan``'s file, refused when made for another train pipeline on CUDA (whether its caches
    prefetch); logs where it departs from the run's options without harm (the batch size it was priced
    for, the hot budget in place of ``--budget``, the plan's for the hot set and the re-plans)."""
    try:
        plan_file = PlanFile.load(required(args.plan, "--plan"))
    except (ValueError, OSError) as error:
        raise ValueError(f"--plan {args.plan}: {getattr(error, 'strerror', None) or error}") from error
    made_for = plan_file.made_for
    if device.type == "cuda":  # FBGEMM's caches of a plan made for another pipeline
        _check_plan(args, plan_file, {"prefetch_pipeline": args.pipeline == Pipeline.PREFETCH})
    if made_for["batch_size"] != args.batch_size:
        logger.warning(
            "--plan %s: priced for batch size %d, this run has --batch-size %d",
            args.plan, made_for["batch_size"], args.batch_size,
        )  # fmt: skip
    logger.info(
        "--plan %s: its hot set, %s (%d rows), not --budget %s, also for re-plans",
        args.plan, format_bytes(made_for["hot_bytes"]), made_for["hot_rows"], args.budget,
    )  # fmt: skip
    return plan_file


def embedding_optimizer(args: RecipeConfig) -> EmbeddingOptimizer:
    """The embedding optimizer ``args`` name."""
    return EmbeddingOptimizer(EMBEDDING_OPTIMIZERS[args.optimizer], {"lr": args.lr})


def make_router(
    args: RecipeConfig,
    partition: HotColdPartition,
    world: int,
    rank: int,
    model: nn.Module,
    warmup: float,
    cold_tier: PlannedColdTier | None = None,
) -> BatchRouter:
    """The router of ``partition`` for ``model`` (FAE's: it splits the batches for the parts, by the
    part ids, and routes cold batches through ``cold_tier``)."""
    fae = find_fae_module(model)
    return BatchRouter(
        partition, args.batch_size, world, rank, order=args.order, seed=order_seed(args), warmup=warmup,
        split=None if fae is None else fae.split, cold_tier=cold_tier,
    )  # fmt: skip


def _planner(
    mode: str,
    world: int,
    device: torch.device,
    hbm_cap: int | None,
    stats: AccessStats,
    batch_size: int,
    budget: int,
    prefetch: bool,
    *,
    optimizer_class: type[torch.optim.Optimizer] | None,
) -> ShardingPlanner:
    """The planner of ``mode``: FAE's, or the baseline's from ``planner.baseline``. On CUDA ``hbm``
    may use the device's whole memory, the others ``hbm_cap`` (TorchRec's default when None). With
    ``prefetch`` every UVM cache is planned for TorchRec's prefetch pipeline; FAE's hot rows and caches
    cost their ``optimizer_class`` state, as the hot set counts them."""
    if mode == "hbm" and device.type == "cuda":
        hbm_cap = torch.cuda.get_device_properties(device).total_memory
    # torchrun's ranks per host: TorchRec prices the links within a host and across hosts apart
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        topology = make_topology(world, device.type, hbm_cap, local)
    except ValueError as error:
        raise ValueError(f"{world} ranks, LOCAL_WORLD_SIZE {local}: {error}") from error
    logger.info(
        "%s: %d host(s) of %d rank(s); TorchRec prices the input and output distribution at %.1f GiB/s "
        "within a host, %.1f GiB/s across hosts",
        mode, world // local, local, *links_gibps(topology),
    )  # fmt: skip
    if mode == "fae":
        return FAEShardingPlanner(
            topology,
            stats,
            batch_size=batch_size,
            hot_budget_bytes=budget,
            optimizer_class=optimizer_class,
            cache_params=CacheParams(prefetch_pipeline=prefetch),
        )
    if mode == "scaleup":
        return scaleup_planner(topology, stats, batch_size, prefetch_pipeline=prefetch)
    if mode == "hbm":
        return hbm_planner(topology, list(stats.tables), batch_size)  # no cache to prefetch into
    return default_planner(
        topology, batch_size, tables=stats.tables, cache_params=CacheParams(prefetch_pipeline=prefetch)
    )


def kernels(plan: ShardingPlan) -> Counter[str]:
    """How many tables (of all sharded modules) each sharding type / compute kernel got."""
    return Counter(
        f"{sharding.sharding_type}/{sharding.compute_kernel}"
        for module_plan in plan.plan.values()
        for sharding in module_plan.values()
    )
