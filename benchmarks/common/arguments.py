"""Command-line values the benchmark scripts share."""

from __future__ import annotations

import sys
from typing import NoReturn


def count(text: str) -> int:
    """A number of inputs: ``4000000``, ``4M`` or ``500k``."""
    scale = {"k": 10**3, "m": 10**6}.get(text[-1:].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def fail(message: str) -> NoReturn:
    """Stop on bad input as argparse does: ``error: message`` on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
