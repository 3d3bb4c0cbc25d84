"""``make_topology``: a TorchRec ``Topology`` built the way TorchRec asks, through its ``TopologyFactory``.

A ``Topology`` constructed directly plans the same, but TorchRec warns that it was not made by the factory;
the command line, the examples and the benchmarks build theirs here.
"""

from __future__ import annotations

import torch
from torchrec.distributed.planner.types import KernelConfig, Topology, TopologyFactory, TrainerConfig

#: The most CUDA devices a host may have. TorchRec's topology puts them all on one host unless told its
#: ``local_world_size``, and torch numbers a host's devices in 8 bits: TorchRec's plan
#: places a shard of rank 128 on ``cuda:-128`` and fails ("Invalid device string", seen at 256 GPUs after
#: 7 minutes of planning), and at 100,000 GPUs planning ran past 10 minutes and 3 GB before it got there.
MAX_CUDA_DEVICES = 128


def make_topology(
    world_size: int,
    compute_device: str = "cuda",
    hbm_cap: int | None = None,
    local_world_size: int | None = None,
) -> Topology:
    """``world_size`` devices of ``compute_device`` with ``hbm_cap`` bytes of HBM each (TorchRec's default
    when None), ``local_world_size`` of them on each host (all on one when None; TorchRec prices the links
    within and across hosts apart), TorchRec's defaults otherwise. Raises ``ValueError`` for more than
    ``MAX_CUDA_DEVICES`` CUDA devices on one host, or hosts of unequal size."""
    local = local_world_size or world_size
    if local < 1 or world_size % local:
        raise ValueError(
            f"{world_size} ranks do not fill hosts of {local_world_size}: the ranks per host must divide them"
        )
    if compute_device == "cuda" and local > MAX_CUDA_DEVICES:
        raise ValueError(
            f"at most {MAX_CUDA_DEVICES} CUDA devices on a host, got {local}: torch numbers a host's devices "
            f"up to {MAX_CUDA_DEVICES - 1}"
        )
    return TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, local_world_size=local, hbm_cap_bytes=hbm_cap),
        kernel_config=KernelConfig(compute_device=compute_device),
    )


def links_gibps(topology: Topology) -> tuple[float, float]:
    """The bandwidths (GiB/s) TorchRec's perf model gives the input and output distribution between ranks
    of one host and across hosts (``Topology`` keeps them in bytes per ms)."""
    return topology.intra_host_bw * 1e3 / 2**30, topology.inter_host_bw * 1e3 / 2**30


def local_devices() -> tuple[str, int, int | None]:
    """This machine's devices as the examples train on them: its CUDA GPUs (``cuda``, how many, the
    first one's memory in bytes) or, without any, its CPU as one rank (``cpu``, 1, None)."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory
    return "cpu", 1, None
