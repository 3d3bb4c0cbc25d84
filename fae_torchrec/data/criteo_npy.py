"""Streaming reader of the binary Criteo layout written by TorchRec's ``BinaryCriteoUtils.tsv_to_npys``.

A day (or file) ``PREFIX`` is three arrays: ``PREFIX_dense.npy`` (float32, ``(n, 13)``, already
log-transformed by TorchRec), ``PREFIX_sparse.npy`` (``(n, 26)`` raw categorical values) and
``PREFIX_labels.npy`` (int32, ``(n, 1)``). They are memory-mapped and read a chunk at a time; raw
categorical values become rows modulo the table sizes, as in TorchRec's
``InMemoryBinaryCriteoIterDataPipe``. A dense value that is not a finite float32 (NaN, infinite, or a
wider array's value beyond float32's range) is an error naming the file, the row and the column.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from fae_torchrec.data.block import SampleBlock, dense_problem, float32_dense
from fae_torchrec.data.criteo import (
    CAT_FEATURE_COUNT,
    INT_FEATURE_COUNT,
    KAGGLE_TABLE_SIZES,
    CriteoSource,
    single_hot_block,
)
from fae_torchrec.data.paths import as_paths


def npy_paths(prefix: str | os.PathLike) -> tuple[str, str, str]:
    """The dense, sparse and labels files of ``prefix``, named as TorchRec names them."""
    prefix = os.fspath(prefix)
    return f"{prefix}_dense.npy", f"{prefix}_sparse.npy", f"{prefix}_labels.npy"


class CriteoNpyReader(CriteoSource):
    """Streams ``Batch``es from one or more ``tsv_to_npys`` outputs, given by their prefixes.

    With ``require_labels`` (training and evaluation), a label other than 0 or 1 is an error naming
    the file and row (``tsv_to_npys`` of an unlabelled file writes -1).
    """

    def __init__(
        self,
        prefixes: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int = 2048,
        table_sizes: Sequence[int] = KAGGLE_TABLE_SIZES,
        chunk_rows: int = 1 << 16,
        require_labels: bool = False,
    ) -> None:
        super().__init__(batch_size, table_sizes)
        self.prefixes = as_paths(prefixes)
        self.chunk_rows = chunk_rows
        self.require_labels = require_labels
        self._arrays = [_open(prefix) for prefix in self.prefixes]
        self.num_samples: int = sum(len(labels) for _, _, labels in self._arrays)

    def raw_blocks(self) -> Iterator[SampleBlock]:
        return self.raw_range(0, None)

    def raw_range(self, start: int, stop: int | None) -> Iterator[SampleBlock]:
        """The rows ``start`` to ``stop`` of the files one after another, reading only those."""
        wanted, before = start, 0  # before: rows of the files before this one
        for (dense, sparse, labels), prefix in zip(self._arrays, self.prefixes, strict=True):
            first, before = before, before + len(labels)
            last = len(labels) if stop is None else min(stop - first, len(labels))
            for start in range(max(wanted - first, 0), last, self.chunk_rows):
                rows = slice(start, min(start + self.chunk_rows, last))
                raw = np.asarray(sparse[rows], dtype=np.int64)
                if (raw < 0).any():
                    row = start + int(np.argwhere(raw < 0)[0][0])
                    raise ValueError(f"{npy_paths(prefix)[1]}: row {row} has a negative value")
                if self.require_labels:
                    _check_labels(labels[rows], start, npy_paths(prefix)[2])
                values, bad = float32_dense(dense[rows])
                if bad.any():
                    row, column = np.argwhere(bad)[0]
                    raise ValueError(
                        f"{npy_paths(prefix)[0]}: row {start + row}, column {column} (I{column + 1}): "
                        f"{dense_problem(dense[start + row, column])}"
                    )
                yield single_hot_block(values, raw, labels[rows], self.table_sizes)


def _check_labels(labels: np.ndarray, start: int, path: str) -> None:
    """Raise ``ValueError`` naming ``path`` and the row unless every label is 0 or 1."""
    bad = np.flatnonzero((labels != 0) & (labels != 1))
    if len(bad):
        row = start + int(bad[0]) // labels.shape[1]
        raise ValueError(
            f"{path}: row {row} has label {labels.reshape(-1)[bad[0]]}: training and evaluation need "
            "labels 0 or 1 (unlabelled data can only be profiled and planned)"
        )


def _load(path: str) -> np.ndarray:
    """The memory-mapped array in ``path``; ``ValueError`` naming it when it is not an npy file."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as error:
        raise ValueError(f"{path}: not an npy array file: {error}") from error


def _open(prefix: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    paths = npy_paths(prefix)
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing (expected {', '.join(paths)})")
    dense, sparse, labels = (_load(path) for path in paths)
    expected = ((INT_FEATURE_COUNT,), (CAT_FEATURE_COUNT,), (1,))
    for path, array, columns in zip(paths, (dense, sparse, labels), expected, strict=True):
        if array.ndim != 2 or array.shape[1:] != columns or len(array) != len(labels):
            raise ValueError(f"{path}: shape {array.shape}, expected ({len(labels)}, {columns[0]})")
    return dense, sparse, labels
