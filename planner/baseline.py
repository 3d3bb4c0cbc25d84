"""TorchRec's own plan of the unsplit model: what FAE is compared against."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from planner.report import RankTotals


def torchrec_default_plan(
    tables: Sequence[EmbeddingBagConfig], topology: Topology, batch_size: int
) -> tuple[ShardingPlan, RankTotals, Counter[str]]:
    """TorchRec's default ``EmbeddingShardingPlanner`` on an EBC of ``tables`` (a dry run on meta):
    the plan, its per-rank predictions, and how many tables each compute kernel got."""
    module = EmbeddingBagCollection(list(tables), device=torch.device("meta"))
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, stats=[], debug=False)
    plan = planner.plan(module, get_default_sharders())
    options = planner._best_plan
    kernels = Counter(option.compute_kernel for option in options)
    return plan, RankTotals.of(options, topology.world_size), kernels
