"""Train TorchRec's DLRM with FAE on DistributedModelParallel, or a baseline with ``--baseline``.

FAE: profile a sample of the training data, choose the hot set, split the embedding tables
(``FAEEmbeddingBagCollection``), plan them with ``FAEShardingPlanner``, and train with the batch router:
hot steps run the hot part only, cold steps both parts. A baseline trains the unsplit DLRM on the same
data with its batches in random order, with the same hyperparameters, planned by one of TorchRec's
planners (``planner.baseline``): ``torchrec`` (the default planner, plain ``--baseline``), ``scaleup``
(UVM caches grown by the scale-up proposer) or ``hbm`` (every table in device memory). On CPU all three
plan TorchRec's CPU kernels.

    python examples/train_dlrm_fae.py                        # built-in synthetic data, one process
    python examples/train_dlrm_fae.py --baseline             # the same model and data, TorchRec alone
    python examples/train_dlrm_fae.py --baseline scaleup --hbm-cap 8GiB   # on a GPU
    torchrun --nproc_per_node 2 examples/train_dlrm_fae.py   # 2 ranks (gloo on CPU, NCCL on GPU)
    python examples/train_dlrm_fae.py --data criteo-tsv train.txt --scale 1.0

Writes ``metrics.json`` (with throughput, hot and cold step times), ``curves.png`` (train loss,
validation AUC) and the profiled statistics ``stats.npz`` to ``--out``.

The driver (:func:`main`) trains any :class:`ModelFamily`: ``examples/train_tbsm_fae.py`` gives it TBSM
on Taobao-like data.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import tempfile
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
import torchrec
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.types import CacheParams, ShardingPlan, ShardingPlanner
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from tqdm import tqdm

from fae_torchrec import (
    AccessProfiler,
    AccessStats,
    FAEEmbeddingBagCollection,
    HotSet,
    load_initial_tables,
    parse_bytes,
)
from fae_torchrec.arguments import (
    byte_size,
    fraction,
    int_at_least,
    non_negative_int,
    positive_float,
    positive_int,
    share,
    unwritable_directory,
)
from fae_torchrec.data import SampleBlock
from fae_torchrec.data.source import BlockSource
from fae_torchrec.data.sources import PROFILE_SAMPLE, add_data_arguments, default_tables, open_source
from fae_torchrec.tables import TableLayout
from fae_torchrec.train.checkpoint import Checkpoints
from fae_torchrec.train.evaluation import evaluate
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.router import BatchRouter, RoutedBatch
from fae_torchrec.train.schedule import ORDERS, check_warmup
from fae_torchrec.train.step import find_fae_module, train_step
from planner import FAEShardingPlanner
from planner.baseline import default_planner, hbm_planner, scaleup_planner
from planner.topology import make_topology

logger = logging.getLogger("train_dlrm_fae")

#: Inputs per block when the data is streamed.
BLOCK = 4096
#: ``--pipeline``: TorchRec's train pipeline, its prefetch pipeline (CUDA), or a plain loop.
PIPELINES = ("sparse", "prefetch", "none")
#: The baselines ``--baseline`` names, each planned by its ``planner.baseline`` planner.
BASELINES = ("torchrec", "scaleup", "hbm")
EMBEDDING_OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "rowwise_adagrad": torchrec.optim.RowWiseAdagrad,
    "adam": torch.optim.Adam,
}


@dataclass(frozen=True)
class ModelFamily:
    """What differs between the models the driver trains; everything else (profiling, partitioning,
    planning, DMP, the router, pipelines, evaluation, checkpoints, outputs) is shared.

    Attributes:
        name: the model's name in logs and plots.
        description: the command's help line.
        add_arguments: adds the data options (and any model option) to the parser.
        open_source: the data source the options name, in blocks of ``BLOCK`` inputs.
        build_model: the train module (loss, (loss, logits, labels)) around a sparse module (an
            ``EmbeddingBagCollection`` or ``FAEEmbeddingBagCollection``) and the options.
        sparse_path: where the sparse module lives in the train module (``get_submodule``).
        named_defaults: option values a resume must match that are defaults computed from others.
        defaults: the family's own defaults of the driver's options (such as ``batch_size``).
        warmup: the default ``--warmup`` of the stream order (other orders take none).
    """

    name: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    open_source: Callable[[argparse.Namespace], BlockSource]
    build_model: Callable[[nn.Module, argparse.Namespace], nn.Module]
    sparse_path: str
    named_defaults: Callable[[argparse.Namespace], dict] = lambda args: {}
    defaults: dict = field(default_factory=dict)
    warmup: float = 0.0


def _dlrm_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, num_samples=300_000, scale=0.02)
    parser.add_argument(
        "--val-every",
        type=int_at_least(2, " (1 would hold out every input, leaving none to train on)"),
        default=10,
        help="hold out every N-th input (N >= 2) for validation",
    )


def _dlrm(sparse: nn.Module, args: argparse.Namespace) -> nn.Module:
    return DLRMTrain(
        DLRM(
            sparse,
            dense_in_features=13,
            dense_arch_layer_sizes=[64, args.dim],
            over_arch_layer_sizes=[64, 32, 1],
        )
    )


DLRM_FAMILY = ModelFamily(
    name="DLRM",
    description=__doc__.split("\n")[0],
    add_arguments=_dlrm_arguments,
    open_source=lambda args: open_source(args, batch_size=BLOCK, require_labels=True)[0],
    build_model=_dlrm,
    sparse_path="model.sparse_arch.embedding_bag_collection",
    named_defaults=lambda args: {"tables": args.tables or default_tables(args.data)},
)


def parse_args(argv: list[str] | None = None, family: ModelFamily = DLRM_FAMILY) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=family.description)
    family.add_arguments(parser)
    parser.add_argument(
        "--baseline",
        nargs="?",
        const="torchrec",
        choices=BASELINES,
        help="TorchRec alone, data in random order, planned by TorchRec's default planner (torchrec, "
        "the default), with scaled-up UVM caches (scaleup) or all tables in device memory (hbm)",
    )
    parser.add_argument(
        "--hbm-cap",
        type=byte_size,
        help="device memory per GPU the planners may use (FAE, torchrec, scaleup; CUDA only)",
    )
    parser.add_argument("--dim", type=positive_int, default=16, help="embedding dimension")
    parser.add_argument("--batch-size", type=positive_int, default=512, help="per-rank batch size")
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument(
        "--sample", type=fraction, default=PROFILE_SAMPLE["dlrm"], help="profiled fraction of inputs"
    )
    parser.add_argument(
        "--exclude-profiled",
        action="store_true",
        help="train (either mode) on the training inputs the profile did not sample only, so that what "
        "the run measures comes from inputs disjoint from those that chose the hot set (benchmarks)",
    )
    parser.add_argument("--budget", type=byte_size, default="256KiB", help="hot-row budget (FAE)")
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="stream",
        help="hot/cold step order (stream: each input trains where the baseline's random order has it)",
    )
    parser.add_argument(
        "--order-seed",
        type=non_negative_int,
        help="seed of the random step orders, to vary the order alone (default: --seed)",
    )
    parser.add_argument(
        "--balance",
        type=share,
        default=0.0,
        help="the share of the label bias of hot steps taken out: of the hot inputs of the label they "
        "over-represent, as many as would make them click at the data's rate, times this, train in "
        "cold steps (1: hot steps at the data's click rate)",
    )
    parser.add_argument(
        "--warmup",
        type=share,
        help="stream order: the share of the first epoch trained in cold steps only, before any hot step "
        f"(default {family.warmup}; other orders take none)",
    )
    parser.add_argument(
        "--pipeline",
        choices=PIPELINES,
        help="sparse: TorchRec's TrainPipelineSparseDist (FAETrainPipeline for FAE), which overlaps the "
        "next batch's input distribution with the step; prefetch (CUDA only): TorchRec's "
        "PrefetchTrainPipelineSparseDist (FAEPrefetchTrainPipeline), which also fetches the next "
        "batch's cache misses, with every UVM cache planned for it (CacheParams(prefetch_pipeline=True)); "
        "none: a plain loop (default: prefetch on CUDA, sparse on CPU)",
    )
    parser.add_argument("--optimizer", choices=sorted(EMBEDDING_OPTIMIZERS), default="rowwise_adagrad")
    parser.add_argument("--lr", type=positive_float, default=0.05, help="embedding learning rate")
    parser.add_argument("--dense-lr", type=positive_float, default=0.05, help="dense (Adagrad) learning rate")
    parser.add_argument(
        "--eval-every",
        type=non_negative_int,
        default=0,
        help="steps between evaluations (0: at each epoch's end)",
    )
    parser.add_argument("--out", default="runs/train", help="metrics.json and curves.png go here")
    parser.add_argument("--checkpoint-dir", help="write a checkpoint here every --checkpoint-every steps")
    parser.add_argument("--checkpoint-every", type=non_negative_int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    parser.set_defaults(**family.defaults)
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = family.warmup if args.order == "stream" else 0.0
    problem = _invalid_combination(args)
    if problem:
        parser.error(problem)
    return args


def _invalid_combination(args: argparse.Namespace) -> str | None:
    """What is wrong with options that are fine one by one (output directories that cannot be written,
    ``--resume`` without a checkpoint), or None."""
    if args.resume and not args.checkpoint_dir:
        return "--resume needs --checkpoint-dir"
    try:
        check_warmup(args.warmup, args.order)
    except ValueError as error:
        return f"--warmup {args.warmup}: {error}"
    for option, directory in (("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir)):
        if directory is None:
            continue
        problem = unwritable_directory(directory)
        if problem is not None:
            return f"{option} {directory}: {problem}"
    if args.checkpoint_dir and not args.checkpoint_every and not args.resume:
        return "--checkpoint-dir needs --checkpoint-every N (steps between checkpoints)"
    return None


def init_distributed() -> tuple[int, int, torch.device]:
    """Join torchrun's process group, or make a group of one for a plain ``python`` run."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = Path(tempfile.mkdtemp()) / "store"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return rank, world, torch.device("cuda", torch.cuda.current_device())
    return rank, world, torch.device("cpu")


def _blocks(source: BlockSource, validation: bool, args: argparse.Namespace) -> Iterator[SampleBlock]:
    """The training (or validation) inputs of ``source`` in blocks of at most ``BLOCK``: every
    ``--val-every``-th input held out (DLRM), or the source's own split (TBSM's, by time)."""
    return source.split_blocks(validation, getattr(args, "val_every", None), BLOCK)


def prepare_data(
    args: argparse.Namespace, rank: int, family: ModelFamily = DLRM_FAMILY
) -> tuple[list[EmbeddingBagConfig], AccessStats, SampleBlock, HotColdPartition]:
    """Rank 0 streams the data: it profiles the training blocks and writes their hot/cold partition
    to ``--out`` (FAE's offline step; the baseline's partition is all cold). Every rank then gets the
    statistics and the validation set, and memory-maps the partition, reading only its own batches.
    Unlabelled data is refused; a problem found on rank 0 is raised on every rank."""
    source = family.open_source(args)
    tables = source.table_configs(args.dim)
    directory = Path(args.out) / f"partition-{'baseline' if args.baseline else 'fae'}"
    shared: list = [None, None, None]
    if rank == 0:
        try:
            shared = [*_profile_and_partition(args, source, tables, directory), None]
        except (ValueError, OSError) as error:
            shared = [None, None, str(error)]
    dist.broadcast_object_list(shared, src=0)
    stats, validation, problem = shared
    if problem is not None:
        raise ValueError(problem)
    return tables, stats, validation, HotColdPartition.open(directory)


def _profile_and_partition(
    args: argparse.Namespace, source: BlockSource, tables: list[EmbeddingBagConfig], directory: Path
) -> tuple[AccessStats, SampleBlock]:
    """Rank 0's part of :func:`prepare_data`: the statistics and the validation set; the partition
    is written to ``directory``."""
    data = " ".join(args.data)
    profiler = AccessProfiler(tables, args.sample, seed=args.seed)
    profiled = []  # with --exclude-profiled, per training block, the inputs the profile counted
    for block in tqdm(_blocks(source, False, args), desc="profiling", unit="block", leave=False):
        counted = profiler.update(block.to_batch(source.feature_names))
        if args.exclude_profiled:
            profiled.append(np.flatnonzero(counted).astype(np.int32))
    if profiler.num_inputs == 0:
        raise ValueError(f"no training input: --data {data} has no inputs")
    if args.exclude_profiled and profiler.num_sampled == profiler.num_inputs:
        raise ValueError(
            f"--exclude-profiled: --sample {args.sample} profiled all {profiler.num_inputs} training "
            f"inputs of --data {data}, which leaves none to train on"
        )
    held_out = list(_blocks(source, True, args))
    if not held_out:
        every = getattr(args, "val_every", None)
        raise ValueError(
            f"no validation input: --data {data} has {profiler.num_inputs} inputs, fewer than --val-every "
            f"{every} (one input in every {every} is held out for validation)"
            if every
            else f"no validation input: --data {data} has {profiler.num_inputs} training inputs and none "
            "to validate on"
        )
    _check_batch_size(
        args, data, profiler.num_inputs - (profiler.num_sampled if args.exclude_profiled else 0)
    )
    stats = profiler.stats()
    hot_set = (
        HotSet(tuple(tables), tuple(np.empty(0, dtype=np.int64) for _ in tables))
        if args.baseline
        else stats.hot_set(parse_bytes(args.budget))
    )
    training = _blocks(source, False, args)
    if args.exclude_profiled:
        training = (
            block.select(np.delete(np.arange(len(block)), counted))
            for block, counted in zip(training, profiled, strict=True)
        )
    HotColdPartition.write(
        training,
        hot_set,
        source.feature_names,
        directory,
        balance=args.balance,
        seed=args.seed,
    )
    stats.save(Path(args.out) / "stats.npz")
    return stats, SampleBlock.concat(held_out)


def _check_batch_size(args: argparse.Namespace, data: str, num_train: int) -> None:
    """Raise ``ValueError`` naming ``--batch-size`` unless the ``num_train`` training inputs of ``data``
    fill one step on every rank (a smaller batch would train, but not the batch that was planned)."""
    world = dist.get_world_size()
    if num_train < args.batch_size * world:
        ranks = f" per rank on {world} ranks ({args.batch_size * world:,} in all)" if world > 1 else ""
        per_rank = f", {num_train // world:,} per rank" if world > 1 else ""
        trained = " not profiled (--exclude-profiled)" if args.exclude_profiled else ""
        raise ValueError(
            f"--batch-size {args.batch_size}{ranks} is larger than the training data: --data {data} has "
            f"{num_train:,} training inputs{trained}{per_rank}"
        )


def main(argv: list[str] | None = None, family: ModelFamily = DLRM_FAMILY) -> dict:
    args = parse_args(argv, family)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", force=True)
    logger.setLevel(logging.INFO)
    rank, world, device = init_distributed()
    try:
        return _train(args, rank, world, device, family)
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)  # a failed run's model goes with its frames
        raise
    finally:
        # the model's DDP wrappers hold the process group: freed only at exit, the group's threads
        # can abort the process (a command that should exit with status 2 then dies of SIGABRT)
        gc.collect()
        dist.destroy_process_group()


@dataclass
class Training:
    """A run ready to train (``build_training``): its data, plan, sharded model, dense optimizer and
    router, the first step's batches not yet read."""

    mode: str
    tables: list[EmbeddingBagConfig]
    validation: SampleBlock
    partition: HotColdPartition
    plan: ShardingPlan
    model: DistributedModelParallel
    optimizer: torch.optim.Optimizer
    router: BatchRouter
    fae: bool


def build_training(
    args: argparse.Namespace, rank: int, world: int, device: torch.device, family: ModelFamily = DLRM_FAMILY
) -> Training:
    """Prepare the data (:func:`prepare_data`), build and plan the model of ``args`` (FAE's, or the
    baseline's with ``--baseline``), shard it with DMP in its initial state and make its router."""
    if args.optimizer == "adam" and device.type == "cpu":
        raise ValueError(
            "--optimizer adam: FBGEMM has no fused Adam on CPU; use it on GPU, or another optimizer"
        )
    if args.pipeline == "prefetch" and device.type != "cuda":
        raise ValueError(
            "--pipeline prefetch: TorchRec's prefetch pipeline runs on CUDA only; use --pipeline sparse here"
        )
    args.pipeline = args.pipeline or ("prefetch" if device.type == "cuda" else "sparse")
    hbm_cap = parse_bytes(args.hbm_cap) if args.hbm_cap is not None else None
    if hbm_cap is not None and device.type == "cpu":
        logger.warning("--hbm-cap %s ignored: there is no device memory to cap on CPU", args.hbm_cap)
        hbm_cap = None
    tables, stats, validation, partition = prepare_data(args, rank, family)
    mode = args.baseline or "fae"
    budget = parse_bytes(args.budget)
    torch.manual_seed(args.seed)  # the same dense layers on every rank
    # the tables are made in their shards (load_initial_tables): here they take no memory
    meta = torch.device("meta")
    sparse = (
        EmbeddingBagCollection(tables, device=meta)
        if args.baseline
        else FAEEmbeddingBagCollection(tables, stats.hot_set(budget), device=meta)
    )
    planner = _planner(
        mode, world, device, hbm_cap, stats, args.batch_size, budget, args.pipeline == "prefetch"
    )
    num_train = len(partition.hot) + len(partition.cold)
    model = family.build_model(sparse, args)
    embedding_optimizer = EmbeddingOptimizer(EMBEDDING_OPTIMIZERS[args.optimizer], {"lr": args.lr})
    embedding_optimizer.apply(sparse)
    del sparse  # DMP replaces it (or its parts) by sharded modules
    sharders = get_default_sharders()
    try:
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    except PlannerError as error:
        raise PlannerError(f"--hbm-cap {args.hbm_cap or 'default'}: {error}", error.error_type) from error
    logger.info("%s: plan kernels %s", mode, dict(_kernels(plan)))
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    # the same initial tables on every rank and in both layouts, made a block at a time in the shards
    load_initial_tables(model.get_submodule(family.sparse_path), tables, args.seed)
    # data-parallel tables by the embedding optimizer's dense form, the dense layers by Adagrad
    dense = unfused_optimizer(
        dmp, embedding_optimizer, lambda params: torch.optim.Adagrad(params, lr=args.dense_lr)
    )
    fae = find_fae_module(dmp)  # FAE: the router splits the batches for the parts, by the part ids
    router = BatchRouter(
        partition, args.batch_size, world, rank, order=args.order,
        seed=args.seed if args.order_seed is None else args.order_seed, warmup=args.warmup,
        split=None if fae is None else fae.split,
    )  # fmt: skip
    logger.info(
        "%s: %d training inputs (%d hot, %.1f%%), %d validation inputs, %d ranks",
        mode, num_train, len(partition.hot), 100 * len(partition.hot) / num_train, len(validation), world,
    )  # fmt: skip
    return Training(mode, tables, validation, partition, plan, dmp, dense, router, fae is not None)


def _train(
    args: argparse.Namespace, rank: int, world: int, device: torch.device, family: ModelFamily
) -> dict:
    training = build_training(args, rank, world, device, family)
    mode, tables, partition, plan = training.mode, training.tables, training.partition, training.plan
    dmp, dense, router = training.model, training.optimizer, training.router
    num_train = len(partition.hot) + len(partition.cold)
    validation_batches = _validation_batches(
        training.validation, partition.keys, args.batch_size, world, rank
    )

    progress = {
        "step": 0,
        "counts": {"hot_steps": 0, "cold_steps": 0},
        "history": {"step": [], "loss": [], "eval_step": [], "auc": [], "log_loss": []},
    }
    history, counts = progress["history"], progress["counts"]
    first_epoch, first_step = 0, 0
    checkpoints = (
        Checkpoints(args.checkpoint_dir, _resume_config(args, family), plan) if args.checkpoint_dir else None
    )
    earlier = checkpoints.held_steps() if checkpoints and not args.resume else []
    if earlier:
        raise ValueError(
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of an earlier run (steps {earlier}): "
            "pass --resume to continue it, or choose an empty directory"
        )
    if args.resume:
        position = checkpoints.load(dmp, dense)
        router.load_state_dict(position["router"])
        progress = position["progress"]
        history, counts = progress["history"], progress["counts"]
        first_epoch, first_step = position["router"]["epoch"], position["router"]["step"]
        logger.info("resumed at epoch %d, step %d", first_epoch, first_step)
        _check_resume_position(args, first_epoch, first_step, len(router.schedule(first_epoch)))
    runner = StepRunner(args.pipeline, dmp, dense, device, fae=training.fae)
    # this run's wall times (after a resume: since it), in seconds: per hot and per cold step, and of
    # getting each step's batch from the router (onto the device, in the plain loop)
    seen, step_index, step_seconds, routing_seconds = 0, progress["step"], {"hot": [], "cold": []}, 0.0
    for epoch in range(first_epoch, args.epochs):
        steps = router.epoch(epoch, start_step=first_step if epoch == first_epoch else 0)
        total = len(router.schedule(epoch))
        done = first_step if epoch == first_epoch else 0
        bar = tqdm(total=total, initial=done, desc=f"{mode} epoch {epoch}", disable=rank != 0)
        while done < total:
            # the steps up to the next evaluation or checkpoint: a pipeline trains them all, then pauses
            segment = islice(steps, _steps_to_pause(step_index, total - done, args))
            for routed, loss, seconds, routing in runner.train(segment):
                kind = "hot" if routed.hot else "cold"
                step_seconds[kind].append(seconds)
                routing_seconds += routing
                bar.update()
                counts[f"{kind}_steps"] += 1
                seen += routed.batch.labels.numel() * world
                step_index += 1
                done += 1
                history["step"].append(step_index)
                history["loss"].append(loss)
                if step_index % 20 == 0:
                    bar.set_postfix(loss=f"{loss:.4f}")
            if args.eval_every and step_index % args.eval_every == 0:
                result = evaluate(runner.paused(), (b.to(device) for b in validation_batches))
                _record(history, step_index, result)
                router.report_validation_loss(result["log_loss"])
            if args.checkpoint_dir and args.checkpoint_every and step_index % args.checkpoint_every == 0:
                progress["step"] = step_index
                position = {"router": router.state_dict(), "progress": progress}
                checkpoints.save(step_index, runner.paused(), dense, position)
        bar.close()
        if not history["eval_step"] or history["eval_step"][-1] != step_index:
            result = evaluate(runner.paused(), (b.to(device) for b in validation_batches))
            _record(history, step_index, result)
            router.report_validation_loss(result["log_loss"])
    all_steps = step_seconds["hot"] + step_seconds["cold"]
    layout = TableLayout.of(tables)
    metrics = {
        "model": family.name,
        "mode": mode,
        "world_size": world,
        "train_inputs": num_train,
        "hot_input_share": len(partition.hot) / num_train,
        **counts,
        "plan_kernels": dict(_kernels(plan)),
        # training steps only (not evaluation), of this run (after a resume: since it; None when a
        # resume found nothing left to train)
        "samples_per_second": seen / sum(all_steps) if all_steps else None,
        "hot_step_ms": _mean_ms(step_seconds["hot"]),
        "cold_step_ms": _mean_ms(step_seconds["cold"]),
        "routing_ms": 1000 * routing_seconds / len(all_steps) if all_steps else None,
        # rank 0's peak resident memory, against the tables' size: weights, and with optimizer state
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20),
        "tables_gib": layout.num_rows @ layout.row_bytes() / (1 << 30),
        "tables_with_state_gib": layout.num_rows
        @ layout.row_bytes(EMBEDDING_OPTIMIZERS[args.optimizer])
        / (1 << 30),
        "final_auc": history["auc"][-1],
        "final_log_loss": history["log_loss"][-1],
        "history": history,
    }
    throughput = f"{metrics['samples_per_second']:.0f} samples/s" if all_steps else "no step in this run"
    logger.info(
        "%s: %s, %d hot and %d cold steps, validation AUC %.4f, log loss %.4f",
        mode, throughput, counts["hot_steps"], counts["cold_steps"], metrics["final_auc"],
        metrics["final_log_loss"],
    )  # fmt: skip
    if rank == 0:
        _write(metrics, Path(args.out))
    return metrics


def _check_resume_position(args: argparse.Namespace, epoch: int, step: int, epoch_steps: int) -> None:
    """Log that a run resumed at its last step has nothing left to train (it evaluates and writes its
    metrics); raise ``ValueError`` naming ``--epochs`` when the checkpoint lies beyond the run's end."""
    if epoch >= args.epochs:
        raise ValueError(
            f"--epochs {args.epochs}: the checkpoint in --checkpoint-dir {args.checkpoint_dir} is at epoch "
            f"{epoch}, step {step}, past the last epoch of this run; resume with --epochs {epoch + 1} or more"
        )
    if epoch == args.epochs - 1 and step == epoch_steps:
        logger.info("nothing left to train: the checkpoint is at the last step of epoch %d", epoch)


def _steps_to_pause(step_index: int, left: int, args: argparse.Namespace) -> int:
    """Steps from ``step_index`` to the next evaluation or checkpoint, at most the ``left`` ones of
    the epoch."""
    pauses = [args.eval_every, args.checkpoint_every if args.checkpoint_dir else 0]
    return min([left] + [every - step_index % every for every in pauses if every])


class StepRunner:
    """Trains routed batches in the plain loop (``--pipeline none``) or on TorchRec's train pipeline
    (``FAETrainPipeline`` for FAE, ``TrainPipelineSparseDist`` for a baseline) or prefetch pipeline
    (``FAEPrefetchTrainPipeline``, ``PrefetchTrainPipelineSparseDist``), and yields per step the
    routed batch, its loss, the step's seconds and the seconds spent getting its batch. A pipeline
    reads ahead, so it is given the steps up to a pause; ``paused()`` is the model to evaluate or save
    then (detached from the pipeline, which attaches it again on its next step)."""

    def __init__(self, kind: str, model: nn.Module, optimizer, device: torch.device, fae: bool) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        pipeline = {
            "sparse": FAETrainPipeline if fae else TrainPipelineSparseDist,
            "prefetch": FAEPrefetchTrainPipeline if fae else PrefetchTrainPipelineSparseDist,
        }
        self.pipeline = None if kind == "none" else pipeline[kind](model, optimizer, device)

    def train(self, routed: Iterator[RoutedBatch]) -> Iterator[tuple[RoutedBatch, float, float, float]]:
        return self._plain(routed) if self.pipeline is None else self._pipelined(routed)

    def paused(self) -> nn.Module:
        return self.model if self.pipeline is None else self.pipeline.detach()

    def _plain(self, routed: Iterator[RoutedBatch]) -> Iterator[tuple[RoutedBatch, float, float, float]]:
        while True:
            started = time.perf_counter()
            step = next(routed, None)
            if step is None:
                return
            batch = step.batch.to(self.device)
            _synchronize(self.device)
            routed_at = time.perf_counter()
            loss = train_step(self.model, batch, self.optimizer, hot=step.hot)
            _synchronize(self.device)
            yield step, loss, time.perf_counter() - routed_at, routed_at - started

    def _pipelined(self, routed: Iterator[RoutedBatch]) -> Iterator[tuple[RoutedBatch, float, float, float]]:
        taken: deque[RoutedBatch] = deque()  # read by the pipeline, not yet trained
        routing = [0.0]

        def batches() -> Iterator[Batch]:
            while True:
                started = time.perf_counter()
                step = next(routed, None)
                routing[0] += time.perf_counter() - started
                if step is None:
                    return
                taken.append(step)
                yield step.batch

        source = batches()
        while True:
            before, started = routing[0], time.perf_counter()
            try:
                output = self.pipeline.progress(source)
            except StopIteration:
                return
            _synchronize(self.device)
            spent = routing[0] - before
            yield taken.popleft(), float(output[0]), time.perf_counter() - started - spent, spent


def _resume_config(args: argparse.Namespace, family: ModelFamily) -> dict:
    """The options a resumed run must share with the run that saved, keyed as written on the command
    line (every option but these: how long to train, how often to evaluate and save, where to write)."""
    free = {"epochs", "eval_every", "out", "checkpoint_dir", "checkpoint_every", "resume"}
    chosen = {**vars(args), **family.named_defaults(args)}  # defaults computed from other options, named
    return {f"--{key.replace('_', '-')}": value for key, value in chosen.items() if key not in free}


def _planner(
    mode: str,
    world: int,
    device: torch.device,
    hbm_cap: int | None,
    stats: AccessStats,
    batch_size: int,
    budget: int,
    prefetch: bool,
) -> ShardingPlanner:
    """The planner of ``mode``: FAE's, or the baseline's from ``planner.baseline``. On CUDA ``hbm``
    may use the device's whole memory, the others ``hbm_cap`` (TorchRec's default when None). With
    ``prefetch`` every UVM cache is planned for TorchRec's prefetch pipeline."""
    if mode == "hbm" and device.type == "cuda":
        hbm_cap = torch.cuda.get_device_properties(device).total_memory
    topology = make_topology(world, device.type, hbm_cap)
    if mode == "fae":
        return FAEShardingPlanner(
            topology,
            stats,
            batch_size=batch_size,
            hot_budget_bytes=budget,
            cache_params=CacheParams(prefetch_pipeline=prefetch),
        )
    if mode == "scaleup":
        return scaleup_planner(topology, stats, batch_size, prefetch_pipeline=prefetch)
    if mode == "hbm":
        return hbm_planner(topology, list(stats.tables), batch_size)  # no cache to prefetch into
    pipelined = ParameterConstraints(cache_params=CacheParams(prefetch_pipeline=True))
    constraints = {t.name: pipelined for t in stats.tables} if prefetch else None
    return default_planner(topology, batch_size, constraints, tables=stats.tables)


def _kernels(plan: ShardingPlan) -> Counter[str]:
    """How many tables (of all sharded modules) each sharding type / compute kernel got."""
    return Counter(
        f"{sharding.sharding_type}/{sharding.compute_kernel}"
        for module_plan in plan.plan.values()
        for sharding in module_plan.values()
    )


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that the clock reads real step times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mean_ms(seconds: list[float]) -> float | None:
    """Mean of ``seconds`` in milliseconds; None when there are none."""
    return 1000 * float(np.mean(seconds)) if seconds else None


def _validation_batches(
    validation: SampleBlock, keys: tuple[str, ...], batch_size: int, world: int, rank: int
) -> list:
    """This rank's validation batches, the same number on every rank."""
    everything_cold = HotColdPartition(
        validation.slice(0, 0), validation, np.zeros(len(validation), dtype=bool), keys
    )
    router = BatchRouter(everything_cold, batch_size, world, rank, order="phases")
    return [routed.batch for routed in router.epoch(0)]


def _record(history: dict, step: int, result: dict) -> None:
    history["eval_step"].append(step)
    history["auc"].append(result["auc"])
    history["log_loss"].append(result["log_loss"])


def _write(metrics: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    history = metrics["history"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    losses = np.asarray(history["loss"])
    window = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    left.plot(history["step"][window - 1 :], smooth)
    left.set_xlabel("step")
    left.set_ylabel(f"train loss (moving mean of {window})")
    right.plot(history["eval_step"], history["auc"], marker="o")
    right.set_xlabel("step")
    right.set_ylabel("validation AUC")
    fig.suptitle(f"{metrics['model']}, {metrics['mode']}, {metrics['world_size']} rank(s)")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


def run(family: ModelFamily) -> None:
    """The command: train ``family``; a bad option, file or plan exits with status 2 and says why."""
    try:
        main(family=family)
    except (ValueError, OSError, PlannerError) as error:
        logger.error("%s", error)
        raise SystemExit(2) from error


if __name__ == "__main__":
    run(DLRM_FAMILY)
