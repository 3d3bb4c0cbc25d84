"""A DLRM whose embeddings are FAE-split, planned by FAEShardingPlanner.collective_plan on a CPU
topology and trained by DistributedModelParallel on 2 gloo ranks, cold and hot-only steps in turn."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torchrec
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import PlannerError, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM, DLRMTrain

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.data import SampleBlock, SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks


def _local_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """This rank's shards of every embedding weight of ``module``."""
    return [
        shard.tensor.detach().clone()
        for value in module.state_dict().values()
        if isinstance(value, ShardedTensor)
        for shard in value.local_shards()
    ]


def _train_hot_and_cold_steps(rank: int, world_size: int) -> None:
    data = SyntheticCriteo(16_384, batch_size=64, scale=0.0005, seed=2)
    tables = data.table_configs(8)
    stats = AccessProfiler(tables, 0.25, seed=0, holdout_size=1000).profile(data)
    topology = Topology(world_size=world_size, compute_device="cpu")
    planner = FAEShardingPlanner(topology, stats, batch_size=64, hot_budget_bytes=64 << 10)
    hot_set = planner.choose_hot_set()
    torch.manual_seed(0)
    split = FAEEmbeddingBagCollection(tables, hot_set)
    model = DLRMTrain(
        DLRM(split, dense_in_features=13, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1])
    )
    embedding = EmbeddingOptimizer(torchrec.optim.RowWiseAdagrad, {"lr": 0.05})
    embedding.apply(split)
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    prefix = "model.sparse_arch.embedding_bag_collection"
    assert {f"{prefix}.hot", f"{prefix}.cold"} <= set(plan.plan)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = unfused_optimizer(dmp, embedding, lambda params: torch.optim.SGD(params, lr=0.1))
    fae = dmp.module.model.sparse_arch.embedding_bag_collection

    everything = SampleBlock.concat(list(data.blocks()))
    hot_inputs = hot_set.is_hot_input(everything.to_batch(DEFAULT_CAT_NAMES))
    hot = SampleBlock(
        everything.dense[hot_inputs],
        everything.ids[hot_inputs],
        everything.labels[hot_inputs],
        everything.ids_per_feature,
    )
    assert len(hot) >= 4 * 32 * world_size, f"only {len(hot)} hot inputs"
    cold_batches = list(data)[rank::world_size]
    losses = []
    for step in range(4):
        dense.zero_grad()
        loss, _ = dmp(cold_batches[step])
        loss.backward()
        dense.step()
        losses.append(float(loss))
        cold_before, hot_before = _local_weights(fae.cold), _local_weights(fae.hot)
        start = (step * world_size + rank) * 32
        batch = hot.slice(start, start + 32).to_batch(DEFAULT_CAT_NAMES)
        dense.zero_grad()  # a hot step: the batch split before it, marked hot
        loss, _ = dmp(Batch(batch.dense_features, fae.split(batch.sparse_features, True), batch.labels))
        loss.backward()
        dense.step()
        losses.append(float(loss))
        assert all(torch.equal(a, b) for a, b in zip(cold_before, _local_weights(fae.cold), strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(hot_before, _local_weights(fae.hot), strict=True))
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.slow
def test_collective_plan_trains_hot_and_cold_steps_under_dmp(tmp_path):
    run_on_ranks(_train_hot_and_cold_steps, 2, tmp_path)


def _every_rank_gets_the_planner_error(rank: int, world_size: int) -> None:
    data = SyntheticCriteo(4096, batch_size=1024, scale=0.0005, seed=2)
    stats = AccessProfiler(data.table_configs(8), 0.25, seed=0, holdout_size=500).profile(data)
    topology = Topology(world_size=world_size, compute_device="cpu", ddr_cap=1024)
    planner = FAEShardingPlanner(topology, stats, batch_size=64, hot_budget_bytes=1024)
    module = planner.meta_module(planner.choose_hot_set())
    with pytest.raises(PlannerError, match="topology too small"):  # not only rank 0, which plans
        planner.collective_plan(module, get_default_sharders(), dist.GroupMember.WORLD)


def test_a_planner_error_reaches_every_rank(tmp_path):
    run_on_ranks(_every_rank_gets_the_planner_error, 2, tmp_path)


def _the_knob_forks_its_workers_beside_a_process_group(rank: int, world_size: int) -> None:
    data = SyntheticCriteo(4096, batch_size=1024, scale=0.0005, seed=2)
    stats = AccessProfiler(data.table_configs(8), 0.25, seed=0, holdout_size=500).profile(data)
    topology = Topology(world_size=world_size, compute_device="cpu")
    chosen = []
    for processes in (1, 2):  # 2: forked while this rank's gloo group and its threads are live
        planner = FAEShardingPlanner(topology, stats, batch_size=64, num_candidates=3, processes=processes)
        chosen.append(planner.choose_hot_set())
        assert len(planner.torchrec_runs) > 4
    assert all(map(np.array_equal, chosen[0].hot_ids, chosen[1].hot_ids))
    plan = planner.collective_plan(planner.meta_module(chosen[1]), get_default_sharders())  # the group works
    plans = [None] * world_size
    dist.all_gather_object(plans, str(plan))
    assert plans[0] == plans[1]


def test_the_knob_plans_in_forked_workers_on_ranks_of_a_process_group(tmp_path):
    run_on_ranks(_the_knob_forks_its_workers_beside_a_process_group, 2, tmp_path)
