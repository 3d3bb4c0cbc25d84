"""The training recipe: train a :class:`ModelFamily` with FAE (or a TorchRec baseline) end to end, with
evaluations, checkpoints, metrics and curves, as ``examples/train_dlrm_fae.py`` and
``examples/train_tbsm_fae.py`` run it."""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import resource
import socket
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.planner.types import PlannerError
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from fae_torchrec.collectives import all_gathered, on_rank_zero
from fae_torchrec.logs import torchrec_quiet
from fae_torchrec.recipes.build import Training, build_training, disk_bytes, init_distributed, kernels
from fae_torchrec.recipes.config import RecipeConfig
from fae_torchrec.recipes.curves import compared_run, plot_curves
from fae_torchrec.recipes.family import ModelFamily
from fae_torchrec.recipes.options import check_resume_position, resume_config
from fae_torchrec.recipes.replan import Replanning, resumed_replan
from fae_torchrec.recipes.slots import SlotLayout
from fae_torchrec.recipes.tracing import StepTrace
from fae_torchrec.tables import TableLayout
from fae_torchrec.threads import share_cores
from fae_torchrec.train.checkpoint import Checkpoints
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.evaluation import evaluate, validation_batches
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.replan import ReplanMode
from fae_torchrec.train.router import RoutedBatch
from fae_torchrec.train.runner import StepRunner, steps_to_pause
from fae_torchrec.train.schedule import Step
from fae_torchrec.units import format_bytes

logger = logging.getLogger("fae_torchrec.recipes")
#: The file in ``--out`` that a run holds locked while it runs.
LOCK = ".lock"


def train(family: ModelFamily, args: RecipeConfig) -> dict:
    """Train ``family`` as ``args`` says (``recipe_config``, or the command line's ``parse_args``) on the
    process group ``torchrun`` set up, or one process; the run's metrics (also in ``--out``)."""
    # each line names the model, so that DLRM's and TBSM's logs tell apart
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {family.name} %(name)s: %(message)s", force=True
    )
    for name in (logger.name, "fae_torchrec.data"):  # the run's steps, and what the data's first pass found
        logging.getLogger(name).setLevel(logging.INFO)
    threads = share_cores()  # the cores this rank may use, as the machine's load leaves them
    if threads:
        logger.info("%s", threads)
    rank, world, device = init_distributed()
    if rank:  # rank 0 reports the run; the others only what goes wrong on them
        for name in (logger.name, "fae_torchrec.data"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        # log lines are written above the progress bars (tqdm.write), not into them
        with torchrec_quiet(), _holding(Path(args.out)), logging_redirect_tqdm():
            return _train(args, rank, world, device, family)
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)  # a failed run's model goes with its frames
        raise
    finally:
        # the model's DDP wrappers hold the process group: freed only at exit, the group's threads
        # can abort the process (a command that should exit with status 2 then dies of SIGABRT)
        gc.collect()
        dist.destroy_process_group()


@contextmanager
def _holding(out: Path) -> Iterator[None]:
    """Hold ``out`` (``--out``) for the run: rank 0 locks ``out/.lock`` (``fcntl.flock``, released when
    the run ends, however it ends), so that a second run on the same ``--out``, which would write over the
    partition this one trains from, is refused on its every rank before it writes anything (collective)."""
    held = []

    def lock() -> None:
        path = out / LOCK
        try:
            out.mkdir(parents=True, exist_ok=True)
            file = open(path, "a+")
        except OSError as error:
            raise ValueError(f"--out {out}: cannot write there ({error})") from error
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "another process"
            file.close()
            raise ValueError(
                f"--out {out}: another run is using it ({path} is locked by {holder}); wait for it to end "
                "or choose another --out"
            ) from None
        held.append(file)
        file.truncate(0)
        file.write(f"pid {os.getpid()} on {socket.gethostname()}")  # for the message of a second run
        file.flush()

    try:
        on_rank_zero(lock)
        yield
    finally:
        for file in held:
            file.close()


def _checked_checkpoints(args: RecipeConfig, config: dict) -> tuple[Checkpoints | None, dict]:
    """``--checkpoint-dir``'s checkpoints (None without it) and, with ``--resume``, the summary saved with
    the one to resume from; refuses, before any profiling, what the model is not needed to refuse: a
    directory of an earlier run without ``--resume``, and with it no checkpoint, a damaged manifest, or
    one of another world size or configuration (collective)."""
    if not args.checkpoint_dir:
        return None, {}
    checkpoints = Checkpoints(args.checkpoint_dir, config)
    if args.resume:
        return checkpoints, checkpoints.peek()[1]
    earlier = checkpoints.held_steps()
    if earlier:
        raise ValueError(
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of an earlier run (steps {earlier}): "
            "pass --resume to continue it, or choose an empty directory"
        )
    return checkpoints, {}


@dataclass
class RunState:
    """What the training loop carries from one of its steps to the next: the run (``training``: model,
    router, data; ``runner``; ``checkpoints`` and ``replanning``, None without them), where it is (the
    epoch's steps ``done``, of which those before its router's first are ``offset``, after a re-plan;
    ``step``, counted from 1 over the run) and what it measured (``progress``: steps, counts and history,
    what a checkpoint keeps; this run's inputs ``seen`` over every rank, and its wall times per hot and
    cold step and of routing)."""

    args: RecipeConfig
    rank: int
    world: int
    device: torch.device
    training: Training
    runner: StepRunner
    validation: list
    checkpoints: Checkpoints | None
    replanning: Replanning | None
    progress: dict
    done: int = 0
    offset: int = 0
    step: int = 0
    seen: int = 0
    step_seconds: dict[str, list[float]] = field(default_factory=lambda: {"hot": [], "cold": []})
    routing_seconds: float = 0.0

    @property
    def history(self) -> dict:
        return self.progress["history"]


def _train(args: RecipeConfig, rank: int, world: int, device: torch.device, family: ModelFamily) -> dict:
    """The run in its steps: started (or resumed), each epoch trained, its metrics written."""
    state, first_epoch, first_step = _start(args, rank, world, device, family)
    partition = state.training.data.partition  # the run's first: its metrics describe it
    tracing = StepTrace(args.trace_steps, Path(args.out) / f"trace-rank{rank}.json")
    for epoch in range(first_epoch, args.epochs):
        if epoch > first_epoch:
            _next_epoch(state, epoch)
        _run_epoch(state, epoch, first_step if epoch == first_epoch else 0, tracing)
    tracing.close()
    metrics = _metrics(state, family, partition)
    speed = metrics["samples_per_second"]
    throughput = "no step in this run" if speed is None else f"{speed:.0f} samples/s"
    logger.info(
        "%s: %s, %d hot and %d cold steps, validation AUC %.4f, log loss %.4f",
        metrics["mode"], throughput, metrics["hot_steps"], metrics["cold_steps"], metrics["final_auc"],
        metrics["final_log_loss"],
    )  # fmt: skip
    written = on_rank_zero(
        lambda: _write(metrics, Path(args.out), args.compare)
    )  # a failure ends every rank's
    if rank == 0:
        logger.info("outputs in %s: %s", args.out, ", ".join(written))
    return metrics


def _start(
    args: RecipeConfig, rank: int, world: int, device: torch.device, family: ModelFamily
) -> tuple[RunState, int, int]:
    """The run built (data, plan, model, router) and, with ``--resume``, moved to where its checkpoint
    left it; the epoch and the step of it to start from."""
    checkpoints, summary = _checked_checkpoints(args, resume_config(args, family))
    replanned = None if args.baseline else resumed_replan(args, summary)
    slots = summary.get("cold_slots")  # and their copies (none saved: planned before they were priced)
    saved = None if slots is None else SlotLayout(slots, summary.get("slot_copies", {}))
    training = build_training(args, rank, world, device, family, replanned, saved)
    args = training.config  # the device's and the plan file's choices filled in
    partition = training.data.partition
    held_out = training.data.validation
    assert held_out is not None  # the recipe always holds some inputs out (--val-every, TBSM's split)
    validation = validation_batches(held_out, partition.keys, args.batch_size, world, rank)
    replanning = None if args.baseline else Replanning(args, family, training, partition, device)
    progress = {
        "step": 0,
        "counts": {"hot_steps": 0, "cold_steps": 0},
        "history": {"step": [], "loss": [], "hot": [], "eval_step": [], "auc": [], "log_loss": []},
    }
    if checkpoints is not None:
        checkpoints = checkpoints.for_plan(training.plan)
    runner = StepRunner(args.chosen_pipeline, training.model, training.optimizer, device, fae=training.fae)
    state = RunState(
        args, rank, world, device, training, runner, validation, checkpoints, replanning, progress
    )
    if not args.resume:
        return state, 0, 0
    assert checkpoints is not None  # --resume needs --checkpoint-dir
    position = checkpoints.load(training.model, training.optimizer, cold_tier=training.cold_tier)
    training.router.load_state_dict(position["router"])
    state.progress, state.offset = position["progress"], position["offset"]
    state.step = state.progress["step"]
    first_epoch, first_step = position["router"]["epoch"], state.offset + position["router"]["step"]
    if replanning is not None:
        replanning.load_state_dict(position["replanning"], summary, training)
    logger.info("resumed at epoch %d, step %d", first_epoch, first_step)
    check_resume_position(
        args, first_epoch, first_step, state.offset + len(training.router.schedule(first_epoch))
    )
    return state, first_epoch, first_step


def _next_epoch(state: RunState, epoch: int) -> None:
    """Before a later epoch: its steps counted from its router's first; after a re-plan, the router of
    every input partitioned anew."""
    state.offset = 0
    if state.replanning is not None:
        moved = state.replanning.next_epoch(state.training, epoch)
        if moved is not state.training:
            state.training = moved
            state.runner = StepRunner(
                state.args.chosen_pipeline, moved.model, moved.optimizer, state.device, fae=True
            )


def _run_epoch(state: RunState, epoch: int, first_step: int, tracing: StepTrace) -> None:
    """Train ``epoch`` from its step ``first_step``, pausing for evaluations, re-plan checks and
    checkpoints, and evaluate at its end."""
    args = state.args
    state.done = first_step
    router = state.training.router
    steps = router.epoch(epoch, start_step=state.done - state.offset, plan_next=epoch + 1 < args.epochs)
    schedule = router.schedule(epoch)
    total = state.offset + len(schedule)
    mode = state.training.mode
    bar = tqdm(
        total=total, initial=state.done, desc=f"{mode} epoch {epoch}", unit="step", disable=state.rank != 0
    )
    while state.done < total:
        # the steps up to the next evaluation, checkpoint or re-plan check: a pipeline trains them all,
        # then pauses
        segment = islice(steps, steps_to_pause(state.step, total - state.done, *_pauses(args)))
        _train_segment(state, segment, schedule, bar, tracing)
        if args.eval_every and state.step % args.eval_every == 0:
            _evaluate(state)
            bar.set_postfix_str(_postfix(state.history["loss"][-1], state.progress["counts"], state.history))
        if state.replanning is not None and state.done < total and _replan(state, epoch):
            router = state.training.router  # the rest of the epoch on the new model, from its first step
            steps, schedule = router.epoch(epoch), router.schedule(epoch)
            total = state.offset + len(schedule)
            bar.total = total
        if args.checkpoint_dir and args.checkpoint_every and state.step % args.checkpoint_every == 0:
            _checkpoint(state, epoch)
    bar.close()
    if not state.history["eval_step"] or state.history["eval_step"][-1] != state.step:
        _evaluate(state)


def _train_segment(
    state: RunState, segment: Iterator[RoutedBatch], schedule: list[Step], bar: tqdm, tracing: StepTrace
) -> None:
    """Train the steps of ``segment`` (of the epoch's ``schedule``), recording each."""
    counts, history = state.progress["counts"], state.history
    for routed, loss, seconds, routing in state.runner.train(segment):
        kind = "hot" if routed.hot else "cold"
        state.step_seconds[kind].append(seconds)
        state.routing_seconds += routing
        if state.replanning is not None:
            state.replanning.observe(state.training.router.partition, schedule[routed.step])
        bar.update()
        counts[f"{kind}_steps"] += 1
        state.seen += routed.batch.labels.numel() * state.world
        state.step += 1
        state.done += 1
        tracing.step()
        history["step"].append(state.step)
        history["loss"].append(loss)
        history.setdefault("hot", []).append(routed.hot)  # a checkpoint of an older run has none
        if state.step % 20 == 0:
            bar.set_postfix_str(_postfix(loss, counts, history), refresh=False)


def _replan(state: RunState, epoch: int) -> bool:
    """Check whether to re-plan now (collective) and, on a re-plan, go on with the moved training, its
    steps counted from those done; whether it re-planned."""
    assert state.replanning is not None  # checked where a run re-plans
    moved = state.replanning.check(
        state.step,
        state.training,
        state.runner.paused(),
        epoch,
        state.done - state.offset,
        state.step_seconds,
    )
    if moved is None:
        return False
    state.training, state.offset = moved, state.done
    state.runner = StepRunner(
        state.args.chosen_pipeline, moved.model, moved.optimizer, state.device, fae=True
    )
    if state.checkpoints is not None:  # the same run, of the new plan
        state.checkpoints = state.checkpoints.for_plan(moved.plan)
    return True


def _checkpoint(state: RunState, epoch: int) -> None:
    """Save a checkpoint of the run where it is (collective)."""
    training, replanning = state.training, state.replanning
    state.progress["step"] = state.step
    # a router made by a re-plan at this very step has not started its epoch yet
    where = training.router.state_dict() or {"epoch": epoch, "step": 0}
    position = {"router": where, "progress": state.progress, "offset": state.offset}
    summary = {}
    if replanning is not None:
        position["replanning"] = replanning.state_dict()
        summary = replanning.summary(training)
    if training.slots is not None:  # what the resumed model's slots are planned from
        summary["cold_slots"] = dict(training.slots.slots)
        summary["slot_copies"] = dict(training.slots.copied_bytes)
    assert state.checkpoints is not None  # saved where a run keeps checkpoints
    state.checkpoints.save(
        state.step, state.runner.paused(), training.optimizer, position, summary, cold_tier=training.cold_tier
    )


def _metrics(state: RunState, family: ModelFamily, partition: HotColdPartition) -> dict:
    """The run's metrics: its data (``partition``, the first), steps, speed, memory and accuracy."""
    args, training, history = state.args, state.training, state.history
    all_steps = state.step_seconds["hot"] + state.step_seconds["cold"]
    num_train = len(partition.hot) + len(partition.cold)
    layout = TableLayout.of(training.tables)
    # every rank's peak resident memory (GiB), in rank order
    peaks = all_gathered(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20))
    return {
        "model": family.name,
        "mode": training.mode,
        "world_size": state.world,
        "train_inputs": num_train,
        "hot_input_share": len(partition.hot) / num_train,
        **state.progress["counts"],
        "plan_kernels": dict(kernels(training.plan)),
        # what the run trained from: profile's statistics and plan's plan (None: profiled and planned here)
        "stats_file": args.stats,
        "plan_file": args.plan,
        # training steps only (not evaluation), of this run (after a resume: since it; None when a
        # resume found nothing left to train)
        "samples_per_second": state.seen / sum(all_steps) if all_steps else None,
        "hot_step_ms": _mean_ms(state.step_seconds["hot"]),
        "cold_step_ms": _mean_ms(state.step_seconds["cold"]),
        "routing_ms": 1000 * state.routing_seconds / len(all_steps) if all_steps else None,
        # rank 0's peak resident memory, against the tables' size: weights, and with optimizer state
        "peak_rss_gib": peaks[0],
        "peak_rss_gib_ranks": peaks,
        "tables_gib": layout.num_rows @ layout.row_bytes() / (1 << 30),
        "tables_with_state_gib": layout.num_rows
        @ layout.row_bytes(EMBEDDING_OPTIMIZERS[args.optimizer])
        / (1 << 30),
        **({} if state.replanning is None else state.replanning.metrics(all_steps)),
        **({} if training.cold_tier is None else {"cold_tier": _tier_metrics(training.cold_tier)}),
        "final_auc": history["auc"][-1],
        "final_log_loss": history["log_loss"][-1],
        "history": history,
    }


def _pauses(args: RecipeConfig) -> tuple[int, int, int]:
    """Steps between evaluations, between checkpoints and between re-plan checks (0: none)."""
    checks = 0 if args.baseline or args.replan.mode == ReplanMode.NEVER else args.replan.every
    return args.eval_every, args.checkpoint_every if args.checkpoint_dir else 0, checks


def _tier_metrics(cold_tier: PlannedColdTier) -> dict:
    """The planned cold tier's slots per table, the cold steps its copies run early, and this rank's
    copies in this run (training and evaluation; after a resume: since it), rows and bytes host to
    device (in) and back (out), and the milliseconds per cold step of its epochs' plans, its routing and
    its copies."""
    return {
        "slots": dict(cold_tier.fae.cold_slots or {}),
        "copy_ahead": cold_tier.ahead,
        "rows_in": cold_tier.rows_in,
        "rows_out": cold_tier.rows_out,
        "bytes_in": cold_tier.bytes_in,
        "bytes_out": cold_tier.bytes_out,
        # the tier's own work per cold step trained, on the host (the copies' time is the time to issue
        # them on CUDA, where they run on a side stream); the plans: the first epoch's, made when its
        # first step is routed, and the wait there for a later epoch's, made ahead
        "plan_ms_per_cold_step": 1000 * cold_tier.plan_seconds / max(cold_tier.copied_steps, 1),
        "route_ms_per_cold_step": 1000 * cold_tier.route_seconds / max(cold_tier.copied_steps, 1),
        "copy_ms_per_cold_step": 1000 * cold_tier.copy_seconds / max(cold_tier.copied_steps, 1),
        # of which issuing the write-backs, and the loads
        "write_back_ms_per_cold_step": 1000 * cold_tier.write_back_seconds / max(cold_tier.copied_steps, 1),
        "load_ms_per_cold_step": 1000 * cold_tier.load_seconds / max(cold_tier.copied_steps, 1),
        # the next epoch's plans, made in a background thread during the epoch before
        "plan_ahead_ms_per_cold_step": 1000 * cold_tier.plan_ahead_seconds / max(cold_tier.copied_steps, 1),
    }


def _mean_ms(seconds: list[float]) -> float | None:
    """Mean of ``seconds`` in milliseconds; None when there are none."""
    return 1000 * float(np.mean(seconds)) if seconds else None


def _evaluate(state: RunState) -> None:
    """Evaluate the model at the run's step (collective; within the planned cold tier's ``evaluating``),
    record the result in its history, tell the router (its adaptive orders follow the validation loss)
    and log it on rank 0 as it happens."""
    training, history = state.training, state.history
    with training.cold_tier.evaluating() if training.cold_tier is not None else nullcontext():
        result = evaluate(state.runner.paused(), (b.to(state.device) for b in state.validation))
    history["eval_step"].append(state.step)
    history["auc"].append(result["auc"])
    history["log_loss"].append(result["log_loss"])
    training.router.report_validation_loss(result["log_loss"])
    if state.rank == 0:
        logger.info(
            "step %d: validation AUC %.4f, log loss %.4f", state.step, result["auc"], result["log_loss"]
        )


def _postfix(loss: float, counts: dict, history: dict) -> str:
    """The training bar's figures: the loss, the hot and cold steps so far and the last validation AUC."""
    auc = f", AUC {history['auc'][-1]:.4f}" if history["auc"] else ""
    return f"loss {loss:.4f}, hot {counts['hot_steps']}, cold {counts['cold_steps']}{auc}"


def _write(metrics: dict, out: Path, compare: str | None) -> list[str]:
    """Write ``metrics.json`` and ``curves.png`` (with ``--compare``'s run) to ``out``; what ``out``
    holds then, its folders with their size on disk."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    plot_curves(metrics, out / "curves.png", None if compare is None else compared_run(compare))
    return [
        f"{path.name}/ ({format_bytes(disk_bytes(path))})" if path.is_dir() else path.name
        for path in sorted(out.iterdir())
        if not path.name.startswith(".")
    ]


def run_parsed(family: ModelFamily, args: RecipeConfig) -> None:
    """The command, its line parsed: train ``family``; a bad option, file or plan exits with status 2 and
    says why."""
    try:
        train(family, args)
    except (ValueError, OSError, PlannerError) as error:
        logger.error("%s", error)
        raise SystemExit(2) from error
