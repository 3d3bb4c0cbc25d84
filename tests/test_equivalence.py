"""FAE training equals training the unsplit model: same batches, same order, same parameters after.

The FAE model is split by a hot set, planned by FAEShardingPlanner and trained with hot steps that skip
the cold part; the baseline is the unsplit model (DLRM on Criteo-like data, or TBSM on Taobao-like
histories, whose tables each read one feature per step) planned by TorchRec's EmbeddingShardingPlanner
and trained on the same batches. Both run under DistributedModelParallel (gloo, CPU), with tables forced
table-wise (fused optimizers only) or with the planners' unconstrained choice, where small tables and
hot parts become data-parallel and train by the dense form of the embedding optimizer. Parameters are
compared in the original table layout, and every row that a batch used must have moved. The same
holds when the router splits each batch for the parts before the step (``SplitFeatures``).
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

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.data import SyntheticCriteo, SyntheticTaobao
from fae_torchrec.models import TBSM
from fae_torchrec.modules import SplitFeatures
from fae_torchrec.modules.state import gather_full_state_dict, load_full_state_dict
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.step import train_step
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks

#: TBSM's test data: users (per rank) and table scale, for about half of the steps hot.
TBSM_USERS, TBSM_SCALE = 400, 0.0005
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}, 1e-6),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.05}, 1e-5),
    "rowwise_adagrad": (torchrec.optim.RowWiseAdagrad, {"lr": 0.05}, 1e-5),
}
STEPS = 24
#: Where each model keeps its embedding tables.
PREFIXES = {"dlrm": "model.sparse_arch.embedding_bag_collection.", "tbsm": "model.embedding_bag_collection."}


def _model(name: str, ebc) -> DLRMTrain:
    torch.manual_seed(0)
    if name == "tbsm":
        return DLRMTrain(TBSM(ebc, ts_length=4, dense_arch_layer_sizes=[8], top_arch_layer_sizes=[6],
                              tsl_layer_sizes=[4], final_arch_layer_sizes=[8, 1]))  # fmt: skip
    return DLRMTrain(
        DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1])
    )


def _shard(model, prefix: str, planner, embedding: EmbeddingOptimizer, adjust=None):
    """``model`` under DMP as ``planner`` plans it (changed by ``adjust``, given the plan), its unfused
    optimizer and its plan."""
    embedding.apply(model.get_submodule(prefix.rstrip(".")))
    full = copy.deepcopy(model.state_dict())
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    if adjust is not None:
        adjust(plan)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    load_full_state_dict(dmp, full)
    optimizer = unfused_optimizer(dmp, embedding, lambda params: torch.optim.SGD(params, lr=0.1))
    return dmp, optimizer, plan


def _sharding_types(plan) -> set[str]:
    return {s.sharding_type for module in plan.plan.values() for s in module.values()}


def _used_rows(batches, tables) -> dict[str, torch.Tensor]:
    """Per table, which rows the batches looked up (on any rank: the gradients are all-reduced)."""
    used = {t.name: torch.zeros(t.num_embeddings, dtype=torch.bool) for t in tables}
    for batch in batches:
        features = batch.sparse_features.to_dict()
        for table in tables:
            for feature in table.feature_names:
                ids = features[feature].values()
                gathered = [torch.empty(0, dtype=ids.dtype)] * dist.get_world_size()
                dist.all_gather_object(gathered, ids)
                used[table.name][torch.cat(gathered)] = True
    return used


def _setup(model: str, world_size: int):
    """The synthetic data of a test of ``STEPS`` steps (32 inputs per rank), its tables (dim 8), a
    profile and a hot set of 48 KiB."""
    if model == "tbsm":
        data = SyntheticTaobao(
            TBSM_USERS * world_size, batch_size=1024, scale=TBSM_SCALE, seed=3, ts_length=4
        )
    else:
        data = SyntheticCriteo(STEPS * 48 * world_size, batch_size=1024, scale=0.0005, seed=3)
    tables = data.table_configs(8)
    stats = AccessProfiler(tables, 0.3, seed=0, holdout_size=500).profile(data)
    return data, tables, stats, stats.hot_set(48 << 10)


def _baseline_and_fae(
    model: str, world_size: int, embedding: EmbeddingOptimizer, constrained: bool, setup, cold_slots=None
):
    """The baseline and the FAE model of ``setup`` (``_setup``'s data, tables, stats and hot set) sharded
    under DMP from the same initial state, their unfused optimizers, and that state: (baseline DMP,
    its optimizer, FAE DMP, its optimizer, initial tables, initial model state). With ``cold_slots`` the
    FAE model's cold part holds slots (its cold rows are for a planned cold tier to set)."""
    prefix = PREFIXES[model]
    _, tables, stats, hot_set = setup
    table_wise = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    constraints = table_wise if constrained else None
    topology = Topology(world_size=world_size, compute_device="cpu")

    torch.manual_seed(0)  # the same initial tables on every rank
    baseline_ebc = EmbeddingBagCollection(tables)
    initial = {name: value.clone() for name, value in baseline_ebc.state_dict().items()}
    baseline = _model(model, baseline_ebc)
    initial_dense = {name: value.clone() for name, value in baseline.state_dict().items()}
    if cold_slots is None:
        split = FAEEmbeddingBagCollection.from_ebc(baseline_ebc, hot_set)
    else:
        split = FAEEmbeddingBagCollection(tables, hot_set, cold_slots=cold_slots)
        hot_rows = {k: v for k, v in split.split_state(initial).items() if not k.startswith("cold.")}
        split.load_state_dict(hot_rows, strict=False)
    fae = _model(model, split)
    fae.load_state_dict(baseline.state_dict(), strict=False)  # the same dense layers
    base_dmp, base_optimizer, base_plan = _shard(
        baseline,
        prefix,
        EmbeddingShardingPlanner(topology, batch_size=32, constraints=constraints),
        embedding,
    )
    fae_planner = FAEShardingPlanner(
        topology, stats, batch_size=32, constraints=constraints, hot_budget_bytes=48 << 10
    )
    fae_dmp, fae_optimizer, fae_plan = _shard(fae, prefix, fae_planner, embedding)
    for plan in (base_plan, fae_plan):  # unconstrained: TorchRec makes small tables data-parallel
        types = _sharding_types(plan)
        assert types == {"table_wise"} if constrained else "data_parallel" in types, types
    hot_types = {s.sharding_type for s in fae_plan.plan[prefix + "hot"].values()}
    assert constrained or "data_parallel" in hot_types, "an FAE hot part is data-parallel"
    return base_dmp, base_optimizer, fae_dmp, fae_optimizer, initial, initial_dense


def _assert_trained_alike(
    base_dmp, fae_dmp, model: str, tables, batches, initial, initial_dense, tolerance: float, cold=None
) -> None:
    """The FAE model's parameters (in the original table layout) are the baseline's within
    ``tolerance``, and exactly the rows that ``batches`` used have moved, every dense layer too.
    ``cold``: the cold part's weights, keyed as in the split module, where they are not the model's
    (a planned cold tier's)."""
    prefix = PREFIXES[model]
    expected, actual = gather_full_state_dict(base_dmp), gather_full_state_dict(fae_dmp)
    actual |= {prefix + name: value for name, value in (cold or {}).items()}
    split = fae_dmp.module.get_submodule(prefix.rstrip("."))
    tables_after = split.ebc_state_dict(actual, prefix=prefix)
    used = _used_rows(batches, tables)
    for name, value in tables_after.items():
        torch.testing.assert_close(value, expected[prefix + name], rtol=0, atol=tolerance)
        # every table trains, whatever its sharding: exactly the rows the batches used have moved
        moved = (expected[prefix + name] != initial[name]).any(dim=1)
        table = name.removeprefix("embedding_bags.").removesuffix(".weight")
        assert torch.equal(moved, used[table]), f"{table}: rows moved {moved.sum()} != used"
    for name, value in expected.items():
        if "embedding_bag" not in name:
            torch.testing.assert_close(actual[name], value, rtol=0, atol=tolerance)
            assert not torch.equal(value, initial_dense[name]), name


def _same_training(
    rank: int, world_size: int, optimizer_name: str, constrained: bool, split_before: bool = False,
    model: str = "dlrm", balance: float = 0.0,
) -> None:  # fmt: skip
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    embedding = EmbeddingOptimizer(optimizer, kwargs)
    setup = _setup(model, world_size)
    data, tables, _, hot_set = setup
    base_dmp, base_optimizer, fae_dmp, fae_optimizer, initial, initial_dense = _baseline_and_fae(
        model, world_size, embedding, constrained, setup
    )
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names, balance=balance)
    if balance:  # label balance: some entirely-hot inputs train in cold steps
        assert hot_set.is_hot_input(partition.cold.feature_ids(data.feature_names)).any()
    router = BatchRouter(partition, 32, world_size=world_size, rank=rank, seed=1)
    routed = list(router.epoch(0))[:STEPS]
    assert len(routed) >= 20 and any(r.hot for r in routed) and not all(r.hot for r in routed)
    fae_routed = routed
    if split_before:  # the router splits each batch for the parts: the model does no remapping
        router.split = fae_dmp.module.get_submodule(PREFIXES[model].rstrip(".")).split
        fae_routed = list(router.epoch(0))[:STEPS]
        assert all(isinstance(r.batch.sparse_features, SplitFeatures) for r in fae_routed)
        assert [r.batch.sparse_features.is_hot for r in fae_routed] == [r.hot for r in routed]
    for step, fae_step in zip(routed, fae_routed, strict=True):
        train_step(base_dmp, step.batch, base_optimizer)
        train_step(fae_dmp, fae_step.batch, fae_optimizer)
    batches = [step.batch for step in routed]
    _assert_trained_alike(base_dmp, fae_dmp, model, tables, batches, initial, initial_dense, tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("plan", ["table_wise", "unconstrained"])
def test_fae_training_ends_with_the_baseline_parameters(tmp_path, world_size, optimizer_name, plan):
    run_on_ranks(_same_training, world_size, tmp_path, optimizer_name, plan == "table_wise")


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_batches_split_before_the_step_train_the_same_model(tmp_path, world_size):
    """Split by the router rather than in the step; one optimizer (the split is the same for all)."""
    run_on_ranks(_same_training, world_size, tmp_path, "rowwise_adagrad", False, True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer_name", "world_size", "plan"),
    [("sgd", 1, "unconstrained"), ("sgd", 2, "table_wise"), ("rowwise_adagrad", 1, "table_wise"),
     ("rowwise_adagrad", 2, "unconstrained")],
)  # fmt: skip
def test_fae_tbsm_ends_with_the_baseline_parameters(tmp_path, world_size, optimizer_name, plan):
    """TBSM (5 steps of three ids here, 21 in the reference) over tables that each read one feature per
    step: an input is hot only when every id of every step is. Each optimizer on 1 and 2 ranks, each
    rank count with a forced and an unconstrained plan; the partition label-balanced as TBSM's example
    makes it (``--balance 0.5``)."""
    run_on_ranks(
        _same_training, world_size, tmp_path, optimizer_name, plan == "table_wise", False, "tbsm", 0.5
    )
