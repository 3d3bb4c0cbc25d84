"""Checks of the values a library call takes, raising ``ValueError`` that names the value (the command
line's parsers in ``fae_torchrec.arguments`` check what is typed, for ``argparse``)."""

from __future__ import annotations


def check_share(value: float, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``value`` is a share in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a share in [0, 1], got {value}")
