"""Run a test on several real gloo ranks: in-process ranks (torch.multiprocessing) or a launched command.

On this machine gloo rarely aborts a rank ("terminate called without an active exception", SIGABRT):
about once in dozens of two-rank runs, in no particular test, and not reproducibly. A rank killed by
that signal reruns the whole group once, with a warning. A rank that fails any other way (an
assertion, an exception, another exit status) fails the test at once.
"""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

#: The signal's name, as spawn reports it and torchrun prints it.
ABORTED = "SIGABRT"


def _rank_main(rank: int, world_size: int, store: str, fn: Callable, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, world_size: int, tmp_path: Path, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by a gloo group;
    an exception in any rank fails the caller."""

    def spawn(store: str) -> None:
        mp.spawn(_rank_main, args=(world_size, str(tmp_path / store), fn, args), nprocs=world_size)

    try:
        spawn("store")
    except mp.ProcessExitedException as error:
        if error.signal_name != ABORTED:
            raise
        warnings.warn(f"rank {error.error_index} got {ABORTED}; running the group again", stacklevel=2)
        spawn("store-again")


def run_launched(command: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command that starts several ranks (torchrun); once more if a rank got SIGABRT."""
    run = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    if run.returncode != 0 and ABORTED in run.stderr:
        warnings.warn(f"a rank of {list(command)} got {ABORTED}; running it again", stacklevel=2)
        run = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    return run
