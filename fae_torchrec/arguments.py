"""Argparse ``type=`` validators: a bad value exits with status 2 and a message naming the option."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from fae_torchrec.units import parse_bytes

#: Suffixes an integer may carry, as in ``--num-samples 2M`` or ``--holdout 100k``.
SUFFIXES = {"k": 10**3, "m": 10**6}


def _integer(text: str) -> int:
    """``text`` as an integer: ``4000000``, ``4M``, ``500k`` or ``1.5k``."""
    scale = SUFFIXES.get(text[-1:].lower())
    try:
        value = float(text[:-1]) * scale if scale else int(text)
    except ValueError:
        value = math.nan
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(value)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def int_at_least(minimum: int, why: str = ""):
    """A validator for integers of at least ``minimum``; ``why`` explains the bound in the message."""

    def check(text: str) -> int:
        value = _integer(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, got {value}")
        return value

    return check


def positive_float(text: str) -> float:
    """A finite number above 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = _finite(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def check_share(value: float, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``value`` is a share in [0, 1] (a library call's
    check; ``share`` parses the same from a command line)."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a share in [0, 1], got {value}")


def share(text: str) -> float:
    """A number in [0, 1]."""
    value = _finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def byte_size(text: str) -> str:
    """A byte size :func:`parse_bytes` accepts (``0``, ``512KiB``, ``1.5GB``), kept as written."""
    try:
        parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def blocking_file(path: str | Path) -> Path | None:
    """What keeps ``path`` from being (or becoming) a directory: the nearest existing of it and its
    parents when that is a file, or None."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    return None if existing.is_dir() else existing
