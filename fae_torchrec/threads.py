"""CPU threads that share a busy machine: OpenMP's idle threads sleep rather than spin, and each process takes
the cores it may use, shared among the ranks on its host.

PyTorch's intra-op pool is OpenMP's (libgomp), whose idle threads spin for about 3 ms (300,000 spins)
before they sleep, so that the next parallel region starts at once. On an idle machine that costs
nothing; beside other busy processes a spinning thread holds a core that the thread it waits for needs,
and every region then waits for the scheduler: the DLRM example on 2 cores beside two busy processes ran
at 1/60 of its idle speed (``benchmarks/bench_busy.py``). libgomp reads its wait policy when it is loaded,
with torch: ``prefer_passive_waits`` sets it before that, and importing ``fae_torchrec`` calls it, so the
commands, examples, benchmarks and tests that import ``fae_torchrec`` before torch all get it. A policy
the user set (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) is kept, and a process that loaded torch first is
left as it is (set the variable yourself there).
"""

from __future__ import annotations

import os
import sys

#: OpenMP's variables that choose how idle threads wait; one set by the user is kept.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def prefer_passive_waits() -> bool:
    """Make OpenMP's idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) unless a wait policy is set
    or torch, and with it OpenMP, is loaded already; whether it did."""
    if "torch" in sys.modules or any(name in os.environ for name in WAIT_VARIABLES):
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def intra_op_threads(processes: int | None = None) -> int:
    """The intra-op threads of one process: the cores it may use (its CPU affinity, not every core of the
    host), shared among ``processes`` alike (by default the ranks torchrun started on this host,
    ``LOCAL_WORLD_SIZE``), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // (processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def share_cores() -> None:
    """Set torch's intra-op threads to :func:`intra_op_threads`, unless ``OMP_NUM_THREADS`` says how many
    (torchrun sets 1 for several ranks a host; PyTorch's default, one a physical core of the host, ignores
    both the affinity and the other ranks)."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch  # here: importing this module must not load torch (and OpenMP)

        torch.set_num_threads(intra_op_threads())
