"""The order of hot and cold steps in an epoch, the same on every rank.

A step is one mini-batch per rank, all hot or all cold. Hot steps take ``world_size x batch_size``
hot inputs each; the hot inputs that do not fill a last hot step join the cold stream (a cold step
runs both parts, so a hot input trains correctly there). Cold steps take the cold stream the same
way; the inputs that do not fill a last cold step are spread over the ranks of the final cold step,
whose batches grow by at most ``batch_size`` (or, with no full cold step, make up the only one).
Every input is trained on exactly once per epoch, and the whole schedule is a function of the part
sizes, the batch size, the world size, the order, the seed and the epoch: every rank computes the
same one without a collective.

Orders:
    ``phases``: all cold steps, then all hot steps (FAE's released code).
    ``shuffled``: hot and cold steps interleaved at random at the data's own ratio, and the steps of
        each kind in a random order (seeded by ``(seed, epoch)``).
    ``adaptive``: the steps of each kind in the shuffled order, hot steps in ``ADAPTIVE_RUNS`` runs
        spread evenly among the cold steps. The router halves the run length each time the
        validation loss comes out worse than the best so far (see ``BatchRouter``), down to single
        hot steps evenly interleaved with the cold ones: long hot runs are what can bias the model,
        so they are broken up exactly when accuracy suffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from fae_torchrec.stats.hot_set import COLD, HOT

ORDERS = ("phases", "shuffled", "adaptive")
#: Runs of hot steps the adaptive order starts with.
ADAPTIVE_RUNS = 8

#: A contiguous range of one part: (part, start, stop).
Span = tuple[str, int, int]


@dataclass(frozen=True)
class Step:
    """One training step: hot or cold, and for each rank the spans of the inputs it trains on."""

    hot: bool
    spans: tuple[tuple[Span, ...], ...]

    def size(self, rank: int) -> int:
        return sum(stop - start for _, start, stop in self.spans[rank])


def make_schedule(
    num_hot: int,
    num_cold: int,
    batch_size: int,
    world_size: int = 1,
    order: str = "shuffled",
    seed: int = 0,
    epoch: int = 0,
) -> list[Step]:
    """The steps of one epoch (see the module docstring)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose from {ORDERS}")
    if batch_size <= 0 or world_size <= 0:
        raise ValueError(f"batch size and world size must be positive, got {batch_size} and {world_size}")
    round_size = batch_size * world_size
    hot_steps = num_hot // round_size
    if hot_steps and 0 < num_cold + num_hot - hot_steps * round_size < world_size:
        hot_steps -= 1  # too few inputs left for every rank in a cold step: one hot step's join them
    used_hot = hot_steps * round_size
    # the cold stream: cold inputs, then the hot inputs left over from the hot steps
    stream = [(COLD, 0, num_cold), (HOT, used_hot, num_hot)]
    stream_length = num_cold + num_hot - used_hot
    if 0 < stream_length < world_size:
        raise ValueError(
            f"{stream_length} inputs left for cold steps but {world_size} ranks: every rank needs one"
        )
    bounds = _cold_step_bounds(stream_length, round_size, world_size)
    hot = [Step(True, tuple(((HOT, s * round_size + r * batch_size, s * round_size + (r + 1) * batch_size),)
                            for r in range(world_size))) for s in range(hot_steps)]  # fmt: skip
    cold = [Step(False, tuple(_cut(stream, a, b) for a, b in step)) for step in bounds]
    if order == "phases":
        return cold + hot
    rng = np.random.default_rng([seed, epoch])
    hot = [hot[i] for i in rng.permutation(len(hot))]
    cold = [cold[i] for i in rng.permutation(len(cold))]
    if order == "adaptive":
        kinds = interleave(len(hot), len(cold), initial_run(len(hot)))
    else:
        kinds = rng.permutation(np.array([True] * len(hot) + [False] * len(cold), dtype=bool)).tolist()
    return merge(hot, cold, kinds)


def initial_run(hot_steps: int) -> int:
    """The adaptive order's first run length: the hot steps in ``ADAPTIVE_RUNS`` runs."""
    return max(1, -(-hot_steps // ADAPTIVE_RUNS))


def interleave(hot_steps: int, cold_steps: int, run: int) -> list[bool]:
    """Kinds of steps (True = hot): hot steps in runs of ``run``, cold steps spread evenly around
    them (some before the first run, some after the last)."""
    runs = -(-hot_steps // run) if hot_steps else 0
    kinds: list[bool] = []
    for r in range(runs + 1):
        kinds += [False] * (cold_steps * (r + 1) // (runs + 1) - cold_steps * r // (runs + 1))
        if r < runs:
            kinds += [True] * min(run, hot_steps - r * run)
    return kinds


def merge(hot: list[Step], cold: list[Step], kinds: list[bool]) -> list[Step]:
    """The steps in the order ``kinds`` gives, each kind's steps in their own order."""
    hot_iter, cold_iter = iter(hot), iter(cold)
    return [next(hot_iter) if kind else next(cold_iter) for kind in kinds]


def _cold_step_bounds(length: int, round_size: int, world_size: int) -> list[list[tuple[int, int]]]:
    """Per cold step, per rank, the (start, stop) range of the cold stream; the last step takes the
    remainder, split as evenly as possible."""
    if length == 0:
        return []
    steps = max(length // round_size, 1)
    starts = [s * round_size for s in range(steps)] + [length]
    result = []
    for first, last in pairwise(starts):
        edges = first + (np.arange(world_size + 1) * (last - first)) // world_size
        result.append([(int(edges[r]), int(edges[r + 1])) for r in range(world_size)])
    return result


def _cut(stream: list[Span], start: int, stop: int) -> tuple[Span, ...]:
    """The spans of the parts that positions ``start..stop`` of the concatenated stream cover."""
    spans, offset = [], 0
    for part, first, last in stream:
        length = last - first
        lo, hi = max(start - offset, 0), min(stop - offset, length)
        if lo < hi:
            spans.append((part, first + lo, first + hi))
        offset += length
    return tuple(spans)
