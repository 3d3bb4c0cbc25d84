"""Command-line values the benchmark scripts share."""

from __future__ import annotations


def count(text: str) -> int:
    """A number of inputs: ``4000000``, ``4M`` or ``500k``."""
    scale = {"k": 10**3, "m": 10**6}.get(text[-1:].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)
