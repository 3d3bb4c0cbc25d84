"""What an FAE plan predicts, as a plain data class with a printable summary."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torchrec.distributed.planner.types import ShardingOption

from fae_torchrec import format_bytes
from fae_torchrec.fae_embedding_bag import COLD, HOT


@dataclass(frozen=True)
class PartPlacement:
    """Where one part of one table went: rows, sharding type, kernel, ranks, load factor."""

    rows: int
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    load_factor: float | None = None


@dataclass(frozen=True)
class FAEPlanReport:
    """Predicted figures of one plan (times in TorchRec perf-model units, ms)."""

    hot_budget_bytes: int
    hot_input_share: float
    hot_step: float
    cold_step: float
    rank_hbm: tuple[int, ...]
    rank_ddr: tuple[int, ...]
    placements: dict[str, dict[str, PartPlacement]] = field(default_factory=dict)

    @property
    def step(self) -> float:
        """Expected step time: hot steps skip the cold part, weighted by the hot-input share."""
        return self.hot_input_share * self.hot_step + (1.0 - self.hot_input_share) * self.cold_step

    @property
    def hot_rows(self) -> dict[str, int]:
        return {t: parts[HOT].rows if HOT in parts else 0 for t, parts in self.placements.items()}

    @classmethod
    def from_options(
        cls,
        options: list[ShardingOption],
        world_size: int,
        hot_budget_bytes: int,
        hot_input_share: float,
        load_factors: dict[str, float],
    ) -> FAEPlanReport:
        hot_time, all_time = np.zeros(world_size), np.zeros(world_size)
        hbm, ddr = np.zeros(world_size, dtype=np.int64), np.zeros(world_size, dtype=np.int64)
        placements: dict[str, dict[str, PartPlacement]] = {}
        for option in options:
            table, part = option.name.rsplit("_", 1)
            ranks = tuple(sorted({shard.rank for shard in option.shards}))
            placements.setdefault(table, {})[part] = PartPlacement(
                rows=int(option.tensor.shape[0]),
                sharding_type=option.sharding_type,
                compute_kernel=option.compute_kernel,
                ranks=ranks,
                load_factor=load_factors.get(table) if part == COLD else None,
            )
            for shard in option.shards:
                all_time[shard.rank] += shard.perf.total
                if part == HOT:
                    hot_time[shard.rank] += shard.perf.total
                hbm[shard.rank] += shard.storage.hbm
                ddr[shard.rank] += shard.storage.ddr
        return cls(
            hot_budget_bytes=hot_budget_bytes,
            hot_input_share=hot_input_share,
            hot_step=float(hot_time.max()),
            cold_step=float(all_time.max()),
            rank_hbm=tuple(int(x) for x in hbm),
            rank_ddr=tuple(int(x) for x in ddr),
            placements=placements,
        )

    def __str__(self) -> str:
        lines = [
            f"FAE plan: hot budget {format_bytes(self.hot_budget_bytes)}, predicted hot-input share "
            f"{self.hot_input_share:.1%}",
            f"predicted step {self.step:.3f} ms (hot step {self.hot_step:.3f} ms, "
            f"cold step {self.cold_step:.3f} ms)",
            f"{'table':<14}{'hot rows':>11}  {'hot sharding':<26}{'cold rows':>11}  {'cold sharding':<34}",
        ]
        for table, parts in self.placements.items():
            hot, cold = parts.get(HOT), parts.get(COLD)
            lines.append(
                f"{table:<14}{hot.rows if hot else 0:>11,}  {_where(hot):<26}"
                f"{cold.rows if cold else 0:>11,}  {_where(cold):<34}"
            )
        for rank, (h, d) in enumerate(zip(self.rank_hbm, self.rank_ddr, strict=True)):
            lines.append(f"rank {rank}: HBM {format_bytes(h)}, DDR {format_bytes(d)}")
        return "\n".join(lines)


def _where(placement: PartPlacement | None) -> str:
    if placement is None:
        return "-"
    text = f"{placement.sharding_type}/{placement.compute_kernel}"
    if placement.load_factor is not None:
        text += f" lf={placement.load_factor:.3f}"
    return text
