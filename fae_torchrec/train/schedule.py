"""The order of hot and cold steps in an epoch, the same on every rank.

A step is one mini-batch per rank, all hot or all cold. Hot steps take ``world_size x batch_size``
hot inputs each; the hot inputs that do not fill a last hot step join the cold stream (a cold step
runs both parts, so a hot input trains correctly there). Cold steps take the cold stream the same
way; the inputs that do not fill a last cold step are spread over the ranks of the final cold step,
whose batches grow by at most ``batch_size`` (or, with no full cold step, make up the only one).
Every input is trained on exactly once per epoch, and the whole schedule is a function of which
inputs are hot, the batch size, the world size, the order, the seed, the warm-up and the epoch:
every rank computes the same one without a collective.

Warm-up (stream order): the first ``warmup`` share of the first epoch's blocks train in cold steps
only, their hot inputs with their cold ones. A model fresh from its initialisation is fragile: TBSM
under Adagrad sits near a constant prediction for its first tens of steps before it learns, and
FAE's hot steps, label-biased samples of the data (hot inputs click more or less often than the
rest), can keep it there for good (BENCHMARKS.md, section 6). The warm-up gives it the data's own mix
until it has left that state, at the cost of ``warmup`` of the first epoch's hot steps.

Orders:
    ``stream`` (the default): the data in blocks of one step's inputs, the blocks in a random order
        (seeded by ``(seed, epoch)``; a short last block too, so that the last step, which takes the
        remainder, holds other inputs each epoch), which is the baseline's order;
        each block's hot inputs join the hot stream and its other inputs the cold stream, and a step
        runs as soon as its stream has filled it (the last cold step, which takes the remainder,
        runs at the epoch's end). Every input trains close to where the baseline's order trains it (on
        average within a step; a hot input waits for the next hot step), hot steps come at the data's
        own rate (no runs beyond what the data has: single hot steps while under half the inputs are hot),
        and every window of steps sees the data's mix of hot and cold inputs, so the label bias of
        hot inputs (on real click logs they click less often) averages out within a few steps.
    ``time``: the stream order with the blocks in the data's order: for data in time order (days of a
        click log) trained as it came, where popularity drifts and re-planning follows it.
    ``shuffled``: hot and cold steps interleaved at random at the data's own ratio, and the steps of
        each kind in a random order (seeded by ``(seed, epoch)``).
    ``phases``: all cold steps, then all hot steps (FAE's released code).
    ``adaptive``: the steps of each kind in the shuffled order, hot steps in ``ADAPTIVE_RUNS`` runs
        spread evenly among the cold steps. The router halves the run length each time the
        validation loss comes out worse than the best so far (see ``BatchRouter``), down to single
        hot steps evenly interleaved with the cold ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from fae_torchrec.checks import check_share

# ORDERS: the step orders; STREAM_ORDERS: those that read the data in blocks, each block's inputs sorted
# into the hot and cold streams
from fae_torchrec.command_line import ORDERS, STREAM_ORDERS, Order
from fae_torchrec.data.row_chain import count_nonzero
from fae_torchrec.seeds import generator
from fae_torchrec.stats.hot_set import COLD, HOT

#: Runs of hot steps the adaptive order starts with.
ADAPTIVE_RUNS = 8

#: Inputs of ``is_hot`` the stream order counts at a time.
COUNT_CHUNK = 1 << 22
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
    is_hot: np.ndarray,
    batch_size: int,
    world_size: int = 1,
    order: str = "stream",
    seed: int = 0,
    epoch: int = 0,
    warmup: float = 0.0,
) -> list[Step]:
    """The steps of one epoch (see the module docstring). ``is_hot`` says which inputs of the data,
    in its order, are entirely hot (``HotColdPartition.is_hot``); each part keeps the data's order.
    ``warmup`` is the share of the first epoch's blocks that train in cold steps only (stream order)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order '{order}'; choose from {', '.join(ORDERS)}")
    if batch_size <= 0 or world_size <= 0:
        raise ValueError(f"batch size and world size must be positive, got {batch_size} and {world_size}")
    check_warmup(warmup, order)
    num_inputs = len(is_hot)
    round_size = batch_size * world_size
    rng = generator(seed, "schedule", epoch)
    if order in STREAM_ORDERS:
        hot_stream, cold_stream = _block_streams(
            is_hot, round_size, rng if order == Order.STREAM else None, warmup if epoch == 0 else 0.0
        )
    else:
        num_hot = count_nonzero(is_hot, chunk=COUNT_CHUNK)
        hot_stream = _Stream([HOT], [0], [num_hot])
        cold_stream = _Stream([COLD], [0], [num_inputs - num_hot])
    num_hot = len(hot_stream)
    hot_steps = num_hot // round_size
    if hot_steps and 0 < num_inputs - hot_steps * round_size < world_size:
        hot_steps -= 1  # too few inputs left for every rank in a cold step: one hot step's join them
    used_hot = hot_steps * round_size
    # the cold stream ends with the hot inputs left over from the hot steps
    cold_stream = cold_stream.followed_by(hot_stream.cut(used_hot, num_hot))
    if 0 < len(cold_stream) < world_size:
        raise ValueError(
            f"{len(cold_stream)} inputs left for cold steps but {world_size} ranks: every rank needs one"
        )
    bounds = {
        HOT: _step_bounds(used_hot, round_size, world_size),
        COLD: _step_bounds(len(cold_stream), round_size, world_size),
    }
    hot, cold = (
        [Step(part == HOT, tuple(stream.cut(a, b) for a, b in step)) for step in bounds[part]]
        for part, stream in ((HOT, hot_stream), (COLD, cold_stream))
    )
    if order in STREAM_ORDERS:
        # a step runs once the block that fills it has been read; on a tie the cold step goes first
        filled = np.concatenate(
            [
                stream.block_of([step[-1][1] for step in bounds[part]])
                for part, stream in ((COLD, cold_stream), (HOT, hot_stream))
            ]
        )
        steps = cold + hot
        return [steps[i] for i in np.argsort(filled, kind="stable")]
    return _ordered(order, hot, cold, rng)


def _ordered(order: str, hot: list[Step], cold: list[Step], rng: np.random.Generator) -> list[Step]:
    """The ``hot`` and ``cold`` steps in ``order`` (``phases``, ``shuffled`` or ``adaptive``), random
    draws from ``rng``."""
    if order == Order.PHASES:
        return cold + hot
    hot = [hot[i] for i in rng.permutation(len(hot))]
    cold = [cold[i] for i in rng.permutation(len(cold))]
    if order == Order.ADAPTIVE:
        kinds = interleave(len(hot), len(cold), initial_run(len(hot)))
    else:
        kinds = rng.permutation(np.array([True] * len(hot) + [False] * len(cold), dtype=bool)).tolist()
    return merge(hot, cold, kinds)


def trained_inputs(is_hot: np.ndarray, steps: Sequence[Step]) -> np.ndarray:
    """Which inputs of the data (its order; ``is_hot`` as for ``make_schedule``) ``steps`` train, on
    any rank: after a re-plan, the others are re-partitioned (``HotColdPartition.inputs``). Besides the
    result it holds a byte per input (which rows of each part are trained) and ``COUNT_CHUNK`` inputs of
    ``is_hot`` at a time, whatever the data's size."""
    num_inputs = len(is_hot)
    num_hot = count_nonzero(is_hot, chunk=COUNT_CHUNK)
    spans = [span for step in steps for spans in step.spans for span in spans]
    covered = {
        part: _covered(size, [(start, stop) for kind, start, stop in spans if kind == part])
        for part, size in ((HOT, num_hot), (COLD, num_inputs - num_hot))
    }
    trained = np.empty(num_inputs, dtype=bool)
    before = {HOT: 0, COLD: 0}  # rows of each part before the chunk
    for begin in range(0, num_inputs, COUNT_CHUNK):
        hot = np.asarray(is_hot[begin : begin + COUNT_CHUNK], dtype=bool)
        out = trained[begin : begin + len(hot)]
        for part, mask in ((HOT, hot), (COLD, ~hot)):
            count = int(np.count_nonzero(mask))
            out[mask] = covered[part][before[part] : before[part] + count]
            before[part] += count
    return trained


def _covered(size: int, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """A mask of ``size`` rows, true in ``ranges`` (``(start, stop)``, none overlapping another: a row
    trains once an epoch), made in one byte per row."""
    # +1 at each range's start and -1 at its stop: the running sum is 1 inside a range, 0 outside
    edges = np.zeros(size + 1, dtype=np.int8)
    np.add.at(edges, np.array([start for start, _ in ranges], dtype=np.int64), 1)
    np.add.at(edges, np.array([stop for _, stop in ranges], dtype=np.int64), -1)
    np.cumsum(edges, out=edges)
    if size and not 0 <= int(edges.min()) <= int(edges.max()) <= 1:
        raise ValueError("the steps train some inputs more than once")
    return edges[:size].view(bool)


def check_warmup(warmup: float, order: str) -> None:
    """Raise ``ValueError`` unless ``warmup`` is a share in [0, 1], and 0 for orders but ``stream``."""
    check_share(warmup, "warm-up (of the first epoch)")
    if warmup and order not in STREAM_ORDERS:
        raise ValueError(f"a warm-up is part of the stream and time orders, not of the '{order}' order")


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


def _step_bounds(length: int, round_size: int, world_size: int) -> list[list[tuple[int, int]]]:
    """Per step, per rank, the (start, stop) range of a stream of ``length`` inputs; the last step
    takes the remainder, split as evenly as possible."""
    if length == 0:
        return []
    steps = max(length // round_size, 1)
    starts = [s * round_size for s in range(steps)] + [length]
    result = []
    for first, last in pairwise(starts):
        edges = first + (np.arange(world_size + 1) * (last - first)) // world_size
        result.append([(int(edges[r]), int(edges[r + 1])) for r in range(world_size)])
    return result


def _block_streams(
    is_hot: np.ndarray, round_size: int, rng: np.random.Generator | None, warmup: float
) -> tuple[_Stream, _Stream]:
    """The stream order's hot and cold streams: the data in blocks of ``round_size`` inputs, the blocks
    (a short last one too) in a random order (in the data's order without ``rng``: the time order),
    each block's inputs sorted into its part;
    the first ``warmup`` share of the blocks read put their hot inputs in the cold stream too."""
    num_inputs = len(is_hot)
    starts = np.arange(0, num_inputs, round_size)
    full = num_inputs // round_size
    per_block = np.zeros(len(starts), dtype=np.int64)  # hot inputs per block, a chunk of blocks at a time
    chunk = round_size * max(1, COUNT_CHUNK // round_size)  # (``is_hot`` may be memory-mapped)
    for begin in range(0, full * round_size, chunk):
        rows = np.asarray(is_hot[begin : min(begin + chunk, full * round_size)]).reshape(-1, round_size)
        per_block[begin // round_size : begin // round_size + len(rows)] = np.count_nonzero(rows, axis=1)
    per_block[full:] = np.count_nonzero(is_hot[full * round_size :])
    hot_before = np.concatenate([[0], np.cumsum(per_block)])  # hot inputs before each block's start
    # the short last block among the others: the inputs the last (remainder) step takes vary by epoch
    blocks = rng.permutation(len(starts)) if rng is not None else np.arange(len(starts))
    cold_before = np.append(starts, num_inputs) - hot_before
    hot_length = hot_before[blocks + 1] - hot_before[blocks]
    warm = np.arange(len(blocks)) < round(warmup * len(blocks))
    hot = _Stream([HOT] * len(blocks), hot_before[blocks], np.where(warm, 0, hot_length))
    # each block's cold inputs, followed in a warm-up block by its hot ones: ranges in reading order
    read = np.repeat(np.arange(len(blocks)), 1 + warm)
    second = np.concatenate([[False], read[1:] == read[:-1]])
    first = blocks[read]
    cold = _Stream(
        np.where(second, HOT, COLD).tolist(),
        np.where(second, hot_before[first], cold_before[first]),
        np.where(second, hot_length[read], cold_before[first + 1] - cold_before[first]),
        read,
    )
    return hot, cold


class _Stream:
    """Ranges of the parts one after another, cut into steps by position in the stream. In the stream
    order ``blocks[i]`` is the block read whose inputs range ``i`` holds (``block_of``; by default
    range ``i`` holds the ``i``-th block's)."""

    def __init__(self, parts: list[str], starts, lengths, blocks=None) -> None:
        self.parts = list(parts)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.cumsum(np.asarray(lengths, dtype=np.int64))  # stream positions where ranges end
        self.blocks = np.arange(len(self.ends)) if blocks is None else np.asarray(blocks, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def cut(self, start: int, stop: int) -> tuple[Span, ...]:
        """The spans of the parts that positions ``start..stop`` of the stream cover."""
        spans = []
        for i in range(np.searchsorted(self.ends, start, "right"), len(self.ends)):
            offset = int(self.ends[i - 1]) if i else 0
            if offset >= stop:
                break
            lo, hi = max(start - offset, 0), min(stop, int(self.ends[i])) - offset
            if lo < hi:
                spans.append((self.parts[i], int(self.starts[i]) + lo, int(self.starts[i]) + hi))
        return tuple(spans)

    def followed_by(self, spans: tuple[Span, ...]) -> _Stream:
        """This stream, then ``spans`` (in the stream order: read after the last block)."""
        lengths = np.diff(np.concatenate([[0], self.ends]))
        after = int(self.blocks[-1]) + 1 if len(self.blocks) else 0
        return _Stream(
            self.parts + [part for part, _, _ in spans],
            np.concatenate([self.starts, np.array([start for _, start, _ in spans], dtype=np.int64)]),
            np.concatenate([lengths, np.array([stop - start for _, start, stop in spans], dtype=np.int64)]),
            np.concatenate([self.blocks, np.full(len(spans), after, dtype=np.int64)]),
        )

    def block_of(self, positions) -> np.ndarray:
        """The block whose reading brings the stream to each of ``positions`` (stream order only)."""
        return self.blocks[np.searchsorted(self.ends, np.asarray(positions, dtype=np.int64), "left")]
