"""What a profile found: per-table access counts of the sampled inputs, and a holdout of unseen inputs."""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.stats.paged import read_paged
from fae_torchrec.stats.ranking import RowRanking
from fae_torchrec.tables import TableLayout


@dataclass(frozen=True)
class AccessStats:
    """Access counts per row of each table, from ``num_sampled`` of ``num_inputs`` inputs."""

    tables: tuple[EmbeddingBagConfig, ...]
    counts: tuple[np.ndarray, ...]
    num_inputs: int
    num_sampled: int
    holdout: Holdout

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.tables):
            raise ValueError(f"{len(self.counts)} count arrays for {len(self.tables)} tables")
        for config, counts in zip(self.tables, self.counts, strict=True):
            if counts.shape != (config.num_embeddings,):
                raise ValueError(
                    f"table {config.name}: counts of shape {counts.shape}, "
                    f"expected ({config.num_embeddings},)"
                )

    @cached_property
    def layout(self) -> TableLayout:
        return TableLayout(self.tables)

    @cached_property
    def seen_rows(self) -> tuple[np.ndarray, ...]:
        """Per table, the ids of the rows the sample saw (count above 0), ascending."""
        return tuple(np.flatnonzero(counts) for counts in self.counts)

    @property
    def sample_fraction(self) -> float:
        return self.num_sampled / self.num_inputs

    def ranking(self, optimizer_class: type[torch.optim.Optimizer] | None = None) -> RowRanking:
        """All sampled rows ranked together, with row costs for ``optimizer_class``."""
        return RowRanking(self.counts, self.layout, self.holdout, optimizer_class)

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
        return self.ranking().hot_set_by_share(threshold)

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
        return np.array([c.sum() for c in self.counts], dtype=np.int64)

    def save(self, path: str | os.PathLike) -> None:
        """Write everything to one compressed npz file at exactly ``path`` (tables as JSON, counts,
        holdout)."""
        with open(path, "wb") as file:
            np.savez_compressed(
                file,
                tables=np.array(json.dumps(self.layout.describe())),
                num_inputs=self.num_inputs,
                num_sampled=self.num_sampled,
                holdout_rows=self.holdout.rows,
                holdout_owners=self.holdout.owners,
                holdout_inputs=self.holdout.num_inputs,
                **{f"counts_{i}": c for i, c in enumerate(self.counts)},
            )

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
        counts = []
        for i, (name, rows, _, _) in enumerate(described):
            array = _integers(path, data, f"counts_{i}")
            if array.shape != (rows,):
                raise ValueError(
                    f"{path}: damaged: table {name} has {rows} rows but counts of shape {array.shape}"
                )
            if len(array) and array.min() < 0:
                raise ValueError(
                    f"{path}: damaged: table {name} has negative counts (row {int(np.argmin(array))})"
                )
            counts.append(array)
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
            counts=tuple(counts),
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
                return {key: _read_member(npz, key) for key in npz.files}
    except FileNotFoundError:
        raise
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"{path}: not a statistics file written by `fae-torchrec profile`, or damaged: {error}"
        ) from error


def _read_member(npz: np.lib.npyio.NpzFile, key: str) -> np.ndarray:
    """Array ``key`` of ``npz``; count arrays (one entry per row of a table) go into memory that
    grows with their non-zero entries (``read_paged``), the others are read as ``np.load`` reads."""
    name = f"{key}.npy"
    if key.startswith("counts_") and name in npz.zip.namelist():
        with npz.zip.open(name) as member:
            counts = read_paged(member)
        if counts is not None:
            return counts
    return npz[key]


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
