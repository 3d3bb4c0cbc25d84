"""FAE training equals training the unsplit model: same batches, same order, same parameters after.

The FAE model is split by a hot set, planned by FAEShardingPlanner and trained with hot steps that skip
the cold part; the baseline is the unsplit DLRM planned by TorchRec's EmbeddingShardingPlanner and
trained on the same batches. Both run under DistributedModelParallel (gloo, CPU), tables table-wise
with TorchRec's fused optimizers. Parameters are compared in the original table layout.
"""

import copy

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.partition import HotColdPartition
from fae_torchrec.router import BatchRouter
from fae_torchrec.state import gather_full_state_dict, load_full_state_dict
from fae_torchrec.training import train_step
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}, 1e-6),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.05}, 1e-5),
    "rowwise_adagrad": (torchrec.optim.RowWiseAdagrad, {"lr": 0.05}, 1e-5),
}
STEPS = 24
PREFIX = "model.sparse_arch.embedding_bag_collection."


def _dlrm(ebc) -> DLRMTrain:
    torch.manual_seed(0)
    return DLRMTrain(
        DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1])
    )


def _shard(model, planner, world_size, optimizer, kwargs):
    apply_optimizer_in_backward(
        optimizer, model.model.sparse_arch.embedding_bag_collection.parameters(), dict(kwargs)
    )
    full = copy.deepcopy(model.state_dict())
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    load_full_state_dict(dmp, full)
    dense = torch.optim.SGD([p for n, p in dmp.named_parameters() if "embedding_bag" not in n], lr=0.1)
    return dmp, dense


def _same_training(rank: int, world_size: int, optimizer_name: str) -> None:
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    data = SyntheticCriteo(STEPS * 48 * world_size, batch_size=1024, scale=0.0005, seed=3)
    tables = data.table_configs(8)
    stats = AccessProfiler(tables, 0.3, seed=0, holdout_size=500).profile(data)
    hot_set = stats.hot_set(48 << 10)
    table_wise = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    topology = Topology(world_size=world_size, compute_device="cpu")

    torch.manual_seed(0)  # the same initial tables on every rank
    baseline_ebc = EmbeddingBagCollection(tables)
    baseline = _dlrm(baseline_ebc)
    fae = _dlrm(FAEEmbeddingBagCollection.from_ebc(baseline_ebc, hot_set))
    fae.load_state_dict(baseline.state_dict(), strict=False)  # the same dense layers
    base_dmp, base_dense = _shard(
        baseline,
        EmbeddingShardingPlanner(topology, batch_size=32, constraints=table_wise),
        world_size,
        optimizer,
        kwargs,
    )
    fae_planner = FAEShardingPlanner(
        topology, stats, batch_size=32, constraints=table_wise, hot_budget_bytes=48 << 10
    )
    fae_dmp, fae_dense = _shard(fae, fae_planner, world_size, optimizer, kwargs)

    partition = HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES)
    router = BatchRouter(partition, 32, world_size=world_size, rank=rank, seed=1)
    routed = list(router.epoch(0))[:STEPS]
    assert len(routed) >= 20 and any(r.hot for r in routed) and not all(r.hot for r in routed)
    for step in routed:
        train_step(base_dmp, step.batch, base_dense)
        train_step(fae_dmp, step.batch, fae_dense, hot=step.hot)

    expected, actual = gather_full_state_dict(base_dmp), gather_full_state_dict(fae_dmp)
    split = fae_dmp.module.model.sparse_arch.embedding_bag_collection
    tables_after = split.ebc_state_dict(actual, prefix=PREFIX)
    for name, value in tables_after.items():
        torch.testing.assert_close(value, expected[PREFIX + name], rtol=0, atol=tolerance)
    for name, value in expected.items():
        if "embedding_bag" not in name:
            torch.testing.assert_close(actual[name], value, rtol=0, atol=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [1, 2])
def test_fae_training_ends_with_the_baseline_parameters(tmp_path, world_size, optimizer_name):
    run_on_ranks(_same_training, world_size, tmp_path, optimizer_name)
