"""Arrays of every row of every table that cost memory only where they hold something.

Access counts span all rows (270 MB of int64 at Criteo Kaggle's 33.8M rows) while a profile of few
inputs writes few of them. numpy asks the kernel for 2 MiB huge pages on large arrays, so a few
scattered writes make the whole of such an array resident; a private anonymous mapping is given
4 KiB pages on first write only, and reads of the rest map the kernel's shared zero page.
"""

from __future__ import annotations

import mmap
from typing import IO

import numpy as np

#: Bytes of a count file member read at a time.
_CHUNK_BYTES = 1 << 20


def paged_zeros(size: int, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """A writable zero-filled 1-D array whose memory the kernel provides page by page as it is
    written (a plain ``np.zeros`` where the platform has no anonymous private mappings)."""
    dtype = np.dtype(dtype)
    flags = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    if size == 0 or None in flags:
        return np.zeros(size, dtype=dtype)
    buffer = mmap.mmap(-1, size * dtype.itemsize, flags=flags[0] | flags[1])
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # where huge pages are the default, opt out of them too
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype=dtype)


def paged_copy(array: np.ndarray) -> np.ndarray:
    """A writable copy of the 1-D ``array`` in :func:`paged_zeros` memory (its non-zero entries
    written, the rest left to the zero page)."""
    out = paged_zeros(len(array), array.dtype)
    nonzero = np.flatnonzero(array)
    out[nonzero] = array[nonzero]
    return out


def read_paged(member: IO[bytes]) -> np.ndarray | None:
    """The 1-D integer array of an open ``.npy`` stream (an npz member), with only its non-zero
    entries written into a :func:`paged_zeros` array: the same values and dtype as ``np.load``, in
    memory that grows with the non-zero entries, not the length.

    Returns None, having read only the header, when the member is not a 1-D integer array (the
    caller reads it the usual way). Raises ``ValueError`` or ``EOFError`` when the stream is not
    ``.npy`` data or ends early, as ``np.load`` does.
    """
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        return None
    if len(shape) != 1 or not np.issubdtype(dtype, np.integer):
        return None
    out = paged_zeros(shape[0], dtype)
    step = max(_CHUNK_BYTES // dtype.itemsize, 1)
    for start in range(0, len(out), step):
        want = min(step, len(out) - start) * dtype.itemsize
        chunk = member.read(want)
        if len(chunk) != want:
            raise EOFError(f"array data ends early: expected {want} bytes, got {len(chunk)}")
        values = np.frombuffer(chunk, dtype=dtype)
        nonzero = np.flatnonzero(values)
        out[start + nonzero] = values[nonzero]
    return out
