"""``RowChain``: the rows of several arrays read as one array, for data that several processes wrote at
once, each into files of its own (a partition written by several ranks: no writer waits to learn where
its rows go, and none takes turns with another at a file)."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt


class RowChain:
    """The rows of ``pieces`` (arrays of one dtype and row shape, such as memory-mapped ``.npy`` files)
    one after another, read as the array of all of them along its first axis: indexed by an integer, a
    slice, an index array or a boolean mask of rows, then any index within a row. A read copies the rows
    it selects only (a slice within one piece is a view of it, as a slice of a memory map is);
    ``np.asarray`` copies all of them."""

    def __init__(self, pieces: Sequence[np.ndarray]) -> None:
        if not pieces:
            raise ValueError("no arrays to chain")
        first = pieces[0]
        for piece in pieces[1:]:
            if piece.dtype != first.dtype or piece.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"rows of {piece.dtype} {piece.shape[1:]} cannot follow rows of {first.dtype} "
                    f"{first.shape[1:]}"
                )
        self.pieces = list(pieces)
        #: The first row of each piece, and the number of rows last.
        self.bounds = np.cumsum([0, *(len(piece) for piece in pieces)])
        self.dtype: np.dtype = first.dtype
        self.shape: tuple[int, ...] = (int(self.bounds[-1]), *first.shape[1:])
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        whole = np.concatenate(self.pieces)
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        rows, within = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(rows, builtins.slice) and rows.step in (None, 1):
            return self._slice(*rows.indices(len(self))[:2], within)
        if isinstance(rows, int | np.integer):
            row = operator.index(rows)
            row += len(self) if row < 0 else 0
            if not 0 <= row < len(self):
                raise IndexError(f"row {operator.index(rows)} of {len(self)}")
            piece = int(np.searchsorted(self.bounds, row, side="right")) - 1
            return self.pieces[piece][(row - int(self.bounds[piece]), *within)]
        return self._take(self._rows(rows), within)

    def _rows(self, rows: Any) -> np.ndarray:
        """The rows an index array, a boolean mask or a slice with a step selects, as row numbers."""
        if isinstance(rows, builtins.slice):
            return np.arange(*rows.indices(len(self)))
        index = np.asarray(rows)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise IndexError(f"a mask of {index.shape} for {len(self)} rows")
            return np.flatnonzero(index)
        index = np.where(index < 0, index + len(self), index).astype(np.int64, copy=False)
        if index.size and (int(index.min()) < 0 or int(index.max()) >= len(self)):
            raise IndexError(f"rows out of the {len(self)} rows")
        return index

    def _slice(self, start: int, stop: int, within: tuple) -> np.ndarray:
        """Rows ``start:stop``: a view where one piece holds them."""
        views = [
            piece[max(start, low) - low : min(stop, high) - low][(builtins.slice(None), *within)]
            for piece, (low, high) in zip(self.pieces, pairwise(self.bounds.tolist()), strict=True)
            if max(start, low) < min(stop, high)
        ]
        if not views:
            return self.pieces[0][0:0][(builtins.slice(None), *within)]
        return views[0] if len(views) == 1 else np.concatenate(views)

    def _take(self, index: np.ndarray, within: tuple) -> np.ndarray:
        """Rows ``index`` (in its order and shape), each piece read once."""
        flat = index.reshape(-1)
        which = np.searchsorted(self.bounds, flat, side="right") - 1
        taken = None
        for piece in np.unique(which).tolist():
            chosen = which == piece
            values = self.pieces[piece][(flat[chosen] - self.bounds[piece], *within)]
            if taken is None:
                taken = np.empty((len(flat), *values.shape[1:]), dtype=values.dtype)
            taken[chosen] = values
        if taken is None:  # no row
            taken = self.pieces[0][(flat, *within)]
        return taken.reshape(*index.shape, *taken.shape[1:])


def count_nonzero(rows: np.ndarray, stop: int | None = None, chunk: int = 1 << 24) -> int:
    """The nonzero entries of ``rows`` (a ``RowChain`` or any array, memory-mapped too) before row
    ``stop`` (None: all), read ``chunk`` rows at a time: ``np.count_nonzero`` would read a ``RowChain``
    into one array first."""
    stop = len(rows) if stop is None else stop
    return sum(
        int(np.count_nonzero(rows[start : min(start + chunk, stop)])) for start in range(0, stop, chunk)
    )


def chain_rows(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """The rows of ``pieces`` as one array: the piece itself where there is one, else a ``RowChain``
    (which reads as an array)."""
    return pieces[0] if len(pieces) == 1 else RowChain(pieces)  # type: ignore[return-value]
