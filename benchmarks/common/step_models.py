"""bench_traffic's step models: each plan's step at one grid point, and FAE against TorchRec's best.

Two models price a step (ms per step, per GPU batch):

- ``perf``: TorchRec's perf model, each planner's own prediction; FAE's is ``share x hot step + (1 -
  share) x cold step`` with its knob's estimated share;
- a traffic model per PCIe generation: each plan's own layout priced by TorchRec's perf model with every
  row in HBM, plus the busiest link's bytes of a step over the bandwidth, or the larger of the two
  where the prefetch pipeline overlaps them; FAE's cold steps carry all of its traffic, its hot steps
  none (the share measured on the replayed stream).

``Terms`` adds what both leave out, as stated assumptions: the cache machinery's fixed cost per cache
and step (FBGEMM's linearize, unique, lookup, prefetch and insert kernels run for every cache a step
looks up: every step of TorchRec's cached plans, FAE's cold steps only), the dense part of a step (the
same for every plan), and an effective bandwidth below the link's theoretical one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from itertools import pairwise

import numpy as np

#: FAE's plans: its knob with the caches planned for the prefetch pipeline (the planner's default) and
#: without it, and the hot set the knob chose without it, its caches planned for the prefetch pipeline.
FAE = ("FAE pp", "FAE", "FAE hot")
#: "FAE hot" trained by a pipeline that looks ahead to the next cold batch and fetches its misses during
#: the hot steps before it (``FAEPrefetchTrainPipeline``, which looks 8 batches ahead by default).
LOOKAHEAD = "FAE la"
#: FAE's plans as they train.
FAE_STEPS = ("FAE pp", "FAE hot", LOOKAHEAD, "FAE")
#: FAE's plans whose transfers the prefetch pipeline overlaps with the step.
FAE_PIPELINED = ("FAE pp", "FAE hot", LOOKAHEAD)
#: Steps of the random order of hot and cold steps over which FAE's prefetch pipelines are timed.
ORDER_STEPS = 2048
#: Host-device bandwidth per direction of one GPU's link, bytes/s (theoretical: 16 and 32 GT/s x 16
#: lanes, 128b/130b encoding).
PCIE = {"Gen4": 31.5e9, "Gen5": 63.0e9}
#: The step models: TorchRec's perf model, and the traffic model at each PCIe generation.
STEP_MODELS = ("perf", *PCIE)
#: Ratios of TorchRec's best step to FAE's within which FAE is level with it; above, FAE wins.
LEVEL = 0.02


@dataclass(frozen=True)
class Terms:
    """What the step models leave out, as stated assumptions: the cache machinery's fixed cost per
    cache and step (ms), the dense part of a step (ms) and the effective host-device bandwidth as a
    share of the link's theoretical one."""

    machinery_ms: float = 0.0
    dense_ms: float = 0.0
    bandwidth_share: float = 1.0


@dataclass(frozen=True)
class FAEFigures:
    """What one FAE plan predicts at a grid point: its hot budget, the hot-input share the knob
    estimated and the share measured on the counted inputs, and TorchRec's perf model's hot step and
    cold step of its layout with every cold row priced as in HBM (ms)."""

    @property
    def hot_rows(self) -> bool:
        """Whether the plan keeps hot rows: only then is a gain FAE's."""
        return self.hot_budget > 0

    hot_budget: int
    hot_share: float
    measured_share: float
    hot_step: float
    cold_step_in_hbm: float
    #: The TorchRec configuration the plan is, where the knob kept no hot rows and chose one.
    torchrec_config: str | None = None


@dataclass(frozen=True)
class Point:
    """Figures of one grid point at one stream length. Traffic is bytes per input after the warm-up
    (``traffic``: both directions, all ranks; ``link``: the busiest rank's link in its busier
    direction; ``direct``: the same of the bytes the lookup kernels move themselves, which no prefetch
    hides: ``fused_uvm`` rows, conflict misses, lost hits); ``step`` is TorchRec's perf model (ms),
    ``in_hbm`` each TorchRec plan's layout priced by it with every row in HBM, ``fae`` FAE's plans, and
    ``caches`` per plan the most caches on one rank (each runs FBGEMM's cache machinery every step it
    is looked up in). TorchRec's plans are its configurations that placed, by name
    (``planner.torchrec_configs``; the keys of ``in_hbm``)."""

    dim: int
    world_size: int
    hbm_cap: int
    num_inputs: int
    global_batch: int
    fae: dict[str, FAEFigures]
    traffic: dict[str, float]
    link: dict[str, float]
    step: dict[str, float]
    in_hbm: dict[str, float]
    caches: dict[str, int] = field(default_factory=dict)
    direct: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, saved: dict) -> Point:
        """A point as ``dataclasses.asdict`` wrote it (``bench_traffic``'s ``traffic_points.json``)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known} | {
            "fae": {name: FAEFigures(**figures) for name, figures in saved["fae"].items()}
        })  # fmt: skip

    @property
    def key(self) -> tuple[int, int, int]:
        return self.dim, self.world_size, self.hbm_cap

    def layout(self, plan: str, model: str) -> float:
        """The step of ``plan``'s own layout with every row in HBM (ms): what is left when its
        host-device traffic costs nothing. FAE's at the share ``model`` prices it with."""
        if plan == "c":
            return self.step["c"]
        if plan not in FAE_STEPS:
            return self.in_hbm[plan]
        share, fae = self._share(plan, model), self.figures(plan)
        return share * fae.hot_step + (1.0 - share) * fae.cold_step_in_hbm

    @property
    def torchrec(self) -> tuple[str, ...]:
        """TorchRec's configurations that placed at this point."""
        return tuple(self.in_hbm)

    @property
    def plans(self) -> tuple[str, ...]:
        """The plans the point has: FAE's, TorchRec's configurations that placed, and (c)."""
        return (*FAE_STEPS, *self.torchrec, "c")

    def steps(self, model: str, terms: Terms = Terms()) -> dict[str, float]:
        """The step (ms) of every plan the point has under ``model`` ("perf", TorchRec's, or a PCIe
        generation's traffic model), with ``terms`` added."""
        return {plan: self.step_of(plan, model, terms) for plan in self.plans}

    def figures(self, plan: str) -> FAEFigures:
        """The figures of an FAE plan (look-ahead trains "FAE hot"'s plan)."""
        return self.fae[self._replayed(plan)]

    def _replayed(self, plan: str) -> str:
        """The replayed plan whose traffic and caches ``plan`` has."""
        return "FAE hot" if plan == LOOKAHEAD else plan

    def _share(self, plan: str, model: str) -> float:
        """FAE's hot-input share as ``model`` prices it: the knob's estimate for TorchRec's perf model
        (as its prediction does), the share measured on the stream for the traffic models."""
        figures = self.figures(plan)
        return figures.hot_share if model == "perf" else figures.measured_share

    def step_of(self, plan: str, model: str, terms: Terms = Terms()) -> float:
        """``plan``'s step (ms) under ``model`` with ``terms`` added."""
        # the cache machinery runs on every step that looks a cache up: FAE's cold steps only
        lookups = 1.0 - self._share(plan, model) if plan in FAE_STEPS else 1.0
        machinery = terms.machinery_ms * self.caches.get(self._replayed(plan), 0)
        if plan == "c":
            return self.step["c"] + terms.dense_ms
        if model == "perf":  # TorchRec's perf model counts a prefetch as blocking, whatever the pipeline
            return self.step[self._replayed(plan)] + terms.dense_ms + machinery * lookups
        ms_per_byte = 1e3 * self.global_batch / (PCIE[model] * terms.bandwidth_share)
        transfer = self.link[self._replayed(plan)] * ms_per_byte
        # a prefetch hides only what it moves: the lookup kernels' own host reads stay in the step
        direct = min(self.direct.get(self._replayed(plan), 0.0) * ms_per_byte, transfer)
        if plan not in FAE_STEPS:
            compute = self.in_hbm[plan] + machinery + terms.dense_ms
            if not pipelined(plan):
                return compute + transfer
            return max(compute, transfer - direct) + direct
        fae, share = self.figures(plan), self._share(plan, model)
        hot = fae.hot_step + terms.dense_ms
        cold = fae.cold_step_in_hbm + machinery + terms.dense_ms
        if share >= 1.0:
            return hot
        cold_transfer = transfer / (1.0 - share)  # the cold steps carry all of FAE's traffic
        if plan not in FAE_PIPELINED:
            return share * hot + (1.0 - share) * (cold + cold_transfer)
        cold_direct = direct / (1.0 - share)
        return pipelined_step(
            share, hot, cold + cold_direct, cold_transfer - cold_direct, plan == LOOKAHEAD, cold_direct
        )


def pipelined_step(
    share: float, hot: float, cold: float, transfer: float, lookahead: bool, direct: float = 0.0
) -> float:
    """The mean step (ms) of FAE's steps under a prefetch pipeline, timed over ``ORDER_STEPS`` steps hot
    at random with probability ``share`` (one fixed order): a cold step runs once the step before it has
    ended and its ``transfer`` has; the link moves one transfer at a time. TorchRec's prefetch pipeline
    (one step ahead) starts a cold step's transfer when the step before it starts; ``lookahead`` starts
    it when the cold step before it has ended if that is earlier, so that the hot steps between hide it.
    A cold step's ``direct`` ms (part of ``cold``: the lookup kernels' own host reads) hold the link as
    the step starts."""
    kinds = _hot_order(share)
    now = link = previous_start = last_cold_end = 0.0
    for is_hot in kinds:
        if is_hot:
            previous_start, now = now, now + hot
            continue
        trigger = min(previous_start, last_cold_end) if lookahead else previous_start
        link = max(link, trigger) + transfer
        previous_start = max(now, link)
        link = previous_start + direct
        now = last_cold_end = previous_start + cold
    return now / ORDER_STEPS


def copy_ahead_step(share: float, hot: float, cold: float, transfer: float, ahead: int) -> float:
    """The mean step (ms) of a planned cold tier's steps, timed over ``ORDER_STEPS`` steps hot at random
    with probability ``share`` (``pipelined_step``'s order): each cold step's copies (``transfer`` ms on
    the link, one at a time) start when the cold step ``ahead`` before it starts (the first ``ahead``
    at the start), and the step runs once they and the step before it have ended; ``ahead`` 0: they
    start when the step before it ends, and the step waits for them."""
    kinds = _hot_order(share)
    now = link = 0.0
    cold_starts: list[float] = []
    for is_hot in kinds:
        if is_hot:
            now += hot
            continue
        if not ahead:
            trigger = now
        else:
            trigger = cold_starts[-ahead] if len(cold_starts) >= ahead else 0.0
        link = max(link, trigger) + transfer
        cold_starts.append(max(now, link))
        now = cold_starts[-1] + cold
    return now / ORDER_STEPS


def tier_step(
    point: Point,
    link: float,
    model: str,
    ahead: int,
    *,
    hot_rows: bool,
    terms: Terms = Terms(),
    host_ms: float = 0.0,
) -> float:
    """A planned cold tier's mean step (ms) at ``point`` under ``model``'s traffic model (a PCIe
    generation): FAE pp's layout, its cold tables plain slot tables (priced as in HBM, with no cache
    machinery), every step cold without ``hot_rows``; its copies, ``link`` bytes per input on the busiest
    rank's link in its busier direction, carried by the cold steps and run ``ahead`` cold steps early
    (:func:`copy_ahead_step`); ``host_ms``, the host's own work per cold step (the plan and the remap),
    added to each cold step."""
    fae = point.figures("FAE pp")
    share = fae.measured_share if hot_rows else 0.0
    hot = fae.hot_step + terms.dense_ms
    cold = fae.cold_step_in_hbm + terms.dense_ms + host_ms
    if share >= 1.0:
        return hot
    ms_per_byte = 1e3 * point.global_batch / (PCIE[model] * terms.bandwidth_share)
    return copy_ahead_step(share, hot, cold, link * ms_per_byte / (1.0 - share), ahead)


def transfer_bound(point: Point, plan: str, model: str, terms: Terms = Terms()) -> bool:
    """Whether TorchRec's configuration ``plan`` at ``point`` is transfer-bound under ``model``'s traffic
    model: its step's host-device transfers take longer than the rest of it (its layout's step with every
    row in HBM, the cache machinery and the dense part)."""
    ms_per_byte = 1e3 * point.global_batch / (PCIE[model] * terms.bandwidth_share)
    machinery = terms.machinery_ms * point.caches.get(plan, 0)
    return point.link[plan] * ms_per_byte > point.in_hbm[plan] + machinery + terms.dense_ms


def _hot_order(share: float) -> list[bool]:
    """The fixed random order of ``ORDER_STEPS`` steps, each hot (True) with probability ``share``, over
    which FAE's pipelined steps are timed."""
    return (np.random.default_rng(0).random(ORDER_STEPS) < share).tolist()


def pipelined(plan: str) -> bool:
    """Whether ``plan``'s transfers overlap its steps: FAE's prefetch pipelines, and TorchRec's
    configurations planned for the prefetch pipeline (``pp`` in their names)."""
    return plan in FAE_PIPELINED or "pp" in plan.split()


def torchrec_best(steps: dict[str, float]) -> float:
    """The shortest step of TorchRec's own configurations among ``steps``."""
    return steps[best_plan(steps)]


def best_plan(steps: dict[str, float]) -> str:
    """Which of TorchRec's own configurations among ``steps`` (every plan but FAE's and (c)) has the
    shortest step."""
    return min((name for name in steps if name not in (*FAE_STEPS, "c")), key=steps.__getitem__)


def decision(ratio: float, hot_rows: bool = True) -> str:
    """FAE against TorchRec's best, by the ratio of their steps (best / FAE). A plan without hot rows
    is one of TorchRec's configurations, the planner's choice and not FAE's: it wins nothing (level,
    or a loss where it is slower)."""
    if ratio < 1 - LEVEL:
        return "lose"
    return "win" if ratio > 1 + LEVEL and hot_rows else "level"


def deciding_term(point: Point, fae: str, model: str, terms: Terms = Terms()) -> str:
    """What decides FAE against TorchRec's best under ``model``: the difference of their layouts'
    steps with every row in HBM ("layout": lookups, collectives, a hot step's skipped cold part), or of
    what keeping rows in host memory adds on top ("offload": the caches' pricing under TorchRec's perf
    model, exposed transfers under a traffic model, and the cache machinery), whichever is larger."""
    steps = point.steps(model, terms)
    best = best_plan(steps)
    layout = point.layout(best, model) - point.layout(fae, model)
    offload = (steps[best] - point.layout(best, model)) - (steps[fae] - point.layout(fae, model))
    return "layout" if abs(layout) >= abs(offload) else "offload"


def break_even(points: list[Point], fae: str, model: str, target: float, terms: Terms, top: float) -> list:
    """Per point, the smallest cache machinery cost per cache and step (ms, up to ``top``) at which FAE's
    step is ``target`` times shorter than TorchRec's best under ``model`` with ``terms`` (found on a grid
    of 50 steps, then by bisection to a thousandth of ``top``), or None where no cost up to ``top`` gets
    there."""
    found = []
    for point in points:

        def reaches(cost: float, point: Point = point) -> bool:
            charged = replace(terms, machinery_ms=cost)
            best = min(point.step_of(name, model, charged) for name in point.torchrec)
            return best / point.step_of(fae, model, charged) >= target

        grid = np.linspace(0.0, top, 51)
        first = next((i for i, cost in enumerate(grid) if reaches(cost)), None)
        if first is None or first == 0:
            found.append(None if first is None else 0.0)
            continue
        low, high = grid[first - 1], grid[first]
        while high - low > top / 1000:
            middle = (low + high) / 2
            low, high = (low, middle) if reaches(middle) else (middle, high)
        found.append(float(high))
    return found


#: The dense part of DLRM per input, as (bottom MLP, top MLP) layer sizes by embedding dimension: the
#: DLRM paper's Criteo Kaggle configuration (dim 16) and MLPerf's Criteo Terabyte one (dim 128).
DLRM_MLPS = {
    16: ((13, 512, 256, 64, 16), (512, 256, 1)),
    128: ((13, 512, 256, 128), (1024, 1024, 512, 256, 1)),
}


def dlrm_training_flops(dim: int, num_sparse: int = 26) -> float:
    """FLOPs of DLRM's dense part per input and training step (forward and backward, the backward
    counted as twice the forward): the bottom MLP, the pairwise dot products of the ``num_sparse``
    pooled embeddings and the bottom MLP's output, and the top MLP over those and that output."""
    bottom, top = DLRM_MLPS[dim]
    vectors = num_sparse + 1
    pairs = vectors * (vectors - 1) // 2
    top_sizes = (pairs + dim, *top)
    macs = sum(a * b for a, b in pairwise(bottom))
    macs += pairs * dim + sum(a * b for a, b in pairwise(top_sizes))
    return 3 * 2.0 * macs
