"""Quiet commands: TorchRec's notices off the terminal while a command (the CLI, the training recipe) runs,
its errors on."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _no_torchrec_warning(record: logging.LogRecord) -> bool:
    """Drops TorchRec's records below ERROR that it logs on the root logger."""
    return record.levelno >= logging.ERROR or "torchrec" not in Path(record.pathname).parts


@contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """The logger ``name`` at ``level`` inside the block, at its own level again after it."""
    named = logging.getLogger(name)
    before = named.level
    named.setLevel(level)
    try:
        yield
    finally:
        named.setLevel(before)


@contextmanager
def torchrec_quiet() -> Iterator[None]:
    """TorchRec's warnings off the terminal, its errors on, while a command runs: FAE runs TorchRec's
    planner once or more per budget it tries, and every run repeats dry-run notices a user cannot act
    on (the storage reservation FAE keeps on purpose, a dense size unknown in a dry run, no sharding
    spec for data-parallel tables, which TorchRec logs on the root logger), and DMP, its pipelines and
    FBGEMM's CPU kernels warn of PyTorch matters inside them (DDP's ``broadcast_buffers``, FX tracing
    queries, an autograd kernel not registered)."""
    root = logging.getLogger()
    root.addFilter(_no_torchrec_warning)
    try:
        with logger_level("torchrec", logging.ERROR), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
            warnings.filterwarnings(
                "ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning
            )
            # FBGEMM's CPU lookup has no autograd kernel registered, and PyTorch says so on a backward
            warnings.filterwarnings(
                "ignore", message=".*an autograd kernel was not registered", category=UserWarning
            )
            with logger_level("torch.fx._symbolic_trace", logging.ERROR):
                yield
    finally:
        root.removeFilter(_no_torchrec_warning)
