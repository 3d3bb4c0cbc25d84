"""A planned cold tier trains the baseline's model: cold rows in host memory, copied into a few device
slots ahead of each cold step by the slot plan of the epoch's schedule, and written back with their
optimizer state when evicted.

The FAE model's cold tables hold slots (``cold_slots``), fewer than their cold rows, so rows come and
go; both models train on the same batches under DMP (gloo, CPU), the slot tables table-wise or (2 ranks)
row-wise, and the parameters end equal in the original layout, with exactly the used rows moved.
"""

from dataclasses import replace
from itertools import islice

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import FAEEmbeddingBagCollection
from fae_torchrec.modules.fae_embedding_bag import part_table_name
from fae_torchrec.modules.state import gather_full_state_dict, load_initial_tables
from fae_torchrec.recipes import DLRM, recipe_config
from fae_torchrec.recipes.slots import SlotLayout, slot_sizing
from fae_torchrec.stats.hot_set import COLD
from fae_torchrec.train.checkpoint import Checkpoints
from fae_torchrec.train.cold_tier import PlannedColdTier, cold_step_pools, cold_step_rows, min_cold_slots
from fae_torchrec.train.evaluation import evaluate, evaluation_cold_slots, validation_batches
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.runner import StepRunner
from fae_torchrec.train.slot_plan import plan_slots
from fae_torchrec.train.step import train_step
from tests.distributed import run_on_ranks
from tests.test_equivalence import OPTIMIZERS, PREFIXES, STEPS, _assert_trained_alike, _model, _setup, _shard

PREFIX = PREFIXES["dlrm"]
#: Optimizer state per row of a dim-8 table: Adagrad's per element, RowWiseAdagrad's per row.
STATE_BYTES = {"sgd": 0, "adagrad": 8 * 4, "rowwise_adagrad": 4}


def _slots(hot_set, world_size: int, row_wise_cold: bool, ahead: int = 0) -> dict[str, int]:
    """Per table with cold rows: room for one step's lookups (one id per input, 32 inputs per rank) and
    one more (an odd count: uneven row-wise shards); row-wise, room for two steps' (a step's rows need
    not split evenly between the shards); copying ``ahead`` steps early, room for that many more."""
    num_hot = {t.name: len(ids) for t, ids in zip(hot_set.tables, hot_set.hot_ids, strict=True)}
    return {
        t.name: min(
            t.num_embeddings - num_hot[t.name], 32 * world_size * (1 + row_wise_cold) * (1 + ahead) + 1
        )
        for t in hot_set.tables
        if t.num_embeddings > num_hot[t.name]
    }


def _row_wise_cold(model, world_size: int, sharding: str):
    """Replaces a plan's entry of ``model``'s cold part by one that shards every slot table row-wise
    (TorchRec's blocks: the last shard smaller where the slots do not divide evenly), or with ``mixed``
    every other one (the rest table-wise, in turn on each rank: two kernels' buffers on a rank)."""

    def adjust(plan) -> None:
        cold = model.get_submodule(PREFIX + COLD)
        shardings = {
            name: row_wise(compute_kernel="fused")
            if sharding == "row_wise" or index % 2 == 0
            else table_wise(rank=index // 2 % world_size, compute_kernel="fused")
            for index, name in enumerate(cold.embedding_bags)
        }
        plan.plan[PREFIX + COLD] = construct_module_sharding_plan(
            cold, shardings, world_size=world_size, device_type="cpu"
        )

    return adjust


def _counts(tier: PlannedColdTier) -> torch.Tensor:
    """The tier's rows and bytes copied in and out, over all ranks."""
    counts = torch.tensor([tier.rows_in, tier.rows_out, tier.bytes_in, tier.bytes_out])
    dist.all_reduce(counts)
    return counts


def _planned_training(
    rank: int,
    world_size: int,
    optimizer_name: str,
    window: int | None,
    cold_sharding: str = "table_wise",
    pipeline: str | None = None,
    ahead: int = 0,
) -> None:
    """The baseline and the FAE model with a planned cold tier (copies ``ahead`` cold steps early)
    trained on the same batches: the first ``STEPS``, or with ``pipeline`` two whole epochs, the FAE
    model on that train pipeline; the slot tables ``cold_sharding`` (``table_wise``, ``row_wise`` or
    ``mixed``: ``_row_wise_cold``)."""
    row_wise_cold = cold_sharding != "table_wise"
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    embedding = EmbeddingOptimizer(optimizer, kwargs)
    data, tables, _, hot_set = _setup("dlrm", world_size)
    slots = _slots(hot_set, world_size, row_wise_cold, ahead)
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
    adjust = _row_wise_cold(fae, world_size, cold_sharding) if row_wise_cold else None
    fae_dmp, fae_optimizer, fae_plan = _shard(fae, PREFIX, fae_planner, embedding, adjust)
    cold_types = {s.sharding_type for s in fae_plan.plan[PREFIX + COLD].values()}
    assert cold_types == {"row_wise", "table_wise"} if cold_sharding == "mixed" else {cold_sharding}

    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    tier = PlannedColdTier(fae_dmp, window=window, ahead=ahead)
    row_wise_tables = {"table_wise": 0, "row_wise": len(slots), "mixed": (len(slots) + 1) // 2}[cold_sharding]
    assert len(tier.groups) == len(slots) + row_wise_tables  # a group per row-wise shard
    tier.load_ebc_state_dict(initial)
    router = BatchRouter(partition, 32, world_size=world_size, rank=rank, seed=1)
    fae_router = BatchRouter(
        partition, 32, world_size=world_size, rank=rank, seed=1, split=fae_dmp, cold_tier=tier
    )
    if pipeline is None:  # an evaluation half-way: any rows looked up, the slots' rows back after it
        validation = validation_batches(
            partition.cold.slice(0, 64 * world_size).without_part_ids(), partition.keys, 32, world_size, rank
        )
        routed = list(islice(router.epoch(0), STEPS))
        for index, (step, fae_step) in enumerate(
            zip(routed, islice(fae_router.epoch(0), STEPS), strict=True)
        ):
            assert fae_step.hot == step.hot
            train_step(base_dmp, step.batch, base_optimizer)
            train_step(fae_dmp, fae_step.batch, fae_optimizer)
            if index == STEPS // 2:
                before, here = _counts(tier), tier.rows_in
                with tier.evaluating():
                    assert evaluate(fae_dmp, validation) == pytest.approx(evaluate(base_dmp, validation))
                evaluation, evaluated_here = _counts(tier) - before, tier.rows_in - here
                assert evaluation[0] > 0, "the evaluation's rows were copied into the slots"
    else:  # the pipeline reads a batch ahead: routed steps wait in the tier for their lookup
        routed = [step for epoch in range(2) for step in router.epoch(epoch)]
        for step in routed:
            train_step(base_dmp, step.batch, base_optimizer)
        runner = StepRunner(pipeline, fae_dmp, fae_optimizer, torch.device("cpu"), fae=True)
        # the second epoch's plans made in a background thread during the first
        fae_routed = (step for epoch in range(2) for step in fae_router.epoch(epoch, plan_next=epoch == 0))
        assert [step.hot for step, *_ in runner.train(fae_routed)] == [step.hot for step in routed]
        runner.paused()
        assert tier.plan_ahead_seconds > 0
        made = tier.plans
        tier.plan_epoch(partition, [s for s in fae_router.schedule(1) if not s.hot], key=1)  # none ahead now
        assert made.keys() == tier.plans.keys() and all(
            np.array_equal(made[g].slots, tier.plans[g].slots) for g in made
        ), "the plans made ahead are those made in place"
    assert any(r.hot for r in routed) and not all(r.hot for r in routed)
    tier.flush()
    counts = _counts(tier) - (evaluation if pipeline is None else 0)  # the training's copies
    rows_in, rows_out, bytes_in, bytes_out = counts.tolist()
    assert rows_out == rows_in > 0, "every row copied in went back once (evicted, or at the flush)"
    assert bytes_in == bytes_out == rows_in * (8 * 4 + STATE_BYTES[optimizer_name])  # dim 8, float32
    if pipeline is None:  # the copies are the plan's: each group's loads made by the rank holding it
        copied = sum(not step.hot for step in routed) + ahead  # the last step copies those ahead of it
        mine = tier.plans.values()  # the plans of the groups this rank holds
        loads = sum(int(p.loads_per_step()[:copied].sum()) for p in mine)
        assert loads == tier.rows_in - evaluated_here, "this rank's copies are its own groups' plans"
        planned = torch.tensor([loads, sum(int(p.evictions_per_step()[:copied].sum()) for p in mine)])
        dist.all_reduce(planned)
        assert rows_in == planned[0] and planned[1] > 0
    batches = [step.batch for step in routed]
    cold = tier.gather_cold_state()["weight"]
    _assert_trained_alike(base_dmp, fae_dmp, "dlrm", tables, batches, initial, initial_dense, tolerance, cold)
    tier.close()  # its planning thread and process group freed: no more plans
    with pytest.raises(ValueError, match="the planned cold tier was closed"):
        tier.plan_epoch(partition, [s for s in fae_router.schedule(0) if not s.hot])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer_name", "world_size", "window", "ahead"),
    [
        ("sgd", 1, None, 0),
        ("adagrad", 2, None, 2),
        ("rowwise_adagrad", 1, 4, 1),
        ("rowwise_adagrad", 2, None, 0),
    ],
)
def test_planned_cold_tier_trains_the_baseline_model(tmp_path, optimizer_name, world_size, window, ahead):
    """Slot tables table-wise: each on one rank; copies just before a step, or ``ahead`` steps early."""
    run_on_ranks(_planned_training, world_size, tmp_path, optimizer_name, window, "table_wise", None, ahead)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer_name", "cold_sharding"),
    [("adagrad", "row_wise"), ("rowwise_adagrad", "row_wise"), ("rowwise_adagrad", "mixed")],
)
def test_row_wise_slot_tables_train_the_baseline_model(tmp_path, optimizer_name, cold_sharding):
    """Slot tables row-wise over 2 ranks: each rank's slots hold their own share of the cold rows;
    mixed with table-wise ones, a rank's slots lie in two kernels' buffers (copied a buffer at a time)."""
    run_on_ranks(_planned_training, 2, tmp_path, optimizer_name, None, cold_sharding)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_train_pipeline_with_a_planned_cold_tier_trains_the_baseline_model(tmp_path, world_size):
    """FAE's sparse pipeline over two epochs: batches routed a step ahead of their lookup, and the
    rows the first epoch leaves in the slots written back when the second one starts; at 2 ranks the
    copies run a cold step early."""
    run_on_ranks(
        _planned_training,
        world_size,
        tmp_path,
        "rowwise_adagrad",
        None,
        "row_wise" if world_size == 2 else "table_wise",
        "sparse",
        world_size - 1,
    )


def test_cold_slots_are_checked_against_the_tables():
    data, tables, _, hot_set = _setup("dlrm", 1)
    slots = _slots(hot_set, 1, False)
    with pytest.raises(ValueError, match="names tables \\['nope'\\]"):
        FAEEmbeddingBagCollection(tables, hot_set, cold_slots={**slots, "nope": 3})
    table = next(iter(slots))
    with pytest.raises(ValueError, match=f"table {table} has .* cold rows and needs at least one slot"):
        FAEEmbeddingBagCollection(tables, hot_set, cold_slots={**slots, table: 0})
    split = FAEEmbeddingBagCollection(tables, hot_set, cold_slots=slots)
    assert [c.num_embeddings for c in split.cold.embedding_bag_configs()] == list(slots.values())
    # the fewest slots of a table-wise slot table: a plan of that many fits, one fewer does not
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    steps = BatchRouter(partition, 32).schedule(0)
    fewest = min_cold_slots(partition, steps, hot_set)
    assert 1 < max(fewest.values()) <= 32 and set(fewest) == set(slots)
    table = max(fewest, key=fewest.get)
    features = {f: table for f in next(t for t in tables if t.name == table).feature_names}
    cold_steps = [step for step in steps if not step.hot]
    step, rows = cold_step_rows(partition, cold_steps, features)[table]
    bounds = np.searchsorted(step, np.arange(len(cold_steps) + 1))
    plan_slots(rows, bounds, fewest[table])
    with pytest.raises(ValueError, match=f"more than the {fewest[table] - 1} slots"):
        plan_slots(rows, bounds, fewest[table] - 1)
    with pytest.raises(ValueError, match="ebc_state_dict: the cold part holds the slots"):
        split.ebc_state_dict()


def _sharded(tables, hot_set, slots, world_size: int, sharding_type: str = "table_wise"):
    """A DLRM of ``tables`` split by ``hot_set`` with ``slots`` (unsplit: None), every table planned
    ``sharding_type``, under DMP; and its unfused optimizer."""
    sparse = (
        EmbeddingBagCollection(tables)
        if hot_set is None
        else FAEEmbeddingBagCollection(tables, hot_set, cold_slots=slots)
    )
    names = [t.name for t in tables] + [part_table_name(t.name, p) for t in tables for p in ("hot", COLD)]
    constraints = dict.fromkeys(names, ParameterConstraints(sharding_types=[sharding_type]))
    planner = EmbeddingShardingPlanner(
        Topology(world_size=world_size, compute_device="cpu"), batch_size=32, constraints=constraints
    )
    embedding = EmbeddingOptimizer(*OPTIMIZERS["adagrad"][:2])
    return _shard(_model("dlrm", sparse), PREFIX, planner, embedding)[:2]


def _initial_tables(rank: int, world_size: int) -> None:
    _, tables, _, hot_set = _setup("dlrm", world_size)
    baseline, _ = _sharded(tables, None, None, world_size)
    load_initial_tables(baseline.module.get_submodule(PREFIX.rstrip(".")), tables, seed=7)
    model, _ = _sharded(tables, hot_set, _slots(hot_set, world_size, False), world_size)
    split = model.module.get_submodule(PREFIX.rstrip("."))
    load_initial_tables(split, tables, seed=7)
    tier = PlannedColdTier(model)
    tier.load_initial_tables(tables, seed=7)
    expected = gather_full_state_dict(baseline)
    actual = gather_full_state_dict(model) | {
        PREFIX + k: v for k, v in tier.gather_cold_state()["weight"].items()
    }
    for name, value in split.ebc_state_dict(actual, PREFIX).items():
        assert torch.equal(value, expected[PREFIX + name]), name


@pytest.mark.slow
def test_the_cold_rows_start_as_the_baselines_initial_tables(tmp_path):
    """``load_initial_tables`` sets the hot part, the tier the cold rows: the baseline's tables."""
    run_on_ranks(_initial_tables, 2, tmp_path)


def _misuses(rank: int, world_size: int, directory: str) -> None:
    """Each misuse of a planned cold tier is refused with a message that names it."""
    data, tables, stats, hot_set = _setup("dlrm", world_size)
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)

    def sharded(slots, sharding_type="table_wise"):
        return _sharded(tables, hot_set, slots, world_size, sharding_type)

    slots = _slots(hot_set, world_size, False)
    model, optimizer = sharded(slots, "data_parallel")
    with pytest.raises(ValueError, match=r"slot table must be sharded .* not data_parallel on dense"):
        PlannedColdTier(model)
    model, optimizer = sharded(slots)
    tier = PlannedColdTier(model)
    with pytest.raises(ValueError, match="give the router split= too"):
        BatchRouter(partition, 32, world_size, rank, cold_tier=tier)
    other = HotColdPartition.of(data.blocks(), stats.hot_set(24 << 10), data.feature_names)
    with pytest.raises(ValueError, match="the partition was made with another hot set"):
        tier.plan_epoch(other, [])
    router = BatchRouter(partition, 32, world_size, rank, split=model, cold_tier=tier)
    with pytest.raises(ValueError, match=r"resuming at cold step \d+ of the epoch: load the tier's state"):
        next(router.epoch(0, start_step=3))
    plain = next(step for step in BatchRouter(partition, 32, world_size, rank).epoch(0) if not step.hot)
    with pytest.raises(RuntimeError, match="a batch the tier did not route"):
        train_step(model, plain.batch, optimizer)
    steps = router.epoch(0)
    cold = next(step for step in steps if not step.hot)
    with pytest.raises(ValueError, match="routed cold steps have not run yet"):
        tier.flush()
    with pytest.raises(ValueError, match="routed cold steps have not run yet: save after them"):
        tier.state_dict()
    train_step(model, cold.batch, optimizer)
    tier.flush()
    saved = tier.state_dict()
    with pytest.raises(ValueError, match="give its PlannedColdTier"):
        Checkpoints(directory, {}).save(0, model, optimizer, {})
    few = {table: 2 for table in slots}
    model, optimizer = sharded(few)
    tier = PlannedColdTier(model)
    with pytest.raises(
        ValueError, match=r"cold table \w+, slots 0:2: step \d+ looks up \d+ distinct rows, more"
    ):
        next(BatchRouter(partition, 32, world_size, rank, split=model, cold_tier=tier).epoch(0))
    with pytest.raises(ValueError, match="the cold tier's state holds slot groups"):
        tier.load_state_dict(saved)


def test_misuses_of_a_planned_cold_tier_are_refused(tmp_path):
    run_on_ranks(_misuses, 1, tmp_path, str(tmp_path / "checkpoints"))


def _too_few_slots(rank: int, world_size: int) -> None:
    data, tables, _, hot_set = _setup("dlrm", world_size)
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    slots = _slots(hot_set, world_size, False)
    table = next(iter(slots))
    model, _ = _sharded(tables, hot_set, {**slots, table: 2}, world_size)
    tier = PlannedColdTier(model)  # the table's slots on one rank (table-wise)
    with pytest.raises(ValueError, match=rf"cold table {table}, slots 0:2: step \d+ looks up \d+ distinct"):
        next(BatchRouter(partition, 32, world_size, rank, split=model, cold_tier=tier).epoch(0))


@pytest.mark.slow
def test_a_plan_that_fails_on_one_rank_fails_on_every_rank(tmp_path):
    """Each rank plans the slot groups it holds: a table-wise table with too few slots is refused on
    the rank holding it and on the other one too (none goes on to wait for it)."""
    run_on_ranks(_too_few_slots, 2, tmp_path)


def test_the_recipe_sizes_slots_from_a_step_and_grows_them_within_a_budget():
    """``slot_sizing``: without a budget (CPU) each cold table gets the rows of its busiest training or
    evaluation step; within a budget (CUDA's ``cold_slot_budget``) the slots grow, never past it, and
    copy less; the copies are the first epoch's plans' per cold step; a resumed run's are kept."""
    data, _, _, hot_set = _setup("dlrm", 1)
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    args = recipe_config(
        DLRM,
        batch_size=32,
        order="stream",
        seed=0,
        epochs=2,
        optimizer="sgd",
        cold_tier="planned",
        copy_ahead=0,
    )
    validation = partition.cold.slice(0, 64).without_part_ids()
    floored = slot_sizing(args, [partition], validation, hot_set, 1, 0.0)(None)
    floor = floored.slots
    steps = [BatchRouter(partition, 32, seed=0).schedule(e) for e in range(2)]
    trained = [min_cold_slots(partition, s, hot_set) for s in steps]
    evaluated = evaluation_cold_slots(validation, partition.keys, hot_set, 32, 1)
    assert floor == {t: max(evaluated[t], *(f[t] for f in trained)) for t in evaluated}
    row_bytes = dict(zip(hot_set.layout.names, hot_set.layout.row_bytes(), strict=True))
    budget = 2.0 * sum(floor[t] * row_bytes[t] for t in floor)
    first_epoch = cold_step_pools(partition, steps[0], hot_set)
    cold_steps = sum(not step.hot for step in steps[0])
    for table, (ids, bounds) in first_epoch.items():
        plan = plan_slots(ids, bounds, floor[table])
        copied = (plan.rows_in + plan.rows_out) * row_bytes[table] / cold_steps
        assert floored.copied_bytes[table] == pytest.approx(copied), table
    grown_layout = slot_sizing(args, [partition], validation, hot_set, 1, 0.0)(budget)
    grown = grown_layout.slots
    assert all(grown[t] >= floor[t] for t in floor) and grown != floor
    assert sum(grown[t] * row_bytes[t] for t in grown) <= budget
    assert sum(grown_layout.copied_bytes.values()) < sum(floored.copied_bytes.values())
    saved = SlotLayout({"t": 3}, {"t": 1.0})
    assert slot_sizing(args, [partition], validation, hot_set, 1, 0.0, saved=saved)(budget) == saved
    args = replace(args, copy_ahead=1)  # the rows of two cold steps in a row
    ahead = slot_sizing(args, [partition], validation, hot_set, 1, 0.0)(None).slots
    pairs = [min_cold_slots(partition, s, hot_set, ahead=1) for s in steps]
    assert ahead == {t: max(evaluated[t], *(f[t] for f in pairs)) for t in evaluated}
    assert all(ahead[t] >= floor[t] for t in floor) and ahead != floor
