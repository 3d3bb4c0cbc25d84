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
    as_paths,
    single_hot_block,
)

_TAB, _NEWLINE, _CARRIAGE_RETURN, _MINUS = 9, 10, 13, 45
_MAX_DIGITS = 18
_NOT_AN_INTEGER, _NOT_A_LABEL, _NOT_HEX = 1, 2, 3
_PROBLEMS = {
    _NOT_AN_INTEGER: f"is not an integer of at most {_MAX_DIGITS} digits",
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
    with open(path, "rb") as f:
        tail = b""
        while True:
            data = f.read(chunk_bytes)
            if not data and not tail:
                return
            text = tail + data
            end = text.rfind(b"\n") + 1
            if not data:
                text, end = text + b"\n", len(text) + 1
            if end == 0:
                tail = text
                continue
            tail = text[end:]
            buf = np.frombuffer(text, dtype=np.uint8, count=end)
            if num_fields is None:
                num_fields = int(np.count_nonzero(buf[: np.argmax(buf == _NEWLINE)] == _TAB)) + 1
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
    seps = np.flatnonzero((buf == _TAB) | (buf == _NEWLINE))
    line_ends = np.flatnonzero(buf[seps] == _NEWLINE)
    carriage_returns = np.flatnonzero(buf == _CARRIAGE_RETURN)
    if len(carriage_returns):
        line = first_line + int(np.searchsorted(seps[line_ends], carriage_returns[0]))
        raise ValueError(f"{path}:{line}: carriage return in line (CRLF line endings?); Criteo uses LF")
    fields_per_line = np.diff(line_ends, prepend=-1)
    bad = np.flatnonzero(fields_per_line != num_fields)
    if len(bad):
        raise ValueError(
            f"{path}:{first_line + bad[0]}: expected {num_fields} tab-separated fields, "
            f"found {fields_per_line[bad[0]]}"
        )
    n = len(line_ends)
    starts = np.concatenate([[0], seps[:-1] + 1]).reshape(n, num_fields)
    lengths = seps.reshape(n, num_fields) - starts
    first_cat = num_fields - CAT_FEATURE_COUNT
    problems = np.zeros((n, num_fields), dtype=np.uint8)
    numbers, problems[:, :first_cat] = _parse_ints(buf, starts[:, :first_cat], lengths[:, :first_cat])
    cats, problems[:, first_cat:] = _parse_hex(buf, starts[:, first_cat:], lengths[:, first_cat:])
    labelled = num_fields == _LABELLED_FIELDS
    if labelled:
        labels = numbers[:, 0]
        not_a_label = (problems[:, 0] == 0) & (labels != 0) & (labels != 1)
        problems[not_a_label, 0] = _NOT_A_LABEL
    else:
        labels = np.full(n, -1, dtype=np.int64)
    if problems.any():
        row, col = divmod(int(np.argmax(problems.ravel() > 0)), num_fields)
        names = ["label"] * labelled + [f"I{i + 1}" for i in range(INT_FEATURE_COUNT)]
        names += [f"C{i + 1}" for i in range(CAT_FEATURE_COUNT)]
        text = bytes(buf[starts[row, col] : starts[row, col] + lengths[row, col]]).decode("latin-1")
        raise ValueError(
            f"{path}:{first_line + row}: field {names[col]} {text!r} {_PROBLEMS[problems[row, col]]}"
        )
    ints = numbers[:, first_cat - INT_FEATURE_COUNT :]
    dense = np.sign(ints) * np.log1p(np.abs(ints))
    return single_hot_block(dense, cats, labels, table_sizes), n


def _gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Bytes ``starts + 0..width-1`` (clipped to the buffer), shape ``starts.shape + (width,)``."""
    index = np.minimum(starts[..., None] + np.arange(width), len(buf) - 1)
    return buf[index]


def _parse_ints(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal integers with an optional leading minus (empty fields are 0), and a problem code per
    field: not an integer, or more digits than int64 surely holds."""
    width = max(int(lengths.max(initial=0)), 1)
    chars = _gather(buf, starts, width)
    present = np.arange(width) < lengths[..., None]
    negative = (chars[..., 0] == _MINUS) & (lengths > 0)
    digits = chars.astype(np.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    sign_position = np.zeros_like(present)
    sign_position[..., 0] = negative
    bad = (present & ~is_digit & ~sign_position).any(axis=-1) | (negative & (lengths == 1))
    bad |= lengths - negative > _MAX_DIGITS
    value = np.zeros(starts.shape, dtype=np.int64)
    for k in range(width):
        use = present[..., k] & ~sign_position[..., k] & ~bad
        value = np.where(use, value * 10 + digits[..., k], value)
    return np.where(negative, -value, value), bad * _NOT_AN_INTEGER


def _parse_hex(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-digit hex categories (empty fields are 0), and a problem code per field."""
    nibbles = _HEX[_gather(buf, starts, _HEX_DIGITS)]
    full = lengths == _HEX_DIGITS
    bad = ~(full | (lengths == 0)) | (full & (nibbles == 255).any(axis=-1))
    shifts = np.arange(4 * (_HEX_DIGITS - 1), -1, -4, dtype=np.int64)
    value = (nibbles.astype(np.int64) << shifts).sum(axis=-1)
    return np.where(full & ~bad, value, 0), bad * _NOT_HEX
