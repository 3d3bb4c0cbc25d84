"""Byte sizes as people write them (``256MiB``, ``1.5GB``, ``0``) and back."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: Largest byte size accepted: what an int64 holds.
MAX_BYTES = 2**63 - 1
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str | int | float) -> int:
    """Bytes of ``text``: a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)."""
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        match = _SIZE.match(text)
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"not a byte size: {text!r} (examples: 0, 512MiB, 1.5GB)")
        value, unit = float(match.group(1)), match.group(2).lower()
    if value < 0:
        raise ValueError(f"a byte size cannot be negative: {text!r}")
    if not value * _UNITS[unit] < MAX_BYTES:  # also inf and nan
        raise ValueError(f"byte size too large: {text!r} (at most {MAX_BYTES:,} bytes, 8 EiB)")
    return round(value * _UNITS[unit])


def format_bytes(num_bytes: float) -> str:
    """``num_bytes`` in the largest binary unit that keeps it at least 1 (``1.5 GiB``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{int(num_bytes)} B"
