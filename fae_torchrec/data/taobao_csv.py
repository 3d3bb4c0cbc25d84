"""Reader of Taobao's ``UserBehavior.csv`` (Alibaba Tianchi data set 649, as TBSM uses it).

A line holds 5 comma-separated fields and no header: ``user_id,item_id,category_id,behavior_type,
timestamp``, ids and timestamp non-negative integers, behaviour one of ``pv``, ``buy``, ``cart``, ``fav``.
Lines are parsed chunk by chunk with numpy over the raw bytes (no per-line Python work); any malformed line
raises ``ValueError`` naming the file, the line number and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from fae_torchrec.data.delimited import (
    MAX_DIGITS,
    MINUS,
    gather,
    line_chunks,
    parse_ints,
    raise_first_problem,
    split_fields,
)
from fae_torchrec.data.paths import as_paths
from fae_torchrec.data.taobao import (
    BEHAVIORS,
    POINTS_PER_USER,
    TABLES,
    TEST_SHARE,
    TS_LENGTH,
    Events,
    TaobaoSource,
)

_FIELDS = ("user_id", "item_id", "category_id", "behavior_type", "timestamp")
_BEHAVIOR_FIELD = 3
_INT_FIELDS = [0, 1, 2, 4]
_NOT_AN_ID, _NOT_A_BEHAVIOR = 1, 2
_PROBLEMS = {
    _NOT_AN_ID: f"is not a non-negative integer of at most {MAX_DIGITS} digits",
    _NOT_A_BEHAVIOR: f"is not a behaviour ({', '.join(BEHAVIORS)})",
}
_BEHAVIOR_WIDTH = max(len(b) for b in BEHAVIORS)
#: Each behaviour's bytes as one big-endian number, zero-padded to ``_BEHAVIOR_WIDTH`` bytes.
_BEHAVIOR_KEYS = np.array(
    [int.from_bytes(b.encode().ljust(_BEHAVIOR_WIDTH, b"\0"), "big") for b in BEHAVIORS]
)
_BEHAVIOR_LENGTHS = np.array([len(b) for b in BEHAVIORS])


def read_user_behavior(
    paths: str | os.PathLike | Sequence[str | os.PathLike], chunk_bytes: int = 1 << 24
) -> Events:
    """All events of one ``UserBehavior.csv`` file or several, read in order, with each table's raw ids
    remapped to rows 1..n in ascending raw order (TBSM's ``taobao_prepare.py`` remap, shifted by one for
    padding row 0); ``table_sizes`` are the distinct ids plus one.

    Memory: the events' five columns (about 33 bytes an event, 3.3 GB for the full 100M-event log) plus
    the parsing of one chunk (some 25 times ``chunk_bytes``).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    parts = [part for path in as_paths(paths) for part in _read_file(path, chunk_bytes)]
    columns = [np.concatenate(column) for column in zip(*parts, strict=True)]
    remapped = [np.unique(ids, return_inverse=True) for ids in columns[: len(TABLES)]]
    user, item, category = (inverse.reshape(-1) + 1 for _, inverse in remapped)
    return Events(
        user=user,
        item=item,
        category=category,
        behavior=columns[_BEHAVIOR_FIELD],
        timestamp=columns[-1],
        table_sizes=tuple(len(distinct) + 1 for distinct, _ in remapped),
    )


class TaobaoCsvReader(TaobaoSource):
    """TBSM samples of ``UserBehavior.csv`` files (:func:`read_user_behavior`, :func:`tbsm_samples`).

    Args:
        paths: one file or several, read in order.
        batch_size: inputs per ``Batch`` (the last one may be smaller).
        ts_length, points_per_user, test_share, seed: as :class:`TaobaoSource` takes them.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int,
        ts_length: int = TS_LENGTH,
        points_per_user: int = POINTS_PER_USER,
        test_share: float = TEST_SHARE,
        seed: int = 0,
    ) -> None:
        self.paths = as_paths(paths)
        events = read_user_behavior(self.paths)
        super().__init__(events, batch_size, ts_length, points_per_user, test_share, seed)


def _read_file(path: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, ...]]:
    """Per chunk of whole lines, the raw columns user, item, category, behaviour code, timestamp."""
    first_line = 1
    for buf in line_chunks(path, chunk_bytes):
        columns = _parse(buf, path, first_line)
        first_line += len(columns[0])
        yield columns
    if first_line == 1:
        raise ValueError(f"{path}: no events")


def _parse(buf: np.ndarray, path: str, first_line: int) -> tuple[np.ndarray, ...]:
    """The columns of the whole lines in ``buf``; every field is checked first, so that an error names
    the first bad line."""
    starts, lengths = split_fields(
        buf, b",", len(_FIELDS), path, first_line, format_name="UserBehavior.csv", field_names=_FIELDS
    )
    problems = np.zeros(starts.shape, dtype=np.uint8)
    int_starts, int_lengths = starts[:, _INT_FIELDS], lengths[:, _INT_FIELDS]
    ints, not_int = parse_ints(buf, int_starts, int_lengths)
    signed = buf[int_starts] == MINUS
    problems[:, _INT_FIELDS] = (not_int | signed | (int_lengths == 0)) * np.uint8(_NOT_AN_ID)
    behavior, problems[:, _BEHAVIOR_FIELD] = _parse_behaviors(
        buf, starts[:, _BEHAVIOR_FIELD], lengths[:, _BEHAVIOR_FIELD]
    )
    raise_first_problem(buf, starts, lengths, problems, path, first_line, _FIELDS, _PROBLEMS)
    return ints[:, 0], ints[:, 1], ints[:, 2], behavior, ints[:, 3]


def _parse_behaviors(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Behaviour codes (indices into ``BEHAVIORS``) and a problem code per field."""
    chars = np.where(np.arange(_BEHAVIOR_WIDTH) < lengths[:, None], gather(buf, starts, _BEHAVIOR_WIDTH), 0)
    keys = (chars.astype(np.int64) << (8 * np.arange(_BEHAVIOR_WIDTH - 1, -1, -1))).sum(axis=1)
    matches = (keys[:, None] == _BEHAVIOR_KEYS) & (lengths[:, None] == _BEHAVIOR_LENGTHS)
    known = matches.any(axis=1)
    return np.argmax(matches, axis=1).astype(np.int8), ~known * np.uint8(_NOT_A_BEHAVIOR)
