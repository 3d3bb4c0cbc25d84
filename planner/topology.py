"""``make_topology``: a TorchRec ``Topology`` built the way TorchRec asks, through its ``TopologyFactory``.

A ``Topology`` constructed directly plans the same, but TorchRec warns that it was not made by the factory;
the command line, the examples and the benchmarks build theirs here.
"""

from __future__ import annotations

from torchrec.distributed.planner.types import KernelConfig, Topology, TopologyFactory, TrainerConfig


def make_topology(world_size: int, compute_device: str = "cuda", hbm_cap: int | None = None) -> Topology:
    """``world_size`` devices of ``compute_device`` with ``hbm_cap`` bytes of HBM each (TorchRec's default
    when None), TorchRec's defaults otherwise."""
    return TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, hbm_cap_bytes=hbm_cap),
        kernel_config=KernelConfig(compute_device=compute_device),
    )
