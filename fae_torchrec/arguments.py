"""Argparse ``type=`` validators: a bad value exits with status 2 and a message naming the option."""

from __future__ import annotations

import argparse
import math
import tempfile
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


def unwritable_directory(path: str | Path) -> str | None:
    """Why files cannot be written in the directory ``path`` (made with its parents where missing), or
    None: the nearest existing of it and its parents is a file, or nothing can be created in it (a
    read-only file system, no permission, a pseudo file system such as /proc). A directory is made and
    removed there to find out, so that a command refuses before its work rather than after it."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as error:
        return f"cannot create anything in {existing} ({error.strerror or error})"
    return None
