"""An ``.npy`` file written row block by row block, for data streamed to disk (partitions, spools)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

#: Bytes of the header: room for any row count, so that it is rewritten in place at the end.
HEADER_BYTES = 128


class NpyAppender:
    """An ``.npy`` file grown by appending rows; its header is rewritten with the row count at the end."""

    def __init__(self, path: Path, dtype: npt.DTypeLike, row_shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.row_shape, self.rows = path, np.dtype(dtype), row_shape, 0
        self.file: BinaryIO = open(path, "wb")  # closed in close()
        self._write_header()

    def append(self, array: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(array, dtype=self.dtype).data)  # no copy into bytes first
        self.rows += len(array)

    def close(self) -> None:
        self.file.seek(0)
        self._write_header()
        self.file.close()

    def _write_header(self) -> None:
        _write_header(self.file, self.path, self.dtype, (self.rows, *self.row_shape))


class NpyFolder:
    """``.npy`` files in ``folder`` grown by appending rows by name (``{name}.npy``): each made at its
    first rows (their dtype and row shape), the folder at the first of all; closed together."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, NpyAppender] = {}

    def append(self, name: str, array: np.ndarray) -> None:
        if name not in self.files:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.files[name] = NpyAppender(self.folder / f"{name}.npy", array.dtype, array.shape[1:])
        self.files[name].append(array)

    def close(self) -> None:
        for file in self.files.values():
            file.close()


def allocate_npy(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """An ``.npy`` file of ``shape`` for writers to fill in place (the header as :class:`NpyAppender`
    writes it, so that the bytes are those it would have written)."""
    with open(path, "wb") as file:
        _write_header(file, path, np.dtype(dtype), shape)
        file.truncate(HEADER_BYTES + np.dtype(dtype).itemsize * int(np.prod(shape)))


def _write_header(file: BinaryIO, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    padding = HEADER_BYTES - 10 - len(text) - 1
    if padding < 0 or ast.literal_eval(text.decode("latin1")) != header:
        raise ValueError(f"{path}: header does not fit {HEADER_BYTES} bytes")
    file.write(b"\x93NUMPY\x01\x00" + (HEADER_BYTES - 10).to_bytes(2, "little"))
    file.write(text + b" " * padding + b"\n")
