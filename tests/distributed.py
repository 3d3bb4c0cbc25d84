"""Run a test function on several real gloo ranks (torch.multiprocessing, one process per rank)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, world_size: int, store: str, fn: Callable, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, world_size: int, tmp_path: Path, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by a gloo group;
    an exception in any rank fails the caller."""
    mp.spawn(_rank_main, args=(world_size, str(tmp_path / "store"), fn, args), nprocs=world_size)
