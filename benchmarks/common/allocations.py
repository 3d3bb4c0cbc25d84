"""The bytes a block of code allocates and still holds at its peak, from the allocators' own events.

The resident set (``VmHWM``) of a process that holds gigabytes of tables varies by about 0.1 GiB between
runs of the same code here (glibc's arenas keep or return freed pages as they go), which hides what a
block of tens of MiB adds. The allocators' events do not vary: torch's CPU tensors through the
profiler's memory events (``profile_memory``), numpy's arrays and Python's objects through
``tracemalloc``. Each counts what the block allocates minus what it frees of that, at its peak; memory
the block frees that was allocated before it is not subtracted (neither tool saw it allocated), so the
sum of the two peaks is an upper bound on what the block adds. Phases of the block (``AllocationTrace.phase``)
are counted alike from where each begins. Both tools slow the block down: time it in a run without them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from torch.profiler import ProfilerActivity, profile, record_function

#: The profiler annotation that marks a phase, before its name.
PHASE = "allocations.phase:"
#: What the profiler writes on stderr by itself: kineto as it starts and stops, c10 as a tensor allocated
#: before it is freed (such frees are not counted, as the module docstring says).
PROFILER_LINES = ("SyncActivityProfilerHandler", "Memory block of unknown size was allocated before")


@dataclass
class Allocations:
    """What a traced block allocated and held at its peak: torch CPU tensors' bytes and numpy's arrays'
    and Python's objects' bytes (each its own peak)."""

    tensor_bytes: int = 0
    python_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Both peaks together: an upper bound on the block's extra memory."""
        return self.tensor_bytes + self.python_bytes


@dataclass
class AllocationTrace:
    """The allocations of a traced block (``whole``) and of the named phases within it (``phases``, each
    counted from where it began), filled in as the block ends."""

    whole: Allocations = field(default_factory=Allocations)
    phases: dict[str, Allocations] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named phase of the traced block."""
        before, peak = tracemalloc.get_traced_memory()
        self.whole.python_bytes = max(self.whole.python_bytes, peak)
        tracemalloc.reset_peak()
        try:
            with record_function(PHASE + name):
                yield
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            self.whole.python_bytes = max(self.whole.python_bytes, peak)
            self.phases[name] = Allocations(python_bytes=peak - before)
            tracemalloc.reset_peak()

    def _count_tensors(self, events: list) -> None:
        """The tensor peaks, of the whole and of each phase, from the profiler's ``events``."""
        memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
        times = np.array([t for t, _ in memory], dtype=np.int64)
        held = np.concatenate([[0], np.cumsum([b for _, b in memory], dtype=np.int64)])  # after each event
        self.whole.tensor_bytes = int(held.max())
        for e in events:
            if e.name().startswith(PHASE):
                first, last = np.searchsorted(times, [e.start_ns(), e.end_ns()], side="right")
                during = held[first : last + 1]  # held as it began, and after each event within it
                self.phases[e.name().removeprefix(PHASE)].tensor_bytes = int(during.max() - during[0])


@contextmanager
def traced_allocations() -> Iterator[AllocationTrace]:
    """Trace the block's allocations, and those of its phases (``AllocationTrace.phase``)."""
    trace = AllocationTrace()
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _stderr_without(PROFILER_LINES):
        profiler.start()
        tracemalloc.start()
        try:
            yield trace
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            trace.whole.python_bytes = max(trace.whole.python_bytes, peak)
            tracemalloc.stop()
            profiler.stop()
    trace._count_tensors(profiler.profiler.kineto_results.events())


@contextmanager
def _stderr_without(dropped: tuple[str, ...]) -> Iterator[None]:
    """File descriptor 2 (C++ libraries' lines included) caught inside the block and written out after it,
    less the lines that hold one of ``dropped``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.writelines(line for line in lines if not any(d in line for d in dropped))
