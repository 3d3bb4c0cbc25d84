"""Streaming reader of Criteo raw TSV files (Kaggle ``train.txt``/``test.txt``, Terabyte ``day_N``).

A line holds an optional label, 13 integer fields and 26 categorical fields of 8 hex digits, separated
by tabs. Files with 40 fields per line are labelled; files with 39 (Kaggle ``test.txt``) get label -1,
as TorchRec's ``BinaryCriteoUtils.tsv_to_npys`` gives them. As in that function, an empty field reads as
0: an empty categorical field is hex ``0`` and so row 0 of its table; an empty integer or label is 0.
Categorical values become rows modulo the table size (TorchRec's hashing). Integer ``x`` becomes the
dense value ``sign(x) * log(1 + |x|)``, which keeps Criteo's few negative values instead of clipping them
(``tsv_to_npys`` shifts by the whole file's minimum, which a stream cannot know, so dense values of this
reader and of :class:`CriteoNpyReader` on TorchRec's npy files differ; ids and labels are the same).

Lines are parsed chunk by chunk with numpy over the raw bytes (no per-line Python work); any malformed
line raises ``ValueError`` naming the file, the line number and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from fae_torchrec.data.block import SampleBlock
from fae_torchrec.data.criteo import (
    CAT_FEATURE_COUNT,
    INT_FEATURE_COUNT,
    KAGGLE_TABLE_SIZES,
    CriteoSource,
    single_hot_block,
)
from fae_torchrec.data.delimited import (
    MAX_DIGITS,
    count_fields,
    gather,
    line_chunks,
    parse_ints,
    raise_first_problem,
    split_fields,
)
from fae_torchrec.data.paths import as_paths

_NOT_AN_INTEGER, _NOT_A_LABEL, _NOT_HEX = 1, 2, 3
_PROBLEMS = {
    _NOT_AN_INTEGER: f"is not an integer of at most {MAX_DIGITS} digits",
    _NOT_A_LABEL: "is not a label (0 or 1)",
    _NOT_HEX: "is not 8 hex digits",
}
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
_HEX_DIGITS = 8
_UNLABELLED_FIELDS = INT_FEATURE_COUNT + CAT_FEATURE_COUNT
_LABELLED_FIELDS = _UNLABELLED_FIELDS + 1
_INT_NAMES = tuple(f"I{i + 1}" for i in range(INT_FEATURE_COUNT))
_CAT_NAMES = tuple(f"C{i + 1}" for i in range(CAT_FEATURE_COUNT))
#: Field names by fields per line.
_FIELD_NAMES = {
    _LABELLED_FIELDS: ("label", *_INT_NAMES, *_CAT_NAMES),
    _UNLABELLED_FIELDS: (*_INT_NAMES, *_CAT_NAMES),
}


class CriteoTsvReader(CriteoSource):
    """Streams ``Batch``es from Criteo TSV files.

    Args:
        paths: one file or several, read in order.
        batch_size: inputs per ``Batch`` (the last one may be smaller).
        table_sizes: rows per categorical feature; ids are hashed modulo these.
        chunk_bytes: bytes parsed at a time; parsing takes about 25 times this in memory.
        require_labels: refuse unlabelled files (39 fields), as training and evaluation must.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int = 2048,
        table_sizes: Sequence[int] = KAGGLE_TABLE_SIZES,
        chunk_bytes: int = 1 << 24,
        require_labels: bool = False,
    ) -> None:
        super().__init__(batch_size, table_sizes)
        self.paths = as_paths(paths)
        self.chunk_bytes = chunk_bytes
        self.require_labels = require_labels

    def raw_blocks(self) -> Iterator[SampleBlock]:
        """Blocks as parsed, one per chunk of each file."""
        for path in self.paths:
            yield from _read_file(path, self.table_sizes, self.chunk_bytes, self.require_labels)


def _read_file(
    path: str, table_sizes: Sequence[int], chunk_bytes: int, require_labels: bool = False
) -> Iterator[SampleBlock]:
    first_line = 1
    num_fields = None
    for buf in line_chunks(path, chunk_bytes):
        if num_fields is None:
            num_fields = count_fields(buf, b"\t")
            if num_fields not in (_LABELLED_FIELDS, _UNLABELLED_FIELDS):
                raise ValueError(
                    f"{path}:1: expected {_LABELLED_FIELDS} (labelled) or {_UNLABELLED_FIELDS} "
                    f"tab-separated fields, found {num_fields}"
                )
            if require_labels and num_fields == _UNLABELLED_FIELDS:
                raise ValueError(
                    f"{path}: unlabelled data ({_UNLABELLED_FIELDS} fields per line, as in Kaggle's "
                    f"test.txt): training and evaluation need labelled lines ({_LABELLED_FIELDS} "
                    "fields, label 0 or 1); unlabelled files can only be profiled and planned"
                )
        block, lines = _parse(buf, num_fields, path, first_line, table_sizes)
        first_line += lines
        yield block


def _parse(
    buf: np.ndarray, num_fields: int, path: str, first_line: int, table_sizes: Sequence[int]
) -> tuple[SampleBlock, int]:
    """Parse whole lines in ``buf`` (ending with a newline) into a block; return it and the line count.

    Every field is checked before any error is raised, so the error names the first bad line.
    """
    starts, lengths = split_fields(buf, b"\t", num_fields, path, first_line, format_name="Criteo")
    n = len(starts)
    first_cat = num_fields - CAT_FEATURE_COUNT
    problems = np.zeros((n, num_fields), dtype=np.uint8)
    numbers, not_int = parse_ints(buf, starts[:, :first_cat], lengths[:, :first_cat])
    problems[:, :first_cat] = not_int * np.uint8(_NOT_AN_INTEGER)
    cats, problems[:, first_cat:] = _parse_hex(buf, starts[:, first_cat:], lengths[:, first_cat:])
    labelled = num_fields == _LABELLED_FIELDS
    if labelled:
        labels = numbers[:, 0]
        not_a_label = (problems[:, 0] == 0) & (labels != 0) & (labels != 1)
        problems[not_a_label, 0] = _NOT_A_LABEL
    else:
        labels = np.full(n, -1, dtype=np.int64)
    raise_first_problem(buf, starts, lengths, problems, path, first_line, _FIELD_NAMES[num_fields], _PROBLEMS)
    ints = numbers[:, first_cat - INT_FEATURE_COUNT :]
    dense = np.sign(ints) * np.log1p(np.abs(ints))
    return single_hot_block(dense, cats, labels, table_sizes), n


def _parse_hex(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-digit hex categories (empty fields are 0), and a problem code per field."""
    nibbles = _HEX[gather(buf, starts, _HEX_DIGITS)]
    full = lengths == _HEX_DIGITS
    bad = ~(full | (lengths == 0)) | (full & (nibbles == 255).any(axis=-1))
    shifts = np.arange(4 * (_HEX_DIGITS - 1), -1, -4, dtype=np.int64)
    value = (nibbles.astype(np.int64) << shifts).sum(axis=-1)
    return np.where(full & ~bad, value, 0), bad * _NOT_HEX
