"""A planned cold tier trains the baseline's model: cold rows in host memory, copied into a few device
slots ahead of each cold step by the slot plan of the epoch's schedule, and written back with their
optimizer state when evicted.

The FAE model's cold tables hold slots (``cold_slots``), fewer than their cold rows, so rows come and
go; both models train on the same batches under DMP (gloo, CPU), the slot tables table-wise or (2 ranks)
row-wise, and the parameters end equal in the original layout, with exactly the used rows moved.
"""

from itertools import islice

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import FAEEmbeddingBagCollection
from fae_torchrec.modules.fae_embedding_bag import part_table_name
from fae_torchrec.stats.hot_set import COLD
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.step import train_step
from tests.distributed import run_on_ranks
from tests.test_equivalence import OPTIMIZERS, PREFIXES, STEPS, _assert_trained_alike, _model, _setup, _shard

PREFIX = PREFIXES["dlrm"]


def _slots(hot_set, world_size: int) -> dict[str, int]:
    """Per table with cold rows: room for one step's lookups (one id per input, 32 inputs per rank) and
    one more (an odd count: uneven row-wise shards)."""
    num_hot = {t.name: len(ids) for t, ids in zip(hot_set.tables, hot_set.hot_ids, strict=True)}
    return {
        t.name: min(t.num_embeddings - num_hot[t.name], 32 * world_size + 1)
        for t in hot_set.tables
        if t.num_embeddings > num_hot[t.name]
    }


def _row_wise_cold(model, world_size: int):
    """Replaces a plan's entry of ``model``'s cold part by one that shards every slot table row-wise
    (TorchRec's blocks: the last shard smaller where the slots do not divide evenly)."""

    def adjust(plan) -> None:
        cold = model.get_submodule(PREFIX + COLD)
        shardings = {name: row_wise(compute_kernel="fused") for name in cold.embedding_bags}
        plan.plan[PREFIX + COLD] = construct_module_sharding_plan(
            cold, shardings, world_size=world_size, device_type="cpu"
        )

    return adjust


def _planned_training(
    rank: int, world_size: int, optimizer_name: str, window: int | None, row_wise_cold: bool = False
) -> None:
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    embedding = EmbeddingOptimizer(optimizer, kwargs)
    data, tables, _, hot_set = _setup("dlrm", world_size)
    slots = _slots(hot_set, world_size)
    torch.manual_seed(0)  # the same initial tables on every rank
    baseline_ebc = EmbeddingBagCollection(tables)
    initial = {name: value.clone() for name, value in baseline_ebc.state_dict().items()}
    baseline = _model("dlrm", baseline_ebc)
    initial_dense = {name: value.clone() for name, value in baseline.state_dict().items()}
    split = FAEEmbeddingBagCollection(tables, hot_set, cold_slots=slots)
    hot_rows = {k: v for k, v in split.split_state(initial).items() if not k.startswith(COLD)}
    split.load_state_dict(hot_rows, strict=False)
    fae = _model("dlrm", split)
    fae.load_state_dict(baseline.state_dict(), strict=False)  # the same dense layers
    topology = Topology(world_size=world_size, compute_device="cpu")
    table_wise = ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
    base_planner = EmbeddingShardingPlanner(topology, batch_size=32, constraints=dict.fromkeys(
        (t.name for t in tables), table_wise))  # fmt: skip
    base_dmp, base_optimizer, _ = _shard(baseline, PREFIX, base_planner, embedding)
    part_names = [part_table_name(t.name, part) for t in tables for part in ("hot", COLD)]
    fae_planner = EmbeddingShardingPlanner(
        topology, batch_size=32, constraints=dict.fromkeys(part_names, table_wise)
    )
    adjust = _row_wise_cold(fae, world_size) if row_wise_cold else None
    fae_dmp, fae_optimizer, fae_plan = _shard(fae, PREFIX, fae_planner, embedding, adjust)
    cold_types = {s.sharding_type for s in fae_plan.plan[PREFIX + COLD].values()}
    assert cold_types == {"row_wise" if row_wise_cold else "table_wise"}

    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    tier = PlannedColdTier(fae_dmp, partition, window=window)
    assert len(tier.groups) == len(slots) * (2 if row_wise_cold else 1)  # a group per row-wise shard
    tier.load_ebc_state_dict(initial)
    router = BatchRouter(partition, 32, world_size=world_size, rank=rank, seed=1)
    fae_router = BatchRouter(
        partition, 32, world_size=world_size, rank=rank, seed=1, split=fae_dmp, cold_tier=tier
    )
    routed = list(islice(router.epoch(0), STEPS))
    assert any(r.hot for r in routed) and not all(r.hot for r in routed)
    for step, fae_step in zip(routed, islice(fae_router.epoch(0), STEPS), strict=True):
        assert fae_step.hot == step.hot
        train_step(base_dmp, step.batch, base_optimizer)
        train_step(fae_dmp, fae_step.batch, fae_optimizer)
    tier.flush()
    counts = torch.tensor([tier.rows_in, tier.rows_out])
    dist.all_reduce(counts)
    assert counts[1] > 0, "rows were evicted and written back"
    batches = [step.batch for step in routed]
    cold = tier.gather_cold_state()
    _assert_trained_alike(base_dmp, fae_dmp, "dlrm", tables, batches, initial, initial_dense, tolerance, cold)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer_name", "world_size", "window"),
    [("sgd", 1, None), ("adagrad", 2, None), ("rowwise_adagrad", 1, 4), ("rowwise_adagrad", 2, None)],
)
def test_planned_cold_tier_trains_the_baseline_model(tmp_path, optimizer_name, world_size, window):
    """Slot tables table-wise: each on one rank."""
    run_on_ranks(_planned_training, world_size, tmp_path, optimizer_name, window)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", ["adagrad", "rowwise_adagrad"])
def test_row_wise_slot_tables_train_the_baseline_model(tmp_path, optimizer_name):
    """Slot tables row-wise over 2 ranks: each rank's slots hold their own share of the cold rows."""
    run_on_ranks(_planned_training, 2, tmp_path, optimizer_name, None, True)
