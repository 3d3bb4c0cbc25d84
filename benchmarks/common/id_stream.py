"""The id stream of a data set, kept small enough to replay: FAE's profile, the rows' ranks, and a
row-sampled copy of every lookup.

The profile is made on other inputs than the ones replayed, as FAE's planner would see them: the
synthetic data are made chunk by chunk, each chunk from its own seed, and the profile reads the chunks
after the replayed ones. It samples 5% of an epoch (FAE profiles 5% of the training data; Criteo
Kaggle's epoch by default), whatever the length replayed, so every length is measured with one hot set,
and keeps a holdout of inputs it did not sample (the planner estimates the hot-input share on it). A
second pass ranks every replayed lookup's row in FAE's global order (``RowRanking``). With the top
``n`` ranked rows hot, an input is hot exactly when its worst rank is below ``n``, so one pass
serves every hot-set budget. Only lookups of rows in the replayed ``1/sampling`` of the hash space are
kept (``cache_model.sampled_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from benchmarks.common.cache_model import sampled_rows
from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES, KAGGLE_INPUTS
from fae_torchrec.data.synthetic import CHUNK_SIZE

#: Inputs FAE's profile samples, as a share of an epoch.
PROFILE_SHARE = 0.05


@dataclass(frozen=True)
class IdStream:
    """Sampled lookups of ``num_inputs`` single-hot inputs, in input order.

    ``inputs``, ``tables``, ``ids`` and ``ranks`` describe each kept lookup (its row's position in
    FAE's ranking; ``len(ranking)`` for rows the profile never saw); ``worst_rank`` is, per input, the
    largest rank among all its lookups, kept or not. ``replayed`` and ``profiled`` are the data set's
    input indices the stream and its profile read.
    """

    stats: AccessStats
    sampling: int
    num_inputs: int
    inputs: np.ndarray
    tables: np.ndarray
    ids: np.ndarray
    ranks: np.ndarray
    worst_rank: np.ndarray
    replayed: range
    profiled: range

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
    profiled as FAE does on the chunks after them: ``PROFILE_SHARE x epoch`` sampled inputs and a
    holdout of ``holdout_size`` others."""
    sampled = max(round(PROFILE_SHARE * epoch), 1)
    replay_chunks = -(-num_inputs // CHUNK_SIZE)
    first = replay_chunks * CHUNK_SIZE
    profiled = range(first, first + sampled + holdout_size)
    data = SyntheticCriteo(profiled.stop, batch_size=CHUNK_SIZE, scale=scale, seed=seed)
    profiler = AccessProfiler(
        data.table_configs(), sampled / len(profiled), seed=seed, holdout_size=holdout_size
    )
    stats = profiler.profile(_columns(data, profiled), total=-(-len(profiled) // CHUNK_SIZE))
    ranking = stats.ranking()
    rank_of_row = np.full(int(stats.layout.num_rows.sum()), len(ranking.rows), dtype=np.int64)
    rank_of_row[ranking.rows] = np.arange(len(ranking.rows))
    columns = np.array([stats.layout.table_of(name) for name in DEFAULT_CAT_NAMES])
    parts: dict[str, list[np.ndarray]] = {"inputs": [], "tables": [], "ids": [], "ranks": [], "worst": []}
    replayed = range(num_inputs)
    for start, ids in tqdm(_blocks(data, replayed), total=replay_chunks, desc="id stream", leave=False):
        _keep(ids, start, columns, stats.layout.row_offsets, rank_of_row, sampling, parts)
    inputs, tables, ids, ranks, worst = (np.concatenate(parts[k]) for k in parts)
    return IdStream(stats, sampling, num_inputs, inputs, tables, ids, ranks, worst, replayed, profiled)


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
