"""``SlotCopyEstimator``: a planned cold tier's copies priced as TorchRec prices a cache's prefetch.

A slot table's lookups cost what a plain ``fused`` table's do, but before its cold steps the tier copies
rows in and writes evicted ones back (issue 48). TorchRec's ``Perf`` has the term for such work,
``prefetch_compute`` (its UVM caches' prefetch): counted in the shard's total, so that the partitioner
spreads it over the ranks, as it spreads the caches' prefetch. The estimator adds each slot table's
copies there, in proportion to its shards' rows, over the link they cross: host to device on CUDA,
host memory on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from torchrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption, Topology


class SlotCopyEstimator(ShardEstimator):
    """Adds ``copied_bytes[name]`` (bytes a slot table's plan copies in and back per cold step) over the
    topology's host-device bandwidth to the ``prefetch_compute`` of sharding option ``name``'s shards,
    each its share of the table's rows; run after TorchRec's perf estimator, which sets the perfs."""

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        copied_bytes: Mapping[str, float] | None = None,
    ) -> None:
        on_device = topology.compute_device == "cuda"
        self.bandwidth = topology.hbm_to_ddr_mem_bw if on_device else topology.ddr_mem_bw  # bytes per ms
        self.copied_bytes = dict(copied_bytes or {})

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map: object = None) -> None:
        for option in sharding_options:
            copied = self.copied_bytes.get(option.name)
            if not copied:
                continue
            rows = option.tensor.shape[0]
            for shard in option.shards:
                if shard.perf is None:
                    raise ValueError(f"{option.name}: price the shards' perf before their copies")
                copies = copied * shard.size[0] / rows / self.bandwidth
                shard.perf = replace(shard.perf, prefetch_compute=shard.perf.prefetch_compute + copies)
