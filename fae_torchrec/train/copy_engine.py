"""The planned cold tier's copy engine: rows copied between host memory and device slots, overlapping the
steps before the one that needs them (issue 48).

On CPU every copy runs at once. On CUDA the copies run on a side stream: they start once the work queued
so far on the current stream is done (the steps that last used the evicted rows), a step waits only for
the copies of its own rows (:meth:`CopyEngine.wait`), the host rows are pinned, and a row written back
reaches host memory when its copy has ended and the engine collects it (:meth:`collect`), or at the
latest when it settles (before any copy reads it again, and at :meth:`settle`). Nothing the engine does
per step waits for the device: slot indices travel from pinned memory, and :meth:`collect` takes only
the write-backs already done, so the host prepares the next steps while the device runs this one.

With ``mapped`` (CUDA) the host does none of the copying: the pinned host rows are also seen by the
device (unified addressing maps pinned memory, as FBGEMM's host-mapped UVM tables are), so a load is one
gather kernel reading host memory over the link into the slots and a write-back one scatter kernel
writing it, both on the side stream in the order issued; nothing is staged, and the host rows are current
once the stream is (:meth:`settle`). On CPU both ways are the same plain copies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch


class CopyEngine:
    """Copies between host rows and device slots on ``device``: inline on CPU, on a side stream on CUDA."""

    def __init__(self, device: torch.device, *, mapped: bool = False) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.mapped = mapped and self.stream is not None
        # mapped: per pinned host rows tensor, the device's view of it
        self._aliases: dict[torch.Tensor, torch.Tensor] = {}
        self._ready: dict[int, torch.cuda.Event] = {}  # per step, its copies' end
        # write-backs on their way: (end, host rows, their indices, pinned values)
        self._pending: deque[tuple[torch.cuda.Event, torch.Tensor, torch.Tensor, torch.Tensor]] = deque()
        # per host rows tensor written back to (keyed by the tensor itself): write-backs on their way per row
        self._in_flight: dict[torch.Tensor, np.ndarray] = {}

    @contextmanager
    def copying(self, steps: Sequence[int] = ()) -> Iterator[None]:
        """Copies issued within run after the work queued so far; on CUDA on the side stream, waited for
        by the steps ``steps`` (:meth:`wait`), or at once by the current stream where none is named."""
        if self.stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        end = torch.cuda.Event()
        end.record(self.stream)
        if not steps:
            current.wait_event(end)
        self._ready.update(dict.fromkeys(steps, end))

    def wait(self, step: int) -> None:
        """The current stream waits for the copies of ``step``'s rows (none on CPU)."""
        end = self._ready.pop(step, None)
        if end is not None:
            assert self.stream is not None  # events are recorded on CUDA's side stream only
            torch.cuda.current_stream(self.stream.device).wait_event(end)

    def forget(self) -> None:
        """Drop the waits of steps that will not run (a new epoch's plan)."""
        self._ready.clear()

    def index(self, slots: np.ndarray) -> torch.Tensor:
        """``slots`` as an index on the device, copied there without waiting (from pinned memory)."""
        index = torch.from_numpy(slots)
        if self.stream is None:
            return index
        return index.pin_memory().to(self.stream.device, non_blocking=True)

    def to_host(self, rows: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
        """``rows[index] = values`` (device values): at once on CPU; on CUDA once copied, when collected
        or settled."""
        if self.stream is None:
            rows.index_copy_(0, index, values.cpu())
            return
        if self.mapped:
            self._alias(rows).index_copy_(0, self.index(index.numpy()), values)
            return
        staged = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        staged.copy_(values, non_blocking=True)
        end = torch.cuda.Event()
        end.record(self.stream)
        self._pending.append((end, rows, index, staged))
        if rows not in self._in_flight:
            self._in_flight[rows] = np.zeros(len(rows), dtype=np.int32)
        self._in_flight[rows][index.numpy()] += 1  # distinct rows

    def to_device(
        self, slots: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, index: torch.Tensor
    ) -> None:
        """``slots[targets] = rows[index]`` (host rows), once the write-backs of those rows are settled."""
        if self.mapped:  # after the write-backs issued before it, on the same stream
            slots.index_copy_(0, targets, self._alias(rows).index_select(0, self.index(index.numpy())))
            return
        if rows in self._in_flight and self._in_flight[rows][index.numpy()].any():
            self.settle()
        values = torch.empty(
            (len(index), *rows.shape[1:]), dtype=rows.dtype, pin_memory=self.stream is not None
        )
        torch.index_select(rows, 0, index, out=values)
        slots.index_copy_(0, targets, values.to(slots.device, non_blocking=True))

    def collect(self) -> None:
        """The write-backs whose copies have ended reach the host rows, in the order they were issued;
        waits for none."""
        while self._pending and self._pending[0][0].query():
            self._arrive()

    def settle(self) -> None:
        """Every write-back issued so far reaches the host rows (waiting for it on CUDA)."""
        if self.mapped:
            assert self.stream is not None  # mapped copies run on CUDA's side stream
            self.stream.synchronize()
        while self._pending:
            self._pending[0][0].synchronize()
            self._arrive()

    def _arrive(self) -> None:
        """The oldest write-back, its copy ended, reaches its host rows."""
        _, rows, index, values = self._pending.popleft()
        rows.index_copy_(0, index, values)
        self._in_flight[rows][index.numpy()] -= 1

    def _alias(self, rows: torch.Tensor) -> torch.Tensor:
        """The device's view of the pinned host ``rows`` (made once per tensor)."""
        if rows not in self._aliases:
            if not rows.is_pinned():
                raise ValueError("mapped copies need pinned host rows")
            assert self.stream is not None  # mapped copies run on CUDA's side stream
            self._aliases[rows] = torch.as_tensor(_DeviceView(rows), device=self.stream.device)
        return self._aliases[rows]


class _DeviceView:
    """Pinned host memory described to torch as device memory (``__cuda_array_interface__``): under
    unified addressing a pinned host pointer is valid on the device. Keeps ``rows`` alive with the view."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.__cuda_array_interface__ = {
            "shape": tuple(rows.shape),
            "typestr": torch.empty(0, dtype=rows.dtype).numpy().dtype.str,
            "data": (rows.data_ptr(), False),
            "strides": tuple(stride * rows.element_size() for stride in rows.stride()),
            "version": 3,
        }
