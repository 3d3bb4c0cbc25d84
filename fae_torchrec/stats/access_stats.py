"""What a profile found: per-table access counts of the sampled inputs, and a holdout of unseen inputs."""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.stats.ranking import RowRanking
from fae_torchrec.tables import TableLayout


@dataclass(frozen=True)
class AccessStats:
    """Access counts of the rows of each table, from ``num_sampled`` of ``num_inputs`` inputs.

    Kept as sparse as a sample is: per table, the ids the sample saw (``seen_rows``, ascending) and
    their counts (``seen_counts``, each above 0); a row not listed was never seen. Memory grows with
    the rows seen, not the tables' rows (a re-plan's statistics sit beside the run's first ones).
    """

    tables: tuple[EmbeddingBagConfig, ...]
    seen_rows: tuple[np.ndarray, ...]
    seen_counts: tuple[np.ndarray, ...]
    num_inputs: int
    num_sampled: int
    holdout: Holdout

    def __post_init__(self) -> None:
        if not len(self.seen_rows) == len(self.seen_counts) == len(self.tables):
            raise ValueError(
                f"{len(self.seen_rows)} row and {len(self.seen_counts)} count arrays "
                f"for {len(self.tables)} tables"
            )
        for config, rows, counts in zip(self.tables, self.seen_rows, self.seen_counts, strict=True):
            if rows.ndim != 1 or rows.shape != counts.shape or len(rows) > config.num_embeddings:
                raise ValueError(
                    f"table {config.name}: seen rows of shape {rows.shape} and counts of shape "
                    f"{counts.shape} for a table of {config.num_embeddings} rows"
                )

    @classmethod
    def of_counts(
        cls,
        tables: Sequence[EmbeddingBagConfig],
        counts: Sequence[np.ndarray],
        num_inputs: int,
        num_sampled: int,
        holdout: Holdout,
    ) -> AccessStats:
        """The statistics of per-table ``counts`` of every row (0: never seen), as a profiler keeps them."""
        seen = [np.flatnonzero(c) for c in counts]
        return cls(
            tables=tuple(tables),
            seen_rows=tuple(seen),
            seen_counts=tuple(c[ids].astype(np.int64) for c, ids in zip(counts, seen, strict=True)),
            num_inputs=num_inputs,
            num_sampled=num_sampled,
            holdout=holdout,
        )

    @cached_property
    def layout(self) -> TableLayout:
        return TableLayout(self.tables)

    @property
    def sample_fraction(self) -> float:
        return self.num_sampled / self.num_inputs

    def ranking(self, optimizer_class: type[torch.optim.Optimizer] | None = None) -> RowRanking:
        """All sampled rows ranked together, with row costs for ``optimizer_class``."""
        offsets = self.layout.row_offsets
        rows = np.concatenate([ids + offset for ids, offset in zip(self.seen_rows, offsets, strict=False)])
        return RowRanking.of_counted(
            rows, np.concatenate(self.seen_counts), self.layout, self.holdout, optimizer_class
        )

    def hot_set(
        self, budget_bytes: int, optimizer_class: type[torch.optim.Optimizer] | None = None
    ) -> HotSet:
        """FAE's hot set: the most accessed rows of all tables that fit ``budget_bytes``.

        A row costs its weights plus its ``optimizer_class`` state (TorchRec's accounting). A budget
        of 0 gives no hot row; a budget that holds every table makes every row hot; below that, a row
        never seen in the sample is never hot.
        """
        return self.ranking(optimizer_class).hot_set(budget_bytes)

    def hot_set_by_share(self, threshold: float = 0.001) -> HotSet:
        """The per-table alternative: rows with at least ``threshold`` of their table's accesses."""
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"share threshold must be in (0, 1], got {threshold}")
        hot = [
            ids[counts >= threshold * counts.sum()]
            for ids, counts in zip(self.seen_rows, self.seen_counts, strict=True)
        ]
        return HotSet(self.layout.configs, tuple(hot))

    def for_tables(self, tables: Sequence[EmbeddingBagConfig], name: str) -> AccessStats:
        """These statistics tied to ``tables``' config objects; ``ValueError`` naming ``name`` (their file,
        the option that gave them) and the first table that differs unless both describe the same tables."""
        _check_same_tables(name, self.layout.describe(), TableLayout.of(tables).describe())
        return replace(self, tables=tuple(tables))

    def with_embedding_dim(self, embedding_dim: int) -> AccessStats:
        """The same counts for tables of another embedding dimension (counts do not depend on it)."""
        tables = tuple(replace(t, embedding_dim=embedding_dim) for t in self.tables)
        return replace(self, tables=tables)

    def table_accesses(self) -> np.ndarray:
        """Sampled accesses per table."""
        return np.array([c.sum() for c in self.seen_counts], dtype=np.int64)

    def save(self, path: str | os.PathLike) -> None:
        """Write everything to one compressed npz file at exactly ``path`` (tables as JSON, seen rows
        and their counts, holdout)."""
        with open(path, "wb") as file:
            arrays: dict[str, Any] = dict(
                tables=np.array(json.dumps(self.layout.describe())),
                num_inputs=self.num_inputs,
                num_sampled=self.num_sampled,
                holdout_rows=self.holdout.rows,
                holdout_owners=self.holdout.owners,
                holdout_inputs=self.holdout.num_inputs,
                **{f"rows_{i}": r for i, r in enumerate(self.seen_rows)},
                **{f"counts_{i}": c for i, c in enumerate(self.seen_counts)},
            )
            np.savez_compressed(file, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, tables: list[EmbeddingBagConfig] | None = None) -> AccessStats:
        """Read a ``.npz`` written by :meth:`save`.

        With ``tables``, raise ``ValueError`` unless the file describes exactly those tables (names,
        rows, dims and features, in order); the stats are then tied to these config objects. A file
        that is not such a statistics file or is damaged (truncated, garbage, negative counts, no
        sampled input, inconsistent shapes or holdout) is a ``ValueError`` naming it.
        """
        data = _read_npz(path)
        described = _described_tables(path, data)
        if tables is None:
            tables = [
                EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=list(f))
                for name, rows, dim, f in described
            ]
        else:
            _check_same_tables(path, described, TableLayout.of(tables).describe())
        num_inputs, num_sampled, held = (
            _count(path, data, key) for key in ("num_inputs", "num_sampled", "holdout_inputs")
        )
        if not 0 < num_sampled <= num_inputs:
            raise ValueError(f"{path}: damaged: {num_sampled} sampled of {num_inputs} inputs")
        if held > num_inputs - num_sampled:
            raise ValueError(
                f"{path}: damaged: a holdout of {held} inputs, but {num_inputs - num_sampled} unsampled"
            )
        seen = [_seen(path, data, i, name, rows) for i, (name, rows, _, _) in enumerate(described)]
        rows, owners = _integers(path, data, "holdout_rows"), _integers(path, data, "holdout_owners")
        total_rows = sum(r for _, r, _, _ in described)
        if rows.shape != owners.shape:
            raise ValueError(f"{path}: damaged: {len(rows)} holdout rows but {len(owners)} owners")
        if len(rows) and not (
            0 <= rows.min() and rows.max() < total_rows and 0 <= owners.min() and owners.max() < held
        ):
            raise ValueError(
                f"{path}: damaged: holdout rows outside [0, {total_rows}) or owners outside [0, {held})"
            )
        return cls(
            tables=tuple(tables),
            seen_rows=tuple(ids for ids, _ in seen),
            seen_counts=tuple(counts for _, counts in seen),
            num_inputs=num_inputs,
            num_sampled=num_sampled,
            holdout=Holdout(rows=rows, owners=owners, num_inputs=held),
        )


def _read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the npz file at ``path``; ``ValueError`` naming it when it cannot be read as one
    (``FileNotFoundError`` when it does not exist)."""
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not a statistics file written by `fae-torchrec profile`")
    try:
        with open(path, "rb") as file:
            if file.read(4) != b"PK\x03\x04":
                raise ValueError("not an npz (zip) file")
            file.seek(0)
            with np.load(file, allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"{path}: not a statistics file written by `fae-torchrec profile`, or damaged: {error}"
        ) from error


def _seen(
    path: str | os.PathLike, data: dict[str, np.ndarray], index: int, name: str, num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Table ``index``'s seen rows and their counts, checked: ids ascending, each once, within its
    ``num_rows``, and as many counts, each above 0."""
    ids, counts = _integers(path, data, f"rows_{index}"), _integers(path, data, f"counts_{index}")
    if ids.shape != counts.shape:
        raise ValueError(f"{path}: damaged: table {name} has {len(ids)} seen rows but {len(counts)} counts")
    if len(ids) and not (0 <= ids[0] and ids[-1] < num_rows and np.all(ids[1:] > ids[:-1])):
        raise ValueError(
            f"{path}: damaged: table {name}'s seen rows are not ascending ids of its {num_rows} rows"
        )
    if len(counts) and counts.min() <= 0:
        raise ValueError(
            f"{path}: damaged: table {name} has a count of {int(counts.min())} "
            f"(row {int(ids[np.argmin(counts)])}); a seen row counts at least 1"
        )
    return ids.astype(np.int64, copy=False), counts.astype(np.int64, copy=False)


def _array(path: str | os.PathLike, data: dict[str, np.ndarray], key: str) -> np.ndarray:
    if key not in data:
        raise ValueError(f"{path}: not a statistics file written by `fae-torchrec profile`: no {key!r}")
    return data[key]


def _integers(path: str | os.PathLike, data: dict[str, np.ndarray], key: str) -> np.ndarray:
    """The 1-D integer array ``key``."""
    array = _array(path, data, key)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path}: damaged: {key} is {array.dtype} of shape {array.shape}, not 1-D integers")
    return array


def _count(path: str | os.PathLike, data: dict[str, np.ndarray], key: str) -> int:
    """The non-negative integer scalar ``key``."""
    array = _array(path, data, key)
    if array.shape != () or not np.issubdtype(array.dtype, np.integer) or array < 0:
        raise ValueError(f"{path}: damaged: {key} is {array!r}, not a non-negative integer")
    return int(array)


def _described_tables(path: str | os.PathLike, data: dict[str, np.ndarray]) -> list[tuple]:
    """The tables the file describes, as ``(name, rows, dim, features)``."""
    text = str(_array(path, data, "tables"))
    try:
        described = [
            (str(name), int(rows), int(dim), tuple(str(f) for f in features))
            for name, rows, dim, features in json.loads(text)
        ]
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: damaged: unreadable table descriptions ({error})") from error
    bad = [t for t in described if t[1] < 1 or t[2] < 1]
    if bad:
        raise ValueError(f"{path}: damaged: table {bad[0][0]} has {bad[0][1]} rows of dim {bad[0][2]}")
    return described


def _check_same_tables(path: str | os.PathLike, in_file: list, in_model: list) -> None:
    """Raise, naming the first table that differs, unless both describe the same tables."""
    if in_file == in_model:
        return
    for index, (a, b) in enumerate(zip(in_file, in_model, strict=False)):
        if a != b:
            raise ValueError(
                f"{path}: statistics are for other tables: table #{index} is "
                f"(name, rows, dim, features)={a} in the file but {b} in the model"
            )
    raise ValueError(
        f"{path}: statistics are for other tables: the file has {len(in_file)} tables, "
        f"the model {len(in_model)}"
    )
