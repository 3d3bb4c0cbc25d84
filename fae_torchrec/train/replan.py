"""Deciding to re-plan while training: the hot-input share measured step by step against the plan's,
the hot set of the recent counts, and what moving to it gains against what it costs.

Every step's share is free: the schedule says how many of a step's inputs come from the hot part.
``Replanner`` keeps the last ``window`` steps' counts and, when asked (``decide``), compares their share
with the plan's estimate (``clearly_below``: beyond both 95% intervals and ``margin``), takes FAE's hot
set of the same budget from the recent counts (``RecentAccessCounts``), and compares both hot sets on
the inputs a move would re-partition: a sample of those the run has left to train (the rest of the
epoch, then every input once per later epoch; for a stream whose rest is unknown, the recent held-out
inputs instead). The new hot set was chosen on none of them. Judged on recent inputs, the recent hot
set wins where it fits the current day, and can still lose the run where the plan covered more of what
follows (a profile of every day, drifting data trained in time order). A move counts only the share it
gains beyond chance: the change's 95% lower bound, paired (``compare_hot_sets``). Moving pays when the
inputs it turns hot over the rest of the run save, at the measured (or predicted) hot and cold step
times, more than the re-plan costs. Policies: ``never`` (watch and report only), ``auto`` (re-plan when
the share has clearly fallen and moving pays), ``every`` (every ``every`` steps, move to the recent hot
set when it gains share). No re-plan is taken that does not gain share beyond chance; a hot set equal
to the current one is never moved to.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import HOT, HotSet
from fae_torchrec.stats.hot_share import ShareEstimate, clearly_below, compare_hot_sets, measured_share
from fae_torchrec.stats.recent import RecentAccessCounts
from fae_torchrec.train.schedule import Step


class ReplanMode(StrEnum):
    """The re-plan policies (see the module docstring)."""

    NEVER = "never"
    AUTO = "auto"
    EVERY = "every"


REPLAN_MODES = tuple(ReplanMode)


@dataclass(frozen=True)
class ReplanPolicy:
    """When to re-plan: ``mode`` (``REPLAN_MODES``); ``every``: steps between re-plans (``every``) or
    between checks (``auto``); ``window``: steps the measured share spans; ``margin``: the share's fall
    beyond chance that counts as drift (and the least gain in share worth a move)."""

    mode: ReplanMode = ReplanMode.NEVER
    every: int = 100
    window: int = 100
    margin: float = 0.02

    def __post_init__(self) -> None:
        if self.mode not in REPLAN_MODES:
            raise ValueError(f"re-plan mode '{self.mode}': expected one of {', '.join(REPLAN_MODES)}")
        object.__setattr__(self, "mode", ReplanMode(self.mode))  # a mode given by its name
        if self.every <= 0 or self.window <= 0 or not 0 <= self.margin < 1:
            raise ValueError(
                f"re-plan every {self.every} steps over a window of {self.window}, margin {self.margin}: "
                "steps must be positive, the margin a share in [0, 1)"
            )


@dataclass(frozen=True)
class ReplanDecision:
    """What a check found: the measured and the planned share, whether the share has clearly fallen,
    the proposed hot set (None when none was computed) with both hot sets' shares on the same inputs
    (``Replanner.decide``'s) and the share it gains beyond chance (``gained``: the 95% lower bound of
    the change, 0 when not above it), the rows that would move (either way) and their bytes with
    optimizer state, the seconds the move would save over the rest of the run and what it costs, the
    verdict, and the recent counts the proposed hot set came from (they plan it)."""

    measured: ShareEstimate
    planned: ShareEstimate
    drifted: bool
    hot_set: HotSet | None = None
    current: ShareEstimate | None = None
    proposed: ShareEstimate | None = None
    gained: float = 0.0
    rows_moved: int = 0
    bytes_moved: int = 0
    gain_seconds: float = 0.0
    cost_seconds: float = 0.0
    replan: bool = False
    recent: AccessStats | None = None

    def proposal(self) -> tuple[HotSet, AccessStats, ShareEstimate]:
        """The proposed hot set, the recent counts it came from and its share: what a move takes."""
        if self.hot_set is None or self.recent is None or self.proposed is None:
            raise ValueError("the check proposed no hot set")
        return self.hot_set, self.recent, self.proposed

    def __str__(self) -> str:
        text = f"hot-input share {self.measured} against the plan's {self.planned}"
        if self.drifted:
            text += ": clearly below"
        if self.proposed is not None and self.current is not None:
            text += (
                f"; compared on {self.current.num_inputs} inputs: {100 * self.current.share:.1f}% hot now, "
                f"{100 * self.proposed.share:.1f}% with the recent hot set ({100 * self.gained:.1f} points "
                f"gained beyond chance; {self.rows_moved} rows, {self.bytes_moved} bytes to move; "
                f"saves {self.gain_seconds:.1f} s, costs {self.cost_seconds:.1f} s)"
            )
        return text + ("; re-planning" if self.replan else "")


class Replanner:
    """Watches the hot-input share of the steps trained and decides when to re-plan.

    Args:
        counts: the recent access counts, updated by the caller every step.
        hot_set: the hot set trained with now.
        planned: the plan's estimated share for it (``estimate_hot_share`` of its profile).
        budget: the hot set's byte budget (FAE's knob), kept for the new hot set.
        optimizer_class: the embedding optimizer, whose state a hot row's bytes include.
        policy: when to re-plan.
    """

    def __init__(
        self,
        counts: RecentAccessCounts,
        hot_set: HotSet,
        planned: ShareEstimate,
        budget: int,
        optimizer_class: type[torch.optim.Optimizer] | None,
        policy: ReplanPolicy,
    ) -> None:
        self.counts, self.hot_set, self.planned = counts, hot_set, planned
        self.budget, self.optimizer_class, self.policy = budget, optimizer_class, policy
        self._window: deque[tuple[int, int]] = deque(maxlen=policy.window)

    def observe(self, step: Step) -> None:
        """Count a trained step's inputs (all ranks') and those of them from the hot part."""
        spans = [span for spans in step.spans for span in spans]
        inputs = sum(stop - start for _, start, stop in spans)
        self._window.append((inputs, sum(stop - start for part, start, stop in spans if part == HOT)))

    def measured(self) -> ShareEstimate:
        """The share of hot inputs over the window's steps."""
        inputs, hot = np.sum(np.array(self._window, dtype=np.int64).reshape(-1, 2), axis=0)
        return measured_share(int(hot), max(int(inputs), 1))

    def due(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) is a check (``auto``, once the window is full) or a
        re-plan (``every``)."""
        if self.policy.mode == ReplanMode.NEVER or step % self.policy.every:
            return False
        return self.policy.mode == ReplanMode.EVERY or len(self._window) == self.policy.window

    def decide(
        self,
        remaining_inputs: int,
        inputs_per_step: int,
        hot_step_seconds: float,
        cold_step_seconds: float,
        cost_seconds: float,
        upcoming: Holdout | None = None,
    ) -> ReplanDecision:
        """Check now: drift, the proposed hot set, its gain over the ``remaining_inputs`` left to train
        at the given step times and ``cost_seconds`` of a re-plan, and the policy's verdict. Both hot
        sets are compared on ``upcoming`` (a sample of the inputs left to train), or, when None, on
        the recent held-out inputs."""
        measured = self.measured()
        drifted = clearly_below(measured, self.planned, self.policy.margin)
        if self.policy.mode == ReplanMode.AUTO and not drifted:
            return ReplanDecision(measured, self.planned, drifted)
        recent = self.counts.stats()
        proposed_set = recent.hot_set(self.budget, self.optimizer_class)
        change = compare_hot_sets(
            recent.holdout if upcoming is None else upcoming, self.hot_set, proposed_set
        )
        moved = [
            np.setxor1d(old, new) for old, new in zip(self.hot_set.hot_ids, proposed_set.hot_ids, strict=True)
        ]
        rows = np.array([len(m) for m in moved], dtype=np.int64)
        row_bytes = self.hot_set.layout.row_bytes(self.optimizer_class)
        gained = max(0.0, change.low)
        gain = remaining_inputs * gained * (cold_step_seconds - hot_step_seconds) / inputs_per_step
        changed = bool(rows.sum())
        if self.policy.mode == ReplanMode.EVERY:
            replan = changed and gained > 0
        else:
            replan = changed and gained > self.policy.margin and gain > cost_seconds
        decision = ReplanDecision(
            measured, self.planned, drifted, proposed_set, change.before, change.after, gained,
            int(rows.sum()), int(rows @ row_bytes), gain, cost_seconds, replan, recent,
        )  # fmt: skip
        return decision

    def moved_to(self, hot_set: HotSet, planned: ShareEstimate) -> None:
        """After a re-plan: the new hot set and its estimated share; the window starts again."""
        self.hot_set, self.planned = hot_set, planned
        self._window.clear()
