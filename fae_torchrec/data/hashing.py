"""Stable hashing of categorical values into table rows: 64-bit FNV-1a over the UTF-8 text of each value
(integers in decimal), the same in every process and on every machine (unlike Python's ``hash``), and
the same for a value read from Parquet, CSV or given as text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def as_text(values: pa.Array) -> pa.Array:
    """``values`` (strings, dictionary-encoded strings or integers) as a ``large_string`` array."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    return pc.cast(values, pa.large_string())


def fnv1a(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The 64-bit FNV-1a hash of each value's text (:func:`as_text`) of an Arrow array without nulls
    (a ``ChunkedArray``: its chunks combined), as ``uint64``. Vectorised over the values, one pass per
    byte position of the longest value."""
    text = as_text(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset : text.offset + len(text) + 1]
    data = text.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.full(len(text), FNV_OFFSET, dtype=np.uint64)
    for k in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > k)
        hashes[live] = (hashes[live] ^ data[starts[live] + k].astype(np.uint64)) * FNV_PRIME
    return hashes


def hashed_rows(values: pa.Array, rows: int) -> np.ndarray:
    """Rows ``fnv1a(value) % rows`` as ``int64``."""
    return (fnv1a(values) % np.uint64(rows)).astype(np.int64)
