"""The planned cold tier's copy engine: rows copied between host memory and device slots, overlapping the
steps before the one that needs them (issue 48).

On CPU every copy runs at once. On CUDA the copies run on a side stream: they start once the work queued
so far on the current stream is done (the steps that last used the evicted rows), a step waits only for
the copies of its own rows (:meth:`CopyEngine.wait`), the host rows are pinned, and a row written back
reaches host memory when the engine settles (before any copy reads it again, and at :meth:`settle`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch


class CopyEngine:
    """Copies between host rows and device slots on ``device``: inline on CPU, on a side stream on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ready: dict[int, torch.cuda.Event] = {}  # per step, its copies' end
        # write-backs on their way: (end, host rows, their indices, pinned values)
        self._pending: list[tuple[torch.cuda.Event, torch.Tensor, torch.Tensor, torch.Tensor]] = []

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
            torch.cuda.current_stream(self.stream.device).wait_event(end)

    def forget(self) -> None:
        """Drop the waits of steps that will not run (a new epoch's plan)."""
        self._ready.clear()

    def to_host(self, rows: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
        """``rows[index] = values`` (device values): at once on CPU; on CUDA once copied, when settled."""
        if self.stream is None:
            rows.index_copy_(0, index, values.cpu())
            return
        staged = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        staged.copy_(values, non_blocking=True)
        end = torch.cuda.Event()
        end.record(self.stream)
        self._pending.append((end, rows, index, staged))

    def to_device(
        self, slots: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, index: torch.Tensor
    ) -> None:
        """``slots[targets] = rows[index]`` (host rows), once the write-backs of those rows are settled."""
        if any(
            held is rows and np.isin(index.numpy(), written.numpy()).any()
            for _, held, written, _ in self._pending
        ):
            self.settle()
        values = rows.index_select(0, index)
        if self.stream is not None:
            values = values.pin_memory()
        slots.index_copy_(0, targets, values.to(slots.device, non_blocking=True))

    def settle(self) -> None:
        """Every write-back issued so far reaches the host rows (waiting for it on CUDA)."""
        for end, rows, index, values in self._pending:
            end.synchronize()
            rows.index_copy_(0, index, values)
        self._pending.clear()
