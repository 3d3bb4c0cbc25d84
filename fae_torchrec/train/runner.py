"""Routed batches trained in a plain loop or on TorchRec's train pipelines, with their step times."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import cast

import torch
from torch import nn
from torch.profiler import record_function
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist

from fae_torchrec import trace
from fae_torchrec.command_line import PIPELINES
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.router import RoutedBatch
from fae_torchrec.train.step import train_step

#: Per step: the routed batch, its loss, the step's seconds and the seconds spent getting its batch.
TrainedStep = tuple[RoutedBatch, float, float, float]


class StepRunner:
    """Trains routed batches in the plain loop (``none``) or on TorchRec's train pipeline (``sparse``:
    ``FAETrainPipeline`` for an FAE model, ``TrainPipelineSparseDist`` for another) or prefetch pipeline
    (``prefetch``: ``FAEPrefetchTrainPipeline``, ``PrefetchTrainPipelineSparseDist``).

    A pipeline reads ahead, so give :meth:`train` the steps up to a pause (an evaluation, a checkpoint):
    it trains them all, and :meth:`paused` is then the model to evaluate or save, detached from the
    pipeline, which attaches it again on its next step."""

    def __init__(
        self,
        kind: str,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        *,
        fae: bool,
    ) -> None:
        if kind not in PIPELINES:
            raise ValueError(f"pipeline {kind!r}: expected one of {', '.join(PIPELINES)}")
        self.model, self.optimizer, self.device = model, optimizer, device
        pipeline = {
            "sparse": FAETrainPipeline if fae else TrainPipelineSparseDist,
            "prefetch": FAEPrefetchTrainPipeline if fae else PrefetchTrainPipelineSparseDist,
        }
        self.pipeline = None if kind == "none" else pipeline[kind](model, optimizer, device)

    def train(self, routed: Iterator[RoutedBatch]) -> Iterator[TrainedStep]:
        """Train every step of ``routed``; per step, the routed batch, its loss, the step's seconds and
        the seconds spent getting its batch from ``routed`` (onto the device, in the plain loop)."""
        return self._plain(routed) if self.pipeline is None else self._pipelined(routed)

    def paused(self) -> nn.Module:
        return self.model if self.pipeline is None else self.pipeline.detach()

    def _plain(self, routed: Iterator[RoutedBatch]) -> Iterator[TrainedStep]:
        while True:
            started = time.perf_counter()
            step = next(routed, None)
            if step is None:
                return
            batch = step.batch.to(self.device)
            _synchronize(self.device)
            routed_at = time.perf_counter()
            with record_function(trace.STEP):
                loss = train_step(self.model, batch, self.optimizer)
            _synchronize(self.device)
            yield step, loss, time.perf_counter() - routed_at, routed_at - started

    def _pipelined(self, routed: Iterator[RoutedBatch]) -> Iterator[TrainedStep]:
        pipeline = self.pipeline
        assert pipeline is not None  # called where there is one
        taken: deque[RoutedBatch] = deque()  # read by the pipeline, not yet trained
        routing = [0.0]

        def batches() -> Iterator[Batch]:
            while True:
                started = time.perf_counter()
                step = next(routed, None)
                routing[0] += time.perf_counter() - started
                if step is None:
                    return
                taken.append(step)
                yield step.batch

        source = batches()
        while True:
            before, started = routing[0], time.perf_counter()
            try:
                with record_function(trace.STEP):
                    output = pipeline.progress(source)
            except StopIteration:
                return
            _synchronize(self.device)
            spent = routing[0] - before
            loss = cast(tuple, output)[0]  # a train module's (loss, (loss, logits, labels))
            yield taken.popleft(), float(loss), time.perf_counter() - started - spent, spent


def steps_to_pause(step: int, left: int, *every: int) -> int:
    """Steps from step ``step`` to the next multiple of any of ``every`` (0: never), at most ``left``."""
    return min([left] + [n - step % n for n in every if n])


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that the clock reads real step times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
