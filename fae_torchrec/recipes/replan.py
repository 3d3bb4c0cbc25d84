"""The recipe's re-planning (``--replan``): watch every step, check when due, and move to a new hot set.

Every rank watches the whole step (all ranks' inputs, read from the shared partition, the same draws on
every rank), so every rank holds the same recent counts and comes to the same decision with no
collective. A re-plan writes the training state in the unsplit layout to files, frees the old
tables, plans and shards the model of the new hot set (the recipe's own ``shard_model``), loads the state
into it, partitions again the inputs of the epoch not yet trained, and the data of later epochs, and goes
on with a new router. Its files go into ``--out``/``replan-step-NNNNNNNNN`` (the recent statistics, both
partitions), which a checkpoint's summary names, so that a resume builds the model it saved.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingPlan

from fae_torchrec import trace
from fae_torchrec.collectives import on_rank_zero
from fae_torchrec.recipes.build import (
    REPLAN_HOT_SET,
    REPLAN_PLAN,
    Replanned,
    Training,
    embedding_optimizer,
    make_router,
    plan_model,
    shard_model,
    unfused_of,
)
from fae_torchrec.recipes.config import RecipeConfig
from fae_torchrec.recipes.family import ModelFamily
from fae_torchrec.recipes.slots import slot_sizing
from fae_torchrec.seeds import generator
from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import COLD, HOT, HotSet
from fae_torchrec.stats.hot_share import estimate_hot_share
from fae_torchrec.stats.recent import RecentAccessCounts
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.prepare import repartition
from fae_torchrec.train.replan import ReplanDecision, ReplanMode, Replanner
from fae_torchrec.train.resplit import load_unsplit_state, release_tables, spill_unsplit_state
from fae_torchrec.train.row_moves import kept_in_place, move_rows
from fae_torchrec.train.schedule import Step, trained_inputs
from fae_torchrec.train.step import find_fae_module
from fae_torchrec.units import parse_bytes

logger = logging.getLogger("fae_torchrec.recipes")

#: Share of each step's inputs the recent counts count, and as many held out.
WATCH_SAMPLE = 0.05
#: The recent held-out inputs kept: those of a half-life (``--replan-window`` steps), at least this many.
MIN_HOLDOUT = 1000
#: Inputs of those left to train that a check compares the current and the recent hot set on.
UPCOMING_INPUTS = 10_000
#: Rows of a table the recent counts keep: this many times its hot rows, and at least ``MIN_CAPACITY``.
CAPACITY_FACTOR, MIN_CAPACITY = 4, 1024
#: The folder of a re-plan's files in ``--out``, by the step after which it happened.
FOLDER = "replan-step-{:09d}"


class Replanning:
    """Watches ``training`` (an FAE run of ``args``) step by step and re-plans it as ``args.replan`` says.

    ``full`` is every training input, in the data's order, partitioned against the current hot set (the
    data of the epochs after a re-plan)."""

    def __init__(
        self,
        args: RecipeConfig,
        family: ModelFamily,
        training: Training,
        full: HotColdPartition,
        device: torch.device,
    ) -> None:
        self.args, self.family, self.device, self.full = args, family, device, full
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.out = Path(args.out)
        fae = find_fae_module(training.model)
        assert fae is not None  # an FAE run's (a baseline does not re-plan)
        hot_set = fae.hot_set()
        hot_rows = np.array([len(ids) for ids in hot_set.hot_ids])
        capacity = np.maximum(CAPACITY_FACTOR * hot_rows, MIN_CAPACITY)
        held = max(MIN_HOLDOUT, round(WATCH_SAMPLE * args.batch_size * self.world * args.replan.window))
        self.counts = RecentAccessCounts(
            training.tables, capacity, sample_fraction=WATCH_SAMPLE, half_life=args.replan.window,
            holdout_fraction=WATCH_SAMPLE, seed=args.seed,
            holdout_size=held,
        )  # fmt: skip
        layout = self.counts.layout
        # the table of each id column of the partition's inputs
        self._columns = layout.column_tables(full.keys, full.hot.ids_per_feature)
        planned = estimate_hot_share(training.stats, hot_set)
        self.replanner = Replanner(
            self.counts,
            hot_set,
            planned,
            parse_bytes(args.budget),
            EMBEDDING_OPTIMIZERS[args.optimizer],
            args.replan,
        )
        #: The last re-plan's folder (None: none yet), and the epoch whose rest its partition holds.
        self.folder: Path | None = None
        self.epoch: int | None = None
        # watching in a thread of its own: the time the loop spends on it, and the thread's
        self.watch_seconds, self.work_seconds, self.watched_steps = 0.0, 0.0, 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fae-watch")
        self._pending: list[Future] = []
        self.decisions: list[dict] = []
        #: The phases of the last move: seconds (spill, partition, shard, load) and bytes.
        self.last_move: dict = {}

    def observe(self, partition: HotColdPartition, step: Step) -> None:
        """Count a trained step: a sample of its inputs (every rank's) into the recent counts, and its
        share of hot inputs. The work runs in a thread of its own, off the training's critical path
        (in order: the counts are the same as counted here); what is left here is handing it over."""
        started = time.perf_counter()
        self._pending.append(self._worker.submit(self._observe, partition, step))
        self.watched_steps += 1
        self.watch_seconds += time.perf_counter() - started

    def _observe(self, partition: HotColdPartition, step: Step) -> None:
        started = time.perf_counter()
        with record_function(trace.WATCH):
            spans = [span for spans in step.spans for span in spans]
            counted, held = self.counts.draw(sum(stop - start for _, start, stop in spans))
            counted_ids, held_ids = partition.take_ids(spans, counted), partition.take_ids(spans, held)
            self.counts.add_columns(counted_ids, held_ids, self._columns)
            self.replanner.observe(step)
        self.work_seconds += time.perf_counter() - started

    def flush(self) -> None:
        """Wait for the steps handed over (raising what their work raised)."""
        started = time.perf_counter()
        for future in self._pending:
            future.result()
        self._pending.clear()
        self.watch_seconds += time.perf_counter() - started

    def check(
        self,
        step_index: int,
        training: Training,
        model: torch.nn.Module,
        epoch: int,
        done: int,
        step_seconds: dict[str, list[float]],
    ) -> Training | None:
        """At step ``step_index`` (counted from 1), ``done`` steps into ``epoch``'s schedule of
        ``training.router``: decide when due, and on a re-plan return the training moved to the new
        hot set (``model`` is the paused model)."""
        policy = self.args.replan
        if policy.mode == ReplanMode.NEVER or step_index % policy.every:
            return None
        self.flush()  # the window holds every step trained so far, alike on every rank
        if not self.replanner.due(step_index):
            return None
        schedule = training.router.schedule(epoch)
        with record_function(trace.REPLAN_CHECK):
            decision = self._decide(step_index, training, schedule, epoch, done, step_seconds)
        if not decision.replan:
            return None
        started = time.perf_counter()
        with record_function(trace.REPLAN_MOVE):
            moved = self.move(step_index, training, model, schedule[:done], decision)
        self.decisions[-1]["seconds"] = time.perf_counter() - started
        self.decisions[-1]["move"] = self.last_move
        self.epoch = epoch
        logger.info("re-planned after step %d in %.1f s: %d rows moved", step_index,
                    self.decisions[-1]["seconds"], decision.rows_moved)  # fmt: skip
        return moved

    def _decide(
        self,
        step_index: int,
        training: Training,
        schedule: list[Step],
        epoch: int,
        done: int,
        step_seconds: dict[str, list[float]],
    ) -> ReplanDecision:
        """The decision at the check after step ``step_index`` (``done`` steps into ``epoch``, whose
        ``schedule`` the router trains), recorded in ``decisions``."""
        upcoming, remaining = self.upcoming(training.router.partition, schedule[done:], epoch, step_index)
        times = [float(np.mean(step_seconds[k])) if step_seconds[k] else 0.0 for k in ("hot", "cold")]
        times.append(next((d["seconds"] for d in reversed(self.decisions) if "seconds" in d), 0.0))
        # measured times differ between ranks; their mean makes every rank decide alike
        hot, cold, cost = (float(t) for t in _mean_over_ranks(times))
        decision = self.replanner.decide(
            remaining,
            self.args.batch_size * self.world,
            hot,
            cold,
            cost or self._startup_cost(hot, cold),
            upcoming,
        )
        logger.info("check after step %d: %s", step_index, decision)
        self.decisions.append(_decision_record(step_index, decision))
        return decision

    def upcoming(
        self, partition: HotColdPartition, steps: list[Step], epoch: int, step_index: int
    ) -> tuple[Holdout, int]:
        """The inputs the run has left to train at the check after step ``step_index``: those ``steps``
        train on every rank (the rest of ``epoch``, from ``partition``), then every input (``full``)
        once per later epoch. ``UPCOMING_INPUTS`` of them at random (the same draws on every rank), as a
        ``Holdout`` to compare the hot sets on (none was counted: the recent hot set was not chosen on
        them), and how many they are."""
        rest = [span for step in steps for spans in step.spans for span in spans]
        everything = ((HOT, 0, len(self.full.hot)), (COLD, 0, len(self.full.cold)))
        this, each = (sum(stop - start for _, start, stop in spans) for spans in (rest, everything))
        total = this + each * (self.args.epochs - epoch - 1)
        rng = generator(self.args.seed, "upcoming", step_index)
        drawn = np.sort(rng.choice(total, min(UPCOMING_INPUTS, total), replace=False))
        later = np.sort((drawn[drawn >= this] - this) % each)
        ids = np.concatenate(
            [partition.take_ids(rest, drawn[drawn < this]), self.full.take_ids(everything, later)]
        )
        rows = ids + self.counts.layout.row_offsets[self._columns]
        return Holdout(rows.ravel(), np.repeat(np.arange(len(ids)), ids.shape[1]), len(ids)), total

    def _startup_cost(self, hot: float, cold: float) -> float:
        """Before any re-plan, its cost is taken as a hundred steps (a conservative stand-in: the
        first re-plan measures it)."""
        return 100 * max(hot, cold)

    def _partition_again(
        self,
        folder: Path,
        partition: HotColdPartition,
        trained: list[Step],
        hot_set: HotSet,
        recent: AccessStats,
    ) -> HotColdPartition:
        """The inputs of ``partition`` that ``trained`` left, and every input (``full``), partitioned
        against ``hot_set`` into ``folder``, beside it and the ``recent`` statistics that chose it
        (collective); the former."""
        args = self.args

        def save() -> None:
            folder.mkdir(parents=True, exist_ok=True)
            recent.save(folder / "stats.npz")
            np.savez(folder / REPLAN_HOT_SET, *hot_set.hot_ids)

        on_rank_zero(save)  # a failure ends every rank's run
        rest = ~trained_inputs(partition.is_hot, trained)
        remainder = repartition(partition, rest, hot_set, folder / "partition", args.balance, args.seed)
        everything = np.ones(len(self.full.is_hot), dtype=bool)
        self.full = repartition(self.full, everything, hot_set, folder / "full", args.balance, args.seed)
        self.last_move |= {
            "partition_bytes": sum(
                f.stat().st_size for d in ("partition", "full") for f in (folder / d).rglob("*.npy")
            ),
            "repartitioned_inputs": int(rest.sum()) + len(everything),
        }
        return remainder

    def move(
        self,
        step_index: int,
        training: Training,
        model: torch.nn.Module,
        trained: list[Step],
        decision: ReplanDecision,
    ) -> Training:
        """``training`` moved to ``decision``'s hot set after step ``step_index``, ``trained`` the steps
        of its router's epoch done (``model``: the paused model, unusable afterwards), planned from the
        recent statistics the decision took it from: only the rows that change part moved (``move_rows``;
        a table entirely hot stays so, ``kept_in_place``), or, with a planned cold tier, the state through
        files into a new model (``spill_unsplit_state``); the rest of the epoch and the full data
        partitioned again (collective). ``last_move`` holds each phase's seconds and bytes, and ``path``:
        ``rows`` or ``files``."""
        clock = _Clock()
        hot_set, stats, proposed = decision.proposal()
        folder = self.out / FOLDER.format(step_index)
        if training.cold_tier is None:
            hot_set = kept_in_place(model, hot_set)
            moved = self._move_rows(training, model, hot_set, stats, clock)
            remainder = self._partition_again(folder, training.router.partition, trained, hot_set, stats)
            self.last_move["partition_seconds"] = clock.lap()
            # a resume shards the model as the move did: its cold part kept the plan it had
            prefix = f"{self.family.sparse_path}."
            relative = {k.removeprefix(prefix): v for k, v in moved.plan.plan.items() if k.startswith(prefix)}
            on_rank_zero(lambda: torch.save(ShardingPlan(relative), folder / REPLAN_PLAN))
        else:
            moved, remainder = self._move_through_files(
                training, model, hot_set, stats, folder, clock, trained
            )
        self.folder = folder
        self.replanner.moved_to(hot_set, proposed)
        router = make_router(
            self.args, remainder, self.world, self.rank, moved.model, warmup=0.0, cold_tier=moved.cold_tier
        )
        return dataclasses.replace(moved, router=router, stats=stats)

    def _move_rows(
        self, training: Training, model: torch.nn.Module, hot_set: HotSet, stats: AccessStats, clock: _Clock
    ) -> Training:
        """``training``'s model with only the rows that change part moved to ``hot_set`` (``move_rows``),
        its hot part planned from ``stats``."""
        args = self.args
        fae = find_fae_module(model)
        assert fae is not None  # a re-plan moves an FAE model
        plan, _, _ = plan_model(
            args, self.family, training.tables, training.data.num_dense, stats, hot_set, self.world,
            self.device, cold_tables=fae.cold_rows,
        )  # fmt: skip
        plan_seconds = clock.lap()
        dmp, dense, moves = move_rows(
            model, training.optimizer, embedding_optimizer(args), hot_set, plan, get_default_sharders(),
            unfused_of(args),
        )  # fmt: skip
        self.last_move = {
            "path": "rows",
            "leaving_rows": moves.leaving,
            "entering_rows": moves.entering,
            "gathered_bytes": moves.gathered_bytes,
            "plan_seconds": plan_seconds,
            "move_rows_seconds": clock.lap(),
        }
        return dataclasses.replace(training, plan=dmp.plan, model=dmp, optimizer=dense)

    def _move_through_files(
        self,
        training: Training,
        model: torch.nn.Module,
        hot_set: HotSet,
        stats: AccessStats,
        folder: Path,
        clock: _Clock,
        trained: list[Step],
    ) -> tuple[Training, HotColdPartition]:
        """``training``'s model moved through the unsplit layout in files in ``folder`` to ``hot_set``, and
        the rest of the epoch (``trained``: the steps done) partitioned again (between the two: a planned
        cold tier's slots are sized from the partitions): a new model planned from ``stats``, and the
        partition of the rest."""
        args = self.args
        embedding = embedding_optimizer(args)
        state = spill_unsplit_state(model, training.optimizer, embedding, folder / "rows", training.cold_tier)
        # the old tables give their memory to the new model's
        release_tables(model, training.optimizer, embedding, training.cold_tier)
        if training.cold_tier is not None:  # the new model gets a tier of its own
            training.cold_tier.close()
        self.last_move = {
            "path": "files",
            "state_bytes": state.nbytes(),
            "spilled_bytes": state.file_bytes(),
            "spill_seconds": clock.lap(),
        }
        remainder = self._partition_again(folder, training.router.partition, trained, hot_set, stats)
        self.last_move["partition_seconds"] = clock.lap()
        sizing = None  # a planned cold tier's slots, sized from the new partitions
        if training.cold_tier is not None:
            partitions = [remainder, self.full]
            sizing = slot_sizing(args, partitions, training.data.validation, hot_set, self.world, 0.0)
        plan, dmp, dense, slots = shard_model(
            args, self.family, training.tables, training.data.num_dense, stats, hot_set, self.world,
            self.device, slot_sizing=sizing,
        )  # fmt: skip
        self.last_move["shard_seconds"] = clock.lap()
        cold_tier = None if sizing is None else PlannedColdTier(dmp, ahead=args.chosen_copy_ahead)
        load_unsplit_state(dmp, dense, embedding, state, cold_tier)
        state.remove()
        self.last_move["load_seconds"] = clock.lap()
        moved = dataclasses.replace(
            training, plan=plan, model=dmp, optimizer=dense, cold_tier=cold_tier, slots=slots
        )
        return moved, remainder

    def next_epoch(self, training: Training, epoch: int) -> Training:
        """``training`` for ``epoch``: after a re-plan in an earlier epoch, its router reads ``full``."""
        if self.folder is None or training.router.partition is self.full:
            return training
        router = make_router(
            self.args,
            self.full,
            self.world,
            self.rank,
            training.model,
            warmup=0.0,
            cold_tier=training.cold_tier,
        )
        return dataclasses.replace(training, router=router)

    def summary(self, training: Training) -> dict:
        """What a checkpoint must name for a resume to build the model it saved: the last re-plan, its
        epoch, and which of its partitions the router reads."""
        router = "full" if training.router.partition is self.full else "partition"
        return {"replan": None if self.folder is None else self.folder.name, "replan_epoch": self.epoch,
                "router": router}  # fmt: skip

    def state_dict(self) -> dict:
        """The watching's state (recent counts, the share window), for an exact resume."""
        self.flush()
        return {"replanner": self.replanner, "decisions": self.decisions}

    def load_state_dict(self, state: dict, summary: dict, training: Training) -> None:
        """Resume the watching of ``training`` (built from the checkpoint's ``summary``)."""
        self.replanner = state["replanner"]
        self.counts = self.replanner.counts
        self.decisions = state["decisions"]
        if summary.get("replan"):
            self.folder, self.epoch = self.out / summary["replan"], summary["replan_epoch"]
            full = summary["router"] == "full"
            self.full = training.router.partition if full else HotColdPartition.open(self.folder / "full")

    def metrics(self, step_seconds: list[float]) -> dict:
        """The watching's figures: the measured against the planned share, its cost per step, its
        memory, and the checks and re-plans."""
        self.flush()
        self._worker.shutdown()
        measured = self.replanner.measured()
        logger.info(
            "watching: hot-input share %s over the last steps, the plan's %s",
            measured,
            self.replanner.planned,
        )
        per_step = self.watch_seconds / self.watched_steps if self.watched_steps else None
        work = self.work_seconds / self.watched_steps if self.watched_steps else None
        return {
            "replan": self.args.replan.mode,
            "measured_hot_share": measured.share,
            "planned_hot_share": self.replanner.planned.share,
            "watch_ms_per_step": None if per_step is None else 1000 * per_step,
            "watch_share_of_step": per_step / float(np.mean(step_seconds))
            if per_step and step_seconds
            else None,
            "watch_thread_ms_per_step": None if work is None else 1000 * work,
            "watch_bytes_per_table": self.counts.bytes_per_table().tolist(),
            "watch_holdout_bytes": self.counts.holdout_bytes(),
            "replans": [d for d in self.decisions if d["replan"]],
            "checks": len(self.decisions),
        }


def _mean_over_ranks(values: list[float]) -> torch.Tensor:
    """Each of ``values`` averaged over the ranks (a collective)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return tensor.cpu() / dist.get_world_size()


class _Clock:
    """Seconds between laps."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed


def resumed_replan(args: RecipeConfig, summary: dict) -> Replanned | None:
    """The re-plan a checkpoint's ``summary`` names (None: none), to build the resumed model from.
    Raises ``ValueError`` naming ``--out`` when its files are gone."""
    if not summary.get("replan"):
        return None
    folder = Path(args.out) / summary["replan"]
    if not (folder / "stats.npz").is_file():
        raise ValueError(
            f"--out {args.out}: the checkpoint was saved after a re-plan whose files ({folder}) are gone; "
            "resume with the --out of the run that saved it"
        )
    return Replanned(folder, summary["router"])


def _decision_record(step: int, decision: ReplanDecision) -> dict:
    """A check's figures, for the metrics (JSON values)."""
    record = {
        "step": step, "measured": decision.measured.share, "planned": decision.planned.share,
        "drifted": decision.drifted, "replan": decision.replan,
    }  # fmt: skip
    if decision.proposed is not None and decision.current is not None:
        record |= {
            "current": decision.current.share, "proposed": decision.proposed.share,
            "gained": decision.gained, "rows_moved": decision.rows_moved, "bytes_moved": decision.bytes_moved,
            "gain_seconds": decision.gain_seconds, "cost_seconds": decision.cost_seconds,
        }  # fmt: skip
    return record
