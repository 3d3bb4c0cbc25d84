"""A ``torch.profiler`` trace of a run's first training steps (``--trace-steps``): where a step's time goes,
FAE's stages labelled (``fae_torchrec.trace``) beside TorchRec's and PyTorch's own (docs/trace.md)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

logger = logging.getLogger("fae_torchrec.recipes")


class StepTrace:
    """Profiles this process from its making until ``steps`` training steps are done (:meth:`step` after
    each), then writes the trace to ``path`` in Chrome's format (``chrome://tracing``, Perfetto);
    with ``steps`` 0 it does nothing. The device's kernels are traced too where there is a GPU."""

    def __init__(self, steps: int, path: Path) -> None:
        self.left, self.path, self._profile = steps, path, None
        if steps:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities)
            self._profile.start()

    def step(self) -> None:
        """One training step done: the trace is written after the last one asked for."""
        self.left -= 1
        if self.left == 0:
            self.close()

    def close(self) -> None:
        """Write the trace now (the run trained fewer steps than asked), unless it was written."""
        if self._profile is not None:
            traced, self._profile = self._profile, None
            traced.stop()
            traced.export_chrome_trace(str(self.path))
            logger.info("trace of the first training steps in %s", self.path)
