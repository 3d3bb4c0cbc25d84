"""What an FAE plan predicts, as a plain data class with a printable summary."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field, replace

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ShardingOption, Topology

from fae_torchrec.stats.hot_set import COLD, HOT
from fae_torchrec.units import format_bytes
from planner.constraints import StepPooling
from planner.topology import links_gibps

#: The kernels that keep rows in host memory (UVM), with or without a device cache.
UVM_KERNELS = (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.FUSED_UVM.value)


@dataclass(frozen=True)
class PartPlacement:
    """Where one part of one table went: rows, sharding type, kernel, load factor."""

    rows: int
    sharding_type: str
    compute_kernel: str
    load_factor: float | None = None


@dataclass(frozen=True)
class RankTotals:
    """Per rank, the predicted time (ms) and storage of the shards a plan puts there, and the part of
    that time its shards' input and output distribution take (``comms``, forward and backward)."""

    perf: tuple[float, ...]
    hbm: tuple[int, ...]
    ddr: tuple[int, ...]
    comms: tuple[float, ...]

    @property
    def step(self) -> float:
        """The predicted step time: the slowest rank's."""
        return max(self.perf)

    @classmethod
    def of(cls, options: list[ShardingOption], world_size: int) -> RankTotals:
        perf, comms = np.zeros(world_size), np.zeros(world_size)
        hbm, ddr = np.zeros(world_size, dtype=np.int64), np.zeros(world_size, dtype=np.int64)
        for shard in (shard for option in options for shard in option.shards):
            perf[shard.rank] += shard.perf.total
            comms[shard.rank] += shard.perf.fwd_comms + shard.perf.bwd_comms
            hbm[shard.rank] += shard.storage.hbm
            ddr[shard.rank] += shard.storage.ddr
        return cls(tuple(perf.tolist()), tuple(hbm.tolist()), tuple(ddr.tolist()), tuple(comms.tolist()))


def expected_step(hot_input_share: float, hot_step: float, cold_step: float) -> float:
    """A plan's expected step time: hot steps skip the cold part, weighted by the hot-input share."""
    return hot_input_share * hot_step + (1.0 - hot_input_share) * cold_step


@dataclass(frozen=True)
class FAEPlanReport:
    """Predicted figures of one plan (times in TorchRec perf-model units, ms)."""

    hot_budget_bytes: int
    hot_input_share: float
    hot_step: float
    cold_step: float
    #: The cold step of the plan's layout with every cold cache (and ``fused_uvm`` part) priced as in
    #: HBM: the cold step without its host-device transfers, which a traffic model adds.
    cold_step_in_hbm: float
    rank_hbm: tuple[int, ...]
    rank_ddr: tuple[int, ...]
    #: Per rank, the ms of its shards' input and output distribution in a cold step (TorchRec's comms).
    rank_comms: tuple[float, ...]
    #: Ranks per host and the links TorchRec prices between ranks on one host and across hosts (GiB/s).
    ranks_per_host: int
    links_gibps: tuple[float, float]
    placements: dict[str, dict[str, PartPlacement]] = field(default_factory=dict)
    #: Ids per input looked up on hot rows in a hot step, and on hot and on cold rows in a cold step.
    step_ids: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: The name of the TorchRec configuration (``planner.torchrec_configs``) the plan is, with no hot
    #: rows; None for FAE's own sizing of the cold parts.
    torchrec_config: str | None = None

    @property
    def step(self) -> float:
        """Expected step time: hot steps skip the cold part, weighted by the hot-input share."""
        return expected_step(self.hot_input_share, self.hot_step, self.cold_step)

    @property
    def hot_rows(self) -> dict[str, int]:
        return {t: parts[HOT].rows if HOT in parts else 0 for t, parts in self.placements.items()}

    @classmethod
    def from_options(
        cls,
        options: list[ShardingOption],
        fae_path: str,
        topology: Topology,
        *,
        hot_budget_bytes: int,
        hot_input_share: float,
        load_factors: dict[str, float],
        torchrec_config: str | None = None,
        hot_step: float,
        cold_step: float,
        cold_step_in_hbm: float,
        pooling: StepPooling,
    ) -> FAEPlanReport:
        """The report of a plan's sharding options on ``topology``; ``fae_path`` is the FAE module's name.
        ``hot_step`` and ``cold_step`` are the plan's predicted steps at each kind of batch's pooling
        (``cold_step_in_hbm`` the cold one with its UVM parts priced as in HBM);
        a cache's load factor is FAE's (``load_factors``) or, for TorchRec's own choice, TorchRec's;
        ``torchrec_config`` names the TorchRec configuration the plan is, if it is one."""
        paths = part_paths(fae_path)
        placements: dict[str, dict[str, PartPlacement]] = {}
        for option in options:
            part = paths.get(option.path)
            if part is None:
                continue
            placements.setdefault(option.name.removesuffix(f"_{part}"), {})[part] = PartPlacement(
                rows=int(option.tensor.shape[0]),
                sharding_type=option.sharding_type,
                compute_kernel=option.compute_kernel,
                load_factor=load_factors.get(option.name.removesuffix(f"_{COLD}"), option.cache_load_factor)
                if option.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
                else None,
            )
        totals = RankTotals.of(options, topology.world_size)
        return cls(
            hot_budget_bytes=hot_budget_bytes,
            hot_input_share=hot_input_share,
            hot_step=hot_step,
            cold_step=cold_step,
            cold_step_in_hbm=cold_step_in_hbm,
            rank_hbm=totals.hbm,
            rank_ddr=totals.ddr,
            rank_comms=totals.comms,
            ranks_per_host=topology.local_world_size,
            links_gibps=links_gibps(topology),
            placements=placements,
            torchrec_config=torchrec_config,
            step_ids=(
                pooling.ids_per_input(pooling.hot_step),
                pooling.ids_per_input(pooling.cold_step_hot),
                pooling.ids_per_input(pooling.cold_step_cold),
            ),
        )

    def __str__(self) -> str:
        lines = [
            f"FAE plan: hot budget {format_bytes(self.hot_budget_bytes)}, predicted hot-input share "
            f"{self.hot_input_share:.1%}"
            + (f"; TorchRec's own configuration '{self.torchrec_config}'" if self.torchrec_config else ""),
            f"predicted step {self.step:.3f} ms = {self.hot_input_share:.3f} x hot step "
            f"{self.hot_step:.3f} ms + {1 - self.hot_input_share:.3f} x cold step {self.cold_step:.3f} ms "
            "(TorchRec's perf model)",
            f"ids per input: hot step {self.step_ids[0]:.2f} on hot rows; cold step {self.step_ids[1]:.2f} "
            f"on hot rows, {self.step_ids[2]:.2f} on cold rows (each step priced at its own batches' "
            "pooling, measured on the holdout)",
            f"{'table':<14}{'hot rows':>11}  {'hot sharding':<26}{'cold rows':>11}  {'cold sharding':<34}",
        ]
        for table, parts in self.placements.items():
            hot, cold = parts.get(HOT), parts.get(COLD)
            lines.append(
                f"{table:<14}{hot.rows if hot else 0:>11,}  {_where(hot):<26}"
                f"{cold.rows if cold else 0:>11,}  {_where(cold):<34}"
            )
        world = len(self.rank_hbm)
        hosts = -(-world // self.ranks_per_host)
        lines.append(
            f"{hosts} host(s) of {min(self.ranks_per_host, world)} rank(s); TorchRec prices the input and "
            f"output distribution at {self.links_gibps[0]:.1f} GiB/s within a host, "
            f"{self.links_gibps[1]:.1f} GiB/s across hosts"
        )
        for rank, (h, d, c) in enumerate(zip(self.rank_hbm, self.rank_ddr, self.rank_comms, strict=True)):
            lines.append(
                f"rank {rank} (host {rank // self.ranks_per_host}): HBM {format_bytes(h)}, DDR "
                f"{format_bytes(d)}, distribution {c:.3f} ms (TorchRec's perf model)"
            )
        return "\n".join(lines)


def in_hbm(options: list[ShardingOption]) -> list[ShardingOption]:
    """Copies of ``options`` whose UVM kernels (``fused_uvm``, ``fused_uvm_caching``) are ``fused``, as
    TorchRec's scale-up proposer promotes a table: the same layout (sharding types, shards, ranks) with
    every row in HBM, to price a plan's step without its host-device transfers (give them to the plan's
    enumerator's ``populate_estimates`` first)."""
    copies = deepcopy(options)
    for option in copies:
        if option.compute_kernel in UVM_KERNELS:
            option.compute_kernel = EmbeddingComputeKernel.FUSED.value
            if option.cache_params is not None:
                option.cache_params = replace(option.cache_params, load_factor=None)
    return copies


def _where(placement: PartPlacement | None) -> str:
    if placement is None:
        return "-"
    text = f"{placement.sharding_type}/{placement.compute_kernel}"
    if placement.load_factor is not None:
        text += f" lf={placement.load_factor:.3f}"
    return text


def part_paths(fae_path: str) -> dict[str, str]:
    """The module paths of the hot and cold parts of the FAE module at ``fae_path``, to their part."""
    return {f"{fae_path}.{part}" if fae_path else part: part for part in (HOT, COLD)}
