"""The id stream of a data set, kept small enough to replay: FAE's profile, the rows' ranks, and a
row-sampled copy of every lookup.

Two passes over the data: the first profiles it (FAE's sample), the second ranks every lookup's row in
FAE's global order (``RowRanking``). With the top ``n`` ranked rows hot, an input is hot exactly when
its worst rank is below ``n``, so one pass serves every hot-set budget. Only lookups of rows in the
replayed ``1/sampling`` of the hash space are kept (``cache_model.sampled_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from benchmarks.common.cache_model import sampled_rows
from fae_torchrec import AccessProfiler, AccessStats, HotSet
from fae_torchrec.data import SampleBlock, SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES


@dataclass(frozen=True)
class IdStream:
    """Sampled lookups of ``num_inputs`` single-hot inputs, in input order.

    ``inputs``, ``tables``, ``ids`` and ``ranks`` describe each kept lookup (its row's position in
    FAE's ranking; ``len(ranking)`` for rows the profile never saw); ``worst_rank`` is, per input, the
    largest rank among all its lookups, kept or not.
    """

    stats: AccessStats
    sampling: int
    num_inputs: int
    inputs: np.ndarray
    tables: np.ndarray
    ids: np.ndarray
    ranks: np.ndarray
    worst_rank: np.ndarray

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
    data: SyntheticCriteo,
    sample_fraction: float = 0.05,
    sampling: int = 1,
    seed: int = 0,
) -> IdStream:
    """Profile ``data`` (single-hot) as FAE does and keep its row-sampled id stream."""
    tables = data.table_configs()
    arrays = (
        {name: block.ids[:, f] for f, name in enumerate(DEFAULT_CAT_NAMES)} for block in data.raw_blocks()
    )
    stats = AccessProfiler(tables, sample_fraction, seed=seed).profile(arrays, total=data.num_chunks)
    ranking = stats.ranking()
    rank_of_row = np.full(int(stats.layout.num_rows.sum()), len(ranking.rows), dtype=np.int64)
    rank_of_row[ranking.rows] = np.arange(len(ranking.rows))
    columns = np.array([stats.layout.table_of(name) for name in DEFAULT_CAT_NAMES])
    parts: dict[str, list[np.ndarray]] = {"inputs": [], "tables": [], "ids": [], "ranks": [], "worst": []}
    first = 0
    for block in tqdm(data.raw_blocks(), total=data.num_chunks, desc="id stream", leave=False):
        _keep(block, first, columns, stats.layout.row_offsets, rank_of_row, sampling, parts)
        first += len(block)
    inputs, tables, ids, ranks, worst = (np.concatenate(parts[k]) for k in parts)
    return IdStream(stats, sampling, first, inputs, tables, ids, ranks, worst)


def _keep(
    block: SampleBlock,
    first: int,
    columns: np.ndarray,
    row_offsets: np.ndarray,
    rank_of_row: np.ndarray,
    sampling: int,
    parts: dict[str, list[np.ndarray]],
) -> None:
    rows = block.ids + row_offsets[columns]
    ranks = rank_of_row[rows]
    kept = sampled_rows(rows, sampling)
    inputs, features = np.nonzero(kept)
    parts["inputs"].append(inputs + first)
    parts["tables"].append(columns[features])
    parts["ids"].append(block.ids[inputs, features])
    parts["ranks"].append(ranks[inputs, features])
    parts["worst"].append(ranks.max(axis=1))
