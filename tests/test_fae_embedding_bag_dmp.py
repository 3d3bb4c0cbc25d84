"""The split module under DistributedModelParallel: 2 gloo ranks on CPU, the plan from
FAEShardingPlanner.collective_plan; outputs equal the unsplit EBC's on hot, cold and mixed batches, and
initial tables made in the shards are the same in every layout."""

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.modules import gather_full_state_dict, load_full_state_dict, load_initial_tables, state
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks
from tests.test_fae_embedding_bag import _batch, _ebc, _hot_set, _tables


def _sharded_forward_matches(rank: int, world_size: int, pooling: PoolingType, weighted: bool) -> None:
    tables = _tables(pooling)
    ebc = _ebc(tables, weighted)
    split = FAEEmbeddingBagCollection.from_ebc(ebc, _hot_set(tables))
    full = {name: value.clone() for name, value in split.state_dict().items()}
    stats = AccessProfiler(tables, sample_fraction=0.5, seed=0, holdout_size=100).profile(
        _batch("mixed", seed=100 + s) for s in range(20)
    )
    sharders = [EmbeddingBagCollectionSharder()]
    planner = FAEShardingPlanner(Topology(world_size=world_size, compute_device="cpu"), stats, batch_size=16)
    plan = planner.collective_plan(split, sharders, dist.GroupMember.WORLD)
    assert {"hot", "cold"} <= set(plan.plan), "each part is sharded as an EBC of its own"
    model = DistributedModelParallel(split, device=torch.device("cpu"), plan=plan, sharders=sharders)
    load_full_state_dict(model, full)
    for kind in ("hot", "cold", "mixed"):
        batch = _batch(kind, seed=rank, weighted=weighted)
        expected, actual = ebc(batch).to_dict(), model(batch).to_dict()
        for key in expected:
            torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-6)
    hot = _batch("hot", seed=10 + rank, weighted=weighted)
    actual = model(hot, hot_only=True).to_dict()
    for key, value in ebc(hot).to_dict().items():
        torch.testing.assert_close(actual[key], value, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pooling", "weighted"), [(PoolingType.SUM, False), (PoolingType.MEAN, False), (PoolingType.SUM, True)]
)
def test_sharded_forward_matches_the_original_ebc(tmp_path, pooling, weighted):
    run_on_ranks(_sharded_forward_matches, 2, tmp_path, pooling, weighted)


def _initial_tables_in_every_layout(rank: int, world_size: int) -> None:
    state.INIT_BLOCK_ROWS = 7  # several blocks per table, some across shard boundaries
    tables = _tables()
    reference = EmbeddingBagCollection(tables)
    load_initial_tables(reference, tables, seed=5)
    expected = reference.state_dict()
    unsharded = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    load_initial_tables(unsharded, tables, seed=5)
    _assert_tables(unsharded.ebc_state_dict(), expected)
    other_seed = EmbeddingBagCollection(tables)
    load_initial_tables(other_seed, tables, seed=6)
    assert not torch.equal(
        other_seed.state_dict()["embedding_bags.t_c.weight"], expected["embedding_bags.t_c.weight"]
    )

    meta, sharders = torch.device("meta"), [EmbeddingBagCollectionSharder()]
    topology = Topology(world_size=world_size, compute_device="cpu")
    # the baseline forced onto every sharding type TorchRec allows on CPU (column offsets), FAE on its
    # planner's choice
    kinds = {"t_a": "table_wise", "t_b": "column_wise", "t_c": "table_column_wise", "t_d": "data_parallel"}
    constraints = {name: ParameterConstraints(sharding_types=[kind]) for name, kind in kinds.items()}
    baseline = EmbeddingBagCollection(tables, device=meta)
    plan = EmbeddingShardingPlanner(topology, constraints=constraints).collective_plan(
        baseline, sharders, dist.GroupMember.WORLD
    )
    assert {s.sharding_type for s in plan.plan[""].values()} == set(kinds.values())
    sharded = DistributedModelParallel(baseline, device=torch.device("cpu"), plan=plan, sharders=sharders)
    load_initial_tables(sharded.module, tables, seed=5)
    _assert_tables(gather_full_state_dict(sharded), expected)

    split = FAEEmbeddingBagCollection(tables, _hot_set(tables), device=meta)
    stats = AccessProfiler(tables, sample_fraction=0.5, seed=0, holdout_size=100).profile(
        _batch("mixed", seed=100 + s) for s in range(20)
    )
    planner = FAEShardingPlanner(topology, stats, batch_size=16)
    plan = planner.collective_plan(split, sharders, dist.GroupMember.WORLD)
    sharded = DistributedModelParallel(split, device=torch.device("cpu"), plan=plan, sharders=sharders)
    load_initial_tables(sharded.module, tables, seed=5)
    _assert_tables(split.ebc_state_dict(gather_full_state_dict(sharded)), expected)


def _assert_tables(actual: dict, expected: dict) -> None:
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


@pytest.mark.slow
def test_initial_tables_are_the_same_in_every_layout(tmp_path):
    run_on_ranks(_initial_tables_in_every_layout, 2, tmp_path)


def _parts_overlap(rank: int, world_size: int) -> None:
    tables = _tables()
    split = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    sharders = [EmbeddingBagCollectionSharder()]
    # table-wise: every part's lookup ends in an output all-to-all, whose wait is recorded
    constraints = {
        f"{table.name}_{part}": ParameterConstraints(sharding_types=["table_wise"])
        for table in tables
        for part in ("hot", "cold")
    }
    planner = EmbeddingShardingPlanner(
        Topology(world_size=world_size, compute_device="cpu"), batch_size=16, constraints=constraints
    )
    plan = planner.collective_plan(split, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(split, device=torch.device("cpu"), plan=plan, sharders=sharders)
    events = []
    for part in ("hot", "cold"):
        module = getattr(model.module, part)
        forward = module.forward

        def recorded(*args, _part=part, _forward=forward, **kwargs):
            events.append(f"lookup {_part}")
            output = _forward(*args, **kwargs)
            output.callbacks.append(lambda result, _part=_part: events.append(f"wait {_part}") or result)
            return output

        module.forward = recorded
    model(_batch("mixed", seed=rank))
    assert events == ["lookup hot", "lookup cold", "wait hot", "wait cold"]


@pytest.mark.slow
def test_a_cold_step_looks_up_both_parts_before_it_waits_for_either(tmp_path):
    """The hot part's output all-to-all is in flight while the cold part looks its ids up."""
    run_on_ranks(_parts_overlap, 2, tmp_path)
