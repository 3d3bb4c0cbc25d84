"""The id stream of a data set, kept small enough to replay: FAE's profile, the rows' ranks, and a
row-sampled copy of every lookup.

The profile is made on other inputs than the ones replayed, as FAE's planner would see them, and keeps
a holdout of inputs it did not sample (the planner estimates the hot-input share on it):

- DLRM (``synthetic_stream``): the synthetic data are made chunk by chunk, each chunk from its own
  seed, and the profile reads the chunks after the replayed ones. It samples 5% of an epoch (FAE
  profiles 5% of the training data; Criteo Kaggle's epoch by default), whatever the length replayed,
  so every length is measured with one hot set.
- TBSM (``taobao_stream``): a data set of a fixed size. The profile samples 20% of the training inputs
  (FAE's TBSM setting) and draws its holdout from the others; the stream is the rest of them, in
  training order.

A second pass ranks every replayed lookup's row in FAE's global order (``RowRanking``). With the top
``n`` ranked rows hot, an input is hot exactly when its worst rank is below ``n``, so one pass
serves every hot-set budget. Only lookups of rows in the replayed ``1/sampling`` of the hash space are
kept (``cache_model.sampled_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from benchmarks.common.cache_model import sampled_rows
from benchmarks.common.training_data import profile_training
from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.command_line import PROFILE_SAMPLE
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES, KAGGLE_INPUTS
from fae_torchrec.data.synthetic import CHUNK_SIZE
from fae_torchrec.data.taobao import TaobaoSource
from fae_torchrec.seeds import generator
from fae_torchrec.stats.holdout import Holdout


@dataclass(frozen=True)
class IdStream:
    """Sampled lookups of ``num_inputs`` single-hot inputs, in input order.

    ``inputs``, ``tables``, ``ids`` and ``ranks`` describe each kept lookup (its row's position in
    FAE's ranking; ``len(ranking)`` for rows the profile never saw); ``worst_rank`` is, per input, the
    largest rank among all its lookups, kept or not. ``replayed`` and ``profiled`` are the data set's
    input indices the stream and its profile read (ascending).
    """

    stats: AccessStats
    sampling: int
    num_inputs: int
    inputs: np.ndarray
    tables: np.ndarray
    ids: np.ndarray
    ranks: np.ndarray
    worst_rank: np.ndarray
    replayed: range | np.ndarray
    profiled: range | np.ndarray

    def rows(self) -> np.ndarray:
        """Global row key (table offset + id) of each kept lookup."""
        return self.stats.layout.row_offsets[self.tables] + self.ids

    def hot_inputs(self, hot_set: HotSet) -> np.ndarray:
        """Mask of the inputs that ``hot_set`` (a prefix of the ranking) makes entirely hot."""
        return self.worst_rank < self.num_hot(hot_set)

    def num_hot(self, hot_set: HotSet) -> int:
        """How many ranked rows ``hot_set`` holds (every row when it holds every table)."""
        everything = hot_set.total_hot == int(self.stats.layout.num_rows.sum())
        return np.iinfo(np.int64).max if everything else hot_set.total_hot

    def profile_overlaps(self) -> bool:
        """Whether the profile read an input the stream replays."""
        replayed, profiled = self.replayed, self.profiled
        if isinstance(replayed, range) and isinstance(profiled, range):
            return max(replayed.start, profiled.start) < min(replayed.stop, profiled.stop)
        return bool(np.isin(replayed, profiled).any())


def synthetic_stream(
    num_inputs: int,
    *,
    epoch: int = KAGGLE_INPUTS,
    scale: float = 1.0,
    seed: int = 0,
    sampling: int = 1,
    holdout_size: int = 100_000,
) -> IdStream:
    """The first ``num_inputs`` inputs of the synthetic data set of ``scale`` and ``seed``, row-sampled,
    profiled as FAE does on the chunks after them: ``PROFILE_SAMPLE["dlrm"] x epoch`` sampled inputs
    and a holdout of ``holdout_size`` others."""
    sampled = max(round(PROFILE_SAMPLE["dlrm"] * epoch), 1)
    replay_chunks = -(-num_inputs // CHUNK_SIZE)
    first = replay_chunks * CHUNK_SIZE
    profiled = range(first, first + sampled + holdout_size)
    data = SyntheticCriteo(profiled.stop, batch_size=CHUNK_SIZE, scale=scale, seed=seed)
    profiler = AccessProfiler(
        data.table_configs(), sampled / len(profiled), seed=seed, holdout_size=holdout_size
    )
    stats = profiler.profile(_columns(data, profiled), total=len(profiled), progress=True)
    replayed = range(num_inputs)
    blocks = _blocks(data, replayed)
    return _stream(stats, DEFAULT_CAT_NAMES, blocks, replay_chunks, sampling, replayed, profiled)


def taobao_stream(
    source: TaobaoSource, num_inputs: int, *, seed: int = 0, sampling: int = 1, holdout_size: int = 20_000
) -> IdStream:
    """The first ``num_inputs`` training inputs of ``source`` that FAE's profile does not read, in
    training order, row-sampled. The profile samples ``PROFILE_SAMPLE["tbsm"]`` of the training inputs
    and holds out ``holdout_size`` others, drawn at random here (the profiler's own holdout does not say
    which inputs it holds, and the stream leaves them out). Raises ``ValueError`` when fewer inputs are
    left."""
    profiler = AccessProfiler(source.table_configs(), PROFILE_SAMPLE["tbsm"], seed, holdout_size=0)
    blocks = source.split_blocks(False, None, CHUNK_SIZE)
    stats, unprofiled, sampled = profile_training(profiler, blocks, source.feature_names)
    others = np.flatnonzero(~sampled)
    drawn = generator(seed, "holdout")  # independent of the data's and the profile's draws
    held = np.zeros(len(others), dtype=bool)
    held[drawn.choice(len(others), min(holdout_size, len(others)), replace=False)] = True
    left = len(others) - int(held.sum())
    if left < num_inputs:
        raise ValueError(
            f"{num_inputs:,} inputs to replay, but the profile of the {len(sampled):,} training inputs "
            f"leaves {left:,}"
        )
    columns = _tables_of(stats, source.feature_names)
    rows = unprofiled.ids[held] + stats.layout.row_offsets[columns]
    holdout = Holdout(rows.reshape(-1), np.repeat(np.arange(len(rows)), len(columns)), len(rows))
    ids = unprofiled.ids[~held][:num_inputs]
    blocks = ((start, ids[start : start + CHUNK_SIZE]) for start in range(0, num_inputs, CHUNK_SIZE))
    replayed = others[~held][:num_inputs]
    profiled = np.sort(np.concatenate([np.flatnonzero(sampled), others[held]]))
    total = -(-num_inputs // CHUNK_SIZE)
    stats = replace(stats, holdout=holdout)
    return _stream(stats, source.feature_names, blocks, total, sampling, replayed, profiled)


def _tables_of(stats: AccessStats, feature_names: Sequence[str]) -> np.ndarray:
    """The table index of each feature."""
    return np.array([stats.layout.table_of(name) for name in feature_names])


def _stream(
    stats: AccessStats,
    feature_names: Sequence[str],
    blocks: Iterable[tuple[int, np.ndarray]],
    total: int,
    sampling: int,
    replayed: range | np.ndarray,
    profiled: range | np.ndarray,
) -> IdStream:
    """The ``IdStream`` of the ``total`` blocks of ids (each with its first input's index in the
    stream), ranked by ``stats``."""
    ranking = stats.ranking()
    rank_of_row = np.full(int(stats.layout.num_rows.sum()), len(ranking.rows), dtype=np.int64)
    rank_of_row[ranking.rows] = np.arange(len(ranking.rows))
    columns = _tables_of(stats, feature_names)
    parts: dict[str, list[np.ndarray]] = {"inputs": [], "tables": [], "ids": [], "ranks": [], "worst": []}
    for start, ids in tqdm(blocks, total=total, desc="id stream", leave=False):
        _keep(ids, start, columns, stats.layout.row_offsets, rank_of_row, sampling, parts)
    inputs, tables, ids, ranks, worst = (np.concatenate(parts[k]) for k in parts)
    return IdStream(stats, sampling, len(replayed), inputs, tables, ids, ranks, worst, replayed, profiled)


def _blocks(data: SyntheticCriteo, inputs: range) -> Iterator[tuple[int, np.ndarray]]:
    """The ids of the inputs ``inputs`` (whole chunks but the last), chunk by chunk, with the first
    input's index."""
    for chunk in range(inputs.start // CHUNK_SIZE, -(-inputs.stop // CHUNK_SIZE)):
        start = chunk * CHUNK_SIZE
        yield start, data.chunk(chunk).ids[: inputs.stop - start]


def _columns(data: SyntheticCriteo, inputs: range) -> Iterator[dict[str, np.ndarray]]:
    """The ids of the inputs ``inputs``, chunk by chunk, by feature (as the profiler reads them)."""
    for _, ids in _blocks(data, inputs):
        yield {name: ids[:, f] for f, name in enumerate(DEFAULT_CAT_NAMES)}


def _keep(
    ids: np.ndarray,
    first: int,
    columns: np.ndarray,
    row_offsets: np.ndarray,
    rank_of_row: np.ndarray,
    sampling: int,
    parts: dict[str, list[np.ndarray]],
) -> None:
    rows = ids + row_offsets[columns]
    ranks = rank_of_row[rows]
    kept = sampled_rows(rows, sampling)
    inputs, features = np.nonzero(kept)
    parts["inputs"].append(inputs + first)
    parts["tables"].append(columns[features].astype(np.int8))
    parts["ids"].append(ids[inputs, features])
    parts["ranks"].append(ranks[inputs, features].astype(np.int32))
    parts["worst"].append(ranks.max(axis=1))
