"""CPU threads that share a busy machine: OpenMP's idle threads spin briefly before they sleep, and each
process takes the cores it may use, shared among the ranks on its host, less those other processes keep
busy when it starts.

PyTorch's intra-op pool is OpenMP's (libgomp), whose idle threads spin for about 3 ms (300,000 spins)
before they sleep, so that the next parallel region starts at once. On an idle machine that costs
nothing; beside other busy processes a spinning thread holds a core that the thread it waits for needs,
and every region then waits for the scheduler: the DLRM example on 2 cores beside two busy processes ran
at about 1/90 of its idle speed (``benchmarks/bench_busy.py``). Sleeping at once instead
(``OMP_WAIT_POLICY=PASSIVE``) cost a sixth of the idle speed there, since every region then wakes its
threads; ``SPIN_COUNT`` spins (about 0.1 ms) catch the next region of a step on an idle machine and bound
what a wait takes from others. libgomp reads its spin count when it is loaded, with torch:
``bound_spinning`` sets it before that, and importing ``fae_torchrec`` calls it, so the commands,
examples, benchmarks and tests that import ``fae_torchrec`` before torch all get it. A policy the user set
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) is kept, and a process that loaded torch first is left as it is.

A thread on a core another process keeps busy only waits (a parallel region ends with its slowest
thread): :func:`share_cores` leaves those cores out when a command starts.
"""

from __future__ import annotations

import os
import sys
import time

#: OpenMP's variables that choose how idle threads wait; one set by the user is kept.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: libgomp's spins before an idle thread sleeps (about 0.1 ms; its own default is 300,000).
SPIN_COUNT = 10_000
#: Seconds over which :func:`busy_cores` counts what other processes run.
BUSY_WINDOW = 0.25


def bound_spinning() -> bool:
    """Make OpenMP's idle threads sleep after ``SPIN_COUNT`` spins (``GOMP_SPINCOUNT``) unless a wait
    policy is set or torch, and with it OpenMP, is loaded already; whether it did."""
    if "torch" in sys.modules or any(name in os.environ for name in WAIT_VARIABLES):
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True


def usable_cores() -> set[int]:
    """The cores this process may run on (its CPU affinity: ``taskset``, a container's CPU set)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def busy_cores(seconds: float = BUSY_WINDOW) -> float:
    """How many of :func:`usable_cores` other processes keep busy now: their busy time over ``seconds``
    in ``/proc/stat``, while this process sleeps (0 where there is no ``/proc/stat``)."""
    cores = usable_cores()

    def busy_and_total() -> tuple[int, int]:
        busy = total = 0
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                    jiffies = [int(field) for field in fields[:7]]
                    busy, total = busy + sum(jiffies) - jiffies[3] - jiffies[4], total + sum(jiffies)
        return busy, total  # all but idle and iowait

    try:
        before = busy_and_total()
        time.sleep(seconds)
        after = busy_and_total()
    except OSError:
        return 0.0
    return len(cores) * (after[0] - before[0]) / max(after[1] - before[1], 1)


def intra_op_threads(processes: int | None = None, busy: float = 0.0) -> int:
    """The intra-op threads of one process: the cores it may use, shared among ``processes`` alike (by
    default the ranks torchrun started on this host, ``LOCAL_WORLD_SIZE``), and no more than those
    ``busy`` leaves free (cores that other processes keep busy); at least 1."""
    cores = len(usable_cores())
    share = cores // (processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(share, cores - round(busy)))


def share_cores() -> str | None:
    """Set torch's intra-op threads to :func:`intra_op_threads` with the cores other processes keep busy
    now (:func:`busy_cores`), unless ``OMP_NUM_THREADS`` says how many (torchrun sets 1 for several ranks
    a host; PyTorch's own default, a thread per physical core of the host, sees neither the affinity, the
    other ranks nor the load); what it did, for the log (None: nothing)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    import torch  # here: importing this module must not load torch (and OpenMP)

    busy = busy_cores()
    threads = intra_op_threads(busy=busy)
    torch.set_num_threads(threads)
    return (
        f"{threads} intra-op thread(s): {len(usable_cores())} usable cores, {busy:.1f} busy with other "
        f"processes, {os.environ.get('LOCAL_WORLD_SIZE', '1')} rank(s) on this host"
    )
