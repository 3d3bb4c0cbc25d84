"""Run a test on several real gloo ranks: processes started by torch.multiprocessing (from a fork server
that has imported TorchRec once) or a launched command.

On this machine gloo rarely aborts a rank ("terminate called without an active exception", SIGABRT):
about once in dozens of runs, in no particular test, and not reproducibly, mostly as the rank tears its
group down. A group whose every rank had finished the test before the signal passes (with a warning):
running it again would meet what it already wrote, such as its own checkpoints. A group killed before
that reruns once, with a warning, and so does a launched command killed by that signal, after the
paths it names as its outputs are removed. A rank that fails any other way (an assertion, an
exception, another exit status) fails the test at once.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

#: The signal's name, as spawn reports it and torchrun prints it.
ABORTED = "SIGABRT"
#: Imported once by each pytest worker's fork server, so that a rank starts without importing them again
#: (seconds of CPU per rank, which CI's two cores would otherwise spend on every rank of every test).
PRELOAD = ["torchrec", "torchrec.distributed.planner", "fbgemm_gpu", "fae_torchrec"]


def _finished(store: str, rank: int) -> Path:
    """The file a rank writes once ``fn`` has returned in the group joined through ``store``."""
    return Path(f"{store}.finished-{rank}")


def _rank_main(rank: int, world_size: int, store: str, fn: Callable, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    # every rank has joined before any runs the test: a rank that returns (or fails) at once would
    # otherwise tear its group down while another is still connecting, which then fails in gloo's
    # "connectFullMesh ... Connection closed by peer" instead of the way the test meant
    dist.barrier()
    try:
        fn(rank, world_size, *args)
        _finished(store, rank).touch()
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, world_size: int, tmp_path: Path, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by a gloo group;
    an exception in any rank fails the caller."""

    def spawn(store: str) -> None:
        multiprocessing.set_forkserver_preload(PRELOAD)
        mp.start_processes(
            _rank_main, args=(world_size, str(tmp_path / store), fn, args), nprocs=world_size,
            start_method="forkserver",
        )  # fmt: skip

    try:
        spawn("store")
    except mp.ProcessExitedException as error:
        if error.signal_name != ABORTED:
            raise
        if all(_finished(str(tmp_path / "store"), rank).exists() for rank in range(world_size)):
            warnings.warn(f"rank {error.error_index} got {ABORTED} after the test had passed", stacklevel=2)
            return
        warnings.warn(f"rank {error.error_index} got {ABORTED}; running the group again", stacklevel=2)
        spawn("store-again")


def run_launched(
    command: Sequence[str], cwd: Path | None = None, outputs: Sequence[Path] = ()
) -> subprocess.CompletedProcess:
    """Run a command that starts several ranks (torchrun); if a rank got SIGABRT, remove ``outputs``
    (what the command writes, such as its checkpoint directory) and run it once more."""
    run = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    if run.returncode != 0 and ABORTED in run.stderr:
        warnings.warn(f"a rank of {list(command)} got {ABORTED}; running it again", stacklevel=2)
        for path in outputs:
            shutil.rmtree(path, ignore_errors=True)
        run = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    return run


def run_ranks(
    command: Sequence[str], world_size: int, timeout: float, cwd: Path | None = None
) -> list[subprocess.CompletedProcess]:
    """Run ``command`` as ``world_size`` ranks started as torchrun starts them (its environment variables,
    the group's store on a free local port), in ``cwd``: each rank's own exit status, stdout and stderr,
    which torchrun, as it ends the other ranks once one exits, does not give (nor does it spend a process
    on torchrun). ``timeout`` (seconds) fails the test where a rank
    hangs; a group with a rank killed by SIGABRT runs once more."""

    def launch() -> list[subprocess.CompletedProcess]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(probe.getsockname()[1]),
                     "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}  # fmt: skip
        with ExitStack() as files:
            errors = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(world_size)]
            outputs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(world_size)]
            ranks = [
                subprocess.Popen(list(command), stdout=output, stderr=error, cwd=cwd,
                                 env={**os.environ, **group, "RANK": str(rank), "LOCAL_RANK": str(rank)})
                for rank, (output, error) in enumerate(zip(outputs, errors, strict=True))
            ]  # fmt: skip
            try:
                for rank in ranks:
                    rank.wait(timeout=timeout)
            finally:
                for rank in ranks:
                    rank.kill()  # those still running, after a timeout
            for file in (*outputs, *errors):
                file.seek(0)
            return [
                subprocess.CompletedProcess(
                    rank.args, rank.returncode, stdout=output.read(), stderr=error.read()
                )
                for rank, output, error in zip(ranks, outputs, errors, strict=True)
            ]

    runs = launch()
    if any(run.returncode == -signal.SIGABRT for run in runs):
        warnings.warn(f"a rank of {list(command)} got {ABORTED}; running the group again", stacklevel=2)
        runs = launch()
    return runs
