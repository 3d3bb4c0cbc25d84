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
import sys
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
        env = [
            {**os.environ, **group, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(world_size)
        ]
        return _run_together([command] * world_size, timeout, cwd, env)

    runs = launch()
    if any(run.returncode == -signal.SIGABRT for run in runs):
        warnings.warn(f"a rank of {list(command)} got {ABORTED}; running the group again", stacklevel=2)
        runs = launch()
    return runs


def run_nodes(
    command: Sequence[str], nodes: int, ranks_per_node: int, timeout: float, outputs: Sequence[Path] = ()
) -> list[subprocess.CompletedProcess]:
    """Run ``command`` on ``nodes`` torchrun agents of ``ranks_per_node`` ranks each, all on this machine,
    as on that many hosts: ``torchrun --nnodes`` per node, meeting by c10d rendezvous on a free local port
    (the first node hosts the store). Each node's exit status and output; ``timeout`` (seconds) fails a
    hang. A group with a rank killed by SIGABRT runs once more, ``outputs`` removed first."""

    def launch() -> list[subprocess.CompletedProcess]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]

        def torchrun(node: int) -> list[str]:
            return [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
                str(ranks_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"nodes-{port}", "--rdzv-conf", f"is_host={int(node == 0)}", *command,
            ]  # fmt: skip

        return _run_together([torchrun(node) for node in range(nodes)], timeout)

    runs = launch()
    if any(run.returncode != 0 and ABORTED in run.stderr for run in runs):
        warnings.warn(f"a rank of {list(command)} got {ABORTED}; running the nodes again", stacklevel=2)
        for path in outputs:
            shutil.rmtree(path, ignore_errors=True)
        runs = launch()
    return runs


def _run_together(
    commands: Sequence[Sequence[str]],
    timeout: float,
    cwd: Path | None = None,
    envs: Sequence[dict[str, str]] | None = None,
) -> list[subprocess.CompletedProcess]:
    """Start every command at once (in ``cwd``, each with its ``envs`` entry), each writing to its own
    temporary files, so that none blocks on a full pipe; wait for all, killing those still running after
    ``timeout`` seconds; each one's exit status and output."""
    with ExitStack() as files:
        logs = [[files.enter_context(tempfile.TemporaryFile("w+")) for _ in "oe"] for _ in commands]
        started = [
            subprocess.Popen(list(command), stdout=out, stderr=err, cwd=cwd, env=env)
            for command, env, (out, err) in zip(commands, envs or [None] * len(commands), logs, strict=True)
        ]
        try:
            for process in started:
                process.wait(timeout=timeout)
        finally:
            for process in started:
                process.kill()  # those still running, after a timeout
        for file in (file for pair in logs for file in pair):
            file.seek(0)
        return [
            subprocess.CompletedProcess(
                process.args, process.returncode, stdout=out.read(), stderr=err.read()
            )
            for process, (out, err) in zip(started, logs, strict=True)
        ]
