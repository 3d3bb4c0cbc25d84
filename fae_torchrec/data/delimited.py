"""Delimited text files parsed with numpy over the raw bytes, shared by the Criteo TSV and Taobao CSV
readers: whole-line chunks of a file, their split into fields, decimal integers, and errors that name the
file, the line and the field.

A chunk is a ``uint8`` array of whole lines, each ending with LF; a field is a ``(start, length)`` pair
into it. Every field of a chunk is checked before any error is raised, so an error names the first bad
line of the chunk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

NEWLINE, CARRIAGE_RETURN, MINUS = 10, 13, 45
#: Decimal digits an int64 surely holds.
MAX_DIGITS = 18
_SEPARATOR_NAMES = {b"\t": "tab", b",": "comma"}


def line_chunks(path: str | os.PathLike, chunk_bytes: int) -> Iterator[np.ndarray]:
    """The file's bytes in chunks of whole lines (about ``chunk_bytes`` each, more where a line is longer),
    each ending with a newline (one is added to a last line without one); none for an empty file."""
    with open(path, "rb") as f:
        tail = b""
        while True:
            data = f.read(chunk_bytes)
            if not data and not tail:
                return
            text = tail + data if data else tail + b"\n"
            end = text.rfind(b"\n") + 1
            tail = text[end:]
            if end:
                yield np.frombuffer(text, dtype=np.uint8, count=end)


def count_fields(buf: np.ndarray, separator: bytes) -> int:
    """Fields of the first line of a chunk."""
    first_line = buf[: np.argmax(buf == NEWLINE)]
    return int(np.count_nonzero(first_line == ord(separator))) + 1


def split_fields(
    buf: np.ndarray,
    separator: bytes,
    num_fields: int,
    path: str,
    first_line: int,
    *,
    format_name: str,
    field_names: Sequence[str] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths, each ``(lines, num_fields)``, of the fields of a chunk whose first line is line
    ``first_line`` of ``path``. Raises ``ValueError`` at the first carriage return (``format_name`` uses
    LF) or the first line without ``num_fields`` fields (named ``field_names`` in the message, if given).
    """
    seps = np.flatnonzero((buf == ord(separator)) | (buf == NEWLINE))
    line_ends = np.flatnonzero(buf[seps] == NEWLINE)
    carriage_returns = np.flatnonzero(buf == CARRIAGE_RETURN)
    if len(carriage_returns):
        line = first_line + int(np.searchsorted(seps[line_ends], carriage_returns[0]))
        raise ValueError(
            f"{path}:{line}: carriage return in line (CRLF line endings?); {format_name} uses LF"
        )
    fields_per_line = np.diff(line_ends, prepend=-1)
    bad = np.flatnonzero(fields_per_line != num_fields)
    if len(bad):
        names = f" ({','.join(field_names)})" if field_names else ""
        raise ValueError(
            f"{path}:{first_line + bad[0]}: expected {num_fields} "
            f"{_SEPARATOR_NAMES.get(separator, repr(separator))}-separated fields{names}, "
            f"found {fields_per_line[bad[0]]}"
        )
    n = len(line_ends)
    starts = np.concatenate([[0], seps[:-1] + 1]).reshape(n, num_fields)
    return starts, seps.reshape(n, num_fields) - starts


def raise_first_problem(
    buf: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    problems: np.ndarray,
    path: str,
    first_line: int,
    field_names: Sequence[str],
    messages: Mapping[int, str],
) -> None:
    """Raise ``ValueError`` naming the first field (in line order) whose problem code is not 0:
    ``path:line: field NAME 'text' MESSAGE``, ``messages`` by code. Returns when there is none."""
    if not problems.any():
        return
    row, col = divmod(int(np.argmax(problems.ravel() > 0)), problems.shape[1])
    text = bytes(buf[starts[row, col] : starts[row, col] + lengths[row, col]]).decode("latin-1")
    raise ValueError(
        f"{path}:{first_line + row}: field {field_names[col]} {text!r} {messages[int(problems[row, col])]}"
    )


def gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Bytes ``starts + 0..width-1`` (clipped to the buffer), shape ``starts.shape + (width,)``."""
    index = np.minimum(starts[..., None] + np.arange(width), len(buf) - 1)
    return buf[index]


def parse_ints(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal integers with an optional leading minus (empty fields are 0), and per field whether it is
    bad: not an integer, or more than ``MAX_DIGITS`` digits (which int64 may not hold)."""
    width = max(int(lengths.max(initial=0)), 1)
    chars = gather(buf, starts, width)
    present = np.arange(width) < lengths[..., None]
    negative = (chars[..., 0] == MINUS) & (lengths > 0)
    digits = chars.astype(np.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    sign_position = np.zeros_like(present)
    sign_position[..., 0] = negative
    bad = (present & ~is_digit & ~sign_position).any(axis=-1) | (negative & (lengths == 1))
    bad |= lengths - negative > MAX_DIGITS
    value = np.zeros(starts.shape, dtype=np.int64)
    for k in range(width):
        use = present[..., k] & ~sign_position[..., k] & ~bad
        value = np.where(use, value * 10 + digits[..., k], value)
    return np.where(negative, -value, value), bad
