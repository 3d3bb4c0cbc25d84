"""A re-plan in the middle of training: rows move between the parts with their optimizer state, the rest of
the epoch is partitioned again against the new hot set, and the model ends as the baseline trained on the
same batches (``fae_torchrec.train.resplit``, ``trained_inputs``, ``HotColdPartition.inputs``)."""

import shutil

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection, HotSet
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.modules.state import gather_full_state_dict
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train import resplit
from fae_torchrec.train.cold_tier import PlannedColdTier
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.resplit import load_unsplit_state, release_tables, spill_unsplit_state
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.row_moves import kept_in_place, move_rows, moves_rows_in_place
from fae_torchrec.train.schedule import make_schedule, trained_inputs
from fae_torchrec.train.step import find_fae_module, train_step
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks
from tests.test_cold_tier import _slots
from tests.test_equivalence import (
    OPTIMIZERS,
    STEPS,
    _assert_trained_alike,
    _baseline_and_fae,
    _model,
    _setup,
)

#: Steps trained before the re-plan.
REPLAN_AT = 9


def _new_hot_set(data, tables):
    """A hot set profiled on another sample of the data: rows move both ways."""
    stats = AccessProfiler(tables, 0.2, seed=7, holdout_size=500).profile(data)
    return stats, stats.hot_set(48 << 10)


def _planned(model, stats, world_size: int, embedding: EmbeddingOptimizer, constrained: bool):
    """The plan FAE's planner makes for ``model`` (unsharded, FAE's, on the meta device)."""
    embedding.apply(find_fae_module(model))
    constraints = (
        {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in stats.tables}
        if constrained
        else None
    )
    topology = Topology(world_size=world_size, compute_device="cpu")
    planner = FAEShardingPlanner(
        topology, stats, batch_size=32, constraints=constraints, hot_budget_bytes=48 << 10
    )
    return planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)


def _replanned(model, stats, world_size: int, embedding: EmbeddingOptimizer, constrained: bool):
    """``model`` (unsharded, FAE's, on the meta device) planned by FAE's planner and sharded, with its
    unfused optimizer: how a re-plan through the files builds the model of the new hot set."""
    plan = _planned(model, stats, world_size, embedding, constrained)
    sharders = get_default_sharders()
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    return dmp, _unfused(dmp, embedding)


def _unfused(dmp, embedding: EmbeddingOptimizer):
    return unfused_optimizer(dmp, embedding, lambda params: torch.optim.SGD(params, lr=0.1))


def _training_with_a_replan(
    rank: int,
    world_size: int,
    folder,
    optimizer_name: str,
    constrained: bool,
    tiered: bool = False,
    in_place: bool = False,
) -> None:
    """The baseline and FAE trained on the same batches, FAE re-planned after ``REPLAN_AT`` steps; with
    ``tiered`` its cold rows in a planned cold tier before and after the re-plan; ``in_place``: only the
    rows that change part moved (``move_rows``), else through the files."""
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    embedding = EmbeddingOptimizer(optimizer, kwargs)
    setup = _setup("dlrm", world_size)
    data, tables, _, hot_set = setup
    keys = data.feature_names
    new_stats, new_hot_set = _new_hot_set(data, tables)
    if in_place:  # as the recipe does: a table entirely hot stays so
        new_hot_set = kept_in_place(
            FAEEmbeddingBagCollection(tables, hot_set, device=torch.device("meta")), new_hot_set
        )
    # a planned cold tier's slots before and after: room for a step's rows
    slots = {
        name: _slots(h, world_size, False) if tiered else None
        for name, h in (("old", hot_set), ("new", new_hot_set))
    }
    base_dmp, base_optimizer, fae_dmp, fae_optimizer, initial, initial_dense = _baseline_and_fae(
        "dlrm", world_size, embedding, constrained, setup, slots["old"]
    )
    tier = PlannedColdTier(fae_dmp) if tiered else None
    if tier is not None:
        tier.load_ebc_state_dict(initial)
    old_hot = [set(ids.tolist()) for ids in hot_set.hot_ids]
    new_hot = [set(ids.tolist()) for ids in new_hot_set.hot_ids]
    assert any(o - n for o, n in zip(old_hot, new_hot, strict=True)), "no row cools"
    assert any(n - o for o, n in zip(old_hot, new_hot, strict=True)), "no row becomes hot"

    partition = HotColdPartition.of(data.blocks(), hot_set, keys)
    steps = make_schedule(partition.is_hot, 32, world_size, seed=1)
    remainder = HotColdPartition.of(
        partition.inputs(~trained_inputs(partition.is_hot, steps[:REPLAN_AT]), block_size=100),
        new_hot_set,
        keys,
    )
    phases = []
    for part, steps in ((partition, REPLAN_AT), (remainder, STEPS - REPLAN_AT)):
        routed = list(BatchRouter(part, 32, world_size=world_size, rank=rank, seed=1).epoch(0))[:steps]
        assert any(r.hot for r in routed) and not all(r.hot for r in routed), "hot and cold steps"
        phases.append([r.batch for r in routed])

    split = BatchRouter(partition, 32, world_size, rank, seed=1, split=fae_dmp, cold_tier=tier)
    for batch, routed in zip(phases[0], split.epoch(0), strict=False):
        train_step(base_dmp, batch, base_optimizer)
        train_step(fae_dmp, routed.batch, fae_optimizer)

    torch.manual_seed(0)
    if in_place:
        new_dmp, new_optimizer = _moved_in_place(
            fae_dmp, fae_optimizer, embedding, new_stats, new_hot_set, constrained
        )
    else:
        new_dmp, new_optimizer, tier = _moved_through_files(
            fae_dmp,
            fae_optimizer,
            embedding,
            (new_stats, new_hot_set),
            folder,
            tier,
            slots["new"],
            constrained,
        )
    del fae_dmp, fae_optimizer

    split = BatchRouter(remainder, 32, world_size, rank, seed=1, split=new_dmp, cold_tier=tier)
    for batch, routed in zip(phases[1], split.epoch(0), strict=False):
        train_step(base_dmp, batch, base_optimizer)
        train_step(new_dmp, routed.batch, new_optimizer)
    batches = phases[0] + phases[1]
    cold = None
    if tier is not None:
        tier.flush()
        cold = tier.gather_cold_state()["weight"]
        assert tier.rows_in > 0
    _assert_trained_alike(base_dmp, new_dmp, "dlrm", tables, batches, initial, initial_dense, tolerance, cold)


def _moved_through_files(fae_dmp, fae_optimizer, embedding, new, folder, tier, slots, constrained):
    """``fae_dmp`` moved to the hot set of ``new`` (statistics, hot set) through the files in ``folder``:
    the new model, its unfused optimizer and its planned cold tier (``slots``: its slots, None: none)."""
    new_stats, new_hot_set = new
    world_size = dist.get_world_size()
    state = spill_unsplit_state(fae_dmp, fae_optimizer, embedding, folder, tier)
    assert state.file_bytes() > 0 and state.nbytes() < state.file_bytes()
    release_tables(fae_dmp, fae_optimizer, embedding, tier)
    kept = () if tier is None else tuple(tier.keys)  # the slot tables: not the cold rows
    assert all(s.tensor.untyped_storage().size() == 0 for _, s in _shards(fae_dmp, kept)), "tables not freed"
    tables = find_fae_module(fae_dmp).embedding_bag_configs()
    meta = FAEEmbeddingBagCollection(tables, new_hot_set, device=torch.device("meta"), cold_slots=slots)
    new_dmp, new_optimizer = _replanned(_model("dlrm", meta), new_stats, world_size, embedding, constrained)
    tier = None if slots is None else PlannedColdTier(new_dmp)
    load_unsplit_state(new_dmp, new_optimizer, embedding, state, tier)
    state.remove()
    assert not folder.exists()
    return new_dmp, new_optimizer, tier


def _moved_in_place(fae_dmp, fae_optimizer, embedding, new_stats, new_hot_set, constrained):
    """``fae_dmp`` moved to ``new_hot_set`` by ``move_rows``: the cold part's tables stay as they are,
    only the hot part is made anew."""
    old = find_fae_module(fae_dmp)
    cold = {key: value for key, value in fae_dmp.state_dict().items() if ".cold." in key}
    assert moves_rows_in_place(fae_dmp, new_hot_set, False)
    meta = FAEEmbeddingBagCollection(
        old.embedding_bag_configs(), new_hot_set, device=torch.device("meta"), cold_tables=old.cold_rows
    )
    plan = _planned(_model("dlrm", meta), new_stats, dist.get_world_size(), embedding, constrained)
    new_dmp, new_optimizer, moves = move_rows(
        fae_dmp, fae_optimizer, embedding, new_hot_set, plan, get_default_sharders(),
        lambda dmp: _unfused(dmp, embedding),
    )  # fmt: skip
    assert moves.leaving > 0 and moves.entering > 0
    fae = find_fae_module(new_dmp)
    assert fae is not old and fae.cold is old.cold, "the cold part kept as it is"
    after = {key: value for key, value in new_dmp.state_dict().items() if ".cold." in key}
    assert after.keys() == cold.keys() and all(
        after[k] is cold[k] or _same_shards(after[k], cold[k]) for k in cold
    )
    return new_dmp, new_optimizer


def _same_shards(a, b) -> bool:
    """Whether two per-row tensors of a state dict are the same memory (shard by shard)."""
    if isinstance(a, ShardedTensor):
        return all(
            x.tensor.data_ptr() == y.tensor.data_ptr()
            for x, y in zip(a.local_shards(), b.local_shards(), strict=True)
        )
    return a.data_ptr() == b.data_ptr()


def test_only_a_cold_part_that_keeps_every_table_with_cold_rows_moves_rows_in_place(small_tables):
    """A row of a table entirely hot before (no table in the cold part) would turn cold: refused before
    anything moves, unless the table stays entirely hot (``kept_in_place``, as the recipe re-plans) or the
    cold part keeps it (``cold_tables``); a planned cold tier moves through files."""
    old = HotSet(tuple(small_tables), (np.array([2, 5]), np.arange(20), np.empty(0, np.int64)))
    new = HotSet(tuple(small_tables), (np.array([5, 7]), np.arange(1, 20), np.array([3])))
    meta = torch.device("meta")
    lacking = FAEEmbeddingBagCollection(small_tables, old, device=meta)
    assert lacking.cold_rows == {"t_a": 10, "t_c": 30}, "t_b is entirely hot"
    assert not moves_rows_in_place(lacking, new, False)
    with pytest.raises(ValueError, match="the cold part lacks a table with cold rows"):
        move_rows(lacking, None, None, new, None, [], None)
    kept = kept_in_place(lacking, new)
    assert [ids.tolist() for ids in kept.hot_ids] == [[5, 7], list(range(20)), [3]]
    assert moves_rows_in_place(lacking, kept, False) and not moves_rows_in_place(lacking, kept, True)
    keeping = FAEEmbeddingBagCollection(small_tables, old, device=meta, cold_tables=["t_a", "t_b", "t_c"])
    assert keeping.cold_rows == {"t_a": 10, "t_b": 20, "t_c": 30} and moves_rows_in_place(keeping, new, False)
    with pytest.raises(ValueError, match=r"cold_tables: tables \['t_a'\] have cold rows"):
        FAEEmbeddingBagCollection(small_tables, old, device=meta, cold_tables=["t_c"])
    with pytest.raises(ValueError, match=r"cold_tables: no tables \['t_x'\]"):
        FAEEmbeddingBagCollection(small_tables, old, device=meta, cold_tables=["t_a", "t_c", "t_x"])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_replan_that_moves_only_the_rows_changing_part_ends_with_the_baseline_parameters(
    tmp_path, world_size, optimizer_name
):
    """``move_rows``: TorchRec's unconstrained plans (hot parts data-parallel, cold parts sharded)."""
    run_on_ranks(
        _training_with_a_replan, world_size, tmp_path, tmp_path / "rows", optimizer_name, False, False, True
    )


@pytest.mark.slow
def test_a_replan_that_moves_only_the_rows_changing_part_between_table_wise_plans_is_exact(tmp_path):
    run_on_ranks(_training_with_a_replan, 2, tmp_path, tmp_path / "rows", "adagrad", True, False, True)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [1, 2])
def test_training_with_a_replan_ends_with_the_baseline_parameters(tmp_path, world_size, optimizer_name):
    """TorchRec's unconstrained plans: hot parts data-parallel, so rows move between FBGEMM's fused
    optimizer state and the dense form's."""
    run_on_ranks(_training_with_a_replan, world_size, tmp_path, tmp_path / "rows", optimizer_name, False)


@pytest.mark.slow
def test_a_replan_between_table_wise_plans_is_exact(tmp_path):
    run_on_ranks(_training_with_a_replan, 2, tmp_path, tmp_path / "rows", "adagrad", True)


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer_name", "world_size"), [("rowwise_adagrad", 1), ("adagrad", 2)])
def test_a_replan_with_a_planned_cold_tier_is_exact(tmp_path, optimizer_name, world_size):
    """The cold rows and their optimizer state move from the old tier's host rows, through the unsplit
    layout, into the new model's hot part and the new tier's host rows; TorchRec's unconstrained plans
    (slot tables on the fused kernel, table-wise, whatever the rest)."""
    run_on_ranks(
        _training_with_a_replan, world_size, tmp_path, tmp_path / "rows", optimizer_name, False, True
    )


def _shards(model, left_out=()):
    """The local shards of the FAE module's sharded tables in ``model`` but those ``left_out`` (their
    names end so), by name."""
    return [
        (name, shard)
        for name, value in model.state_dict().items()
        if ".embedding_bags." in name
        and isinstance(value, ShardedTensor)
        and not any(name.endswith(key) for key in left_out)
        for shard in value.local_shards()
    ]


def _round_trip(rank: int, world_size: int, folder) -> None:
    """Spilling the state and loading it into the same model changes nothing but the idle copies of hot
    rows in the cold part (which take the hot rows' values): spilled again, the files are the same; the
    files hold every row in the unsplit layout, with its optimizer state."""
    embedding = EmbeddingOptimizer(*OPTIMIZERS["rowwise_adagrad"][:2])
    setup = _setup("dlrm", world_size)
    data, tables, _, hot_set = setup
    _, _, fae_dmp, fae_optimizer, _, _ = _baseline_and_fae("dlrm", world_size, embedding, False, setup)
    partition = HotColdPartition.of(data.blocks(), hot_set, data.feature_names)
    for routed in list(BatchRouter(partition, 32, world_size=world_size, rank=rank).epoch(0))[:4]:
        train_step(fae_dmp, routed.batch, fae_optimizer)
    weights = gather_full_state_dict(fae_dmp)
    fused = _local_fused_state(fae_dmp)
    assert fused, "no fused optimizer state on this rank"
    fae = find_fae_module(fae_dmp)
    state = spill_unsplit_state(fae_dmp, fae_optimizer, embedding, folder)
    assert sorted(state.files) == ["momentum1", "weight"]
    unsplit = fae.ebc_state_dict(weights, f"{state.path}.")
    for config in tables:
        saved = state.read("weight", config.name)
        assert torch.equal(saved, unsplit[f"embedding_bags.{config.name}.weight"]), config.name
        assert state.read("momentum1", config.name).shape == (config.num_embeddings,)
    assert any(bool(state.read("momentum1", c.name).any()) for c in tables), "no optimizer state written"
    load_unsplit_state(fae_dmp, fae_optimizer, embedding, state)
    loaded = gather_full_state_dict(fae_dmp)
    for name, value in loaded.items():
        if not name.startswith(f"{state.path}."):
            assert torch.equal(value, weights[name]), name
    for name, value in fae.ebc_state_dict(loaded, f"{state.path}.").items():
        assert torch.equal(value, unsplit[name]), name
    assert _local_fused_state(fae_dmp).keys() == fused.keys()
    again = spill_unsplit_state(fae_dmp, fae_optimizer, embedding, folder.parent / "again")
    for name, table in ((name, config.name) for name in state.files for config in tables):
        assert torch.equal(again.read(name, table), state.read(name, table)), (name, table)
    assert state.step is not None and float(state.step) == 4 and float(again.step) == 4
    state.remove()
    again.remove()


def _local_fused_state(model):
    """This rank's shards of the fused optimizer's state (copies), by (parameter, key)."""
    return {
        (parameter, key): [shard.tensor.clone() for shard in value.local_shards()]
        for parameter, entries in model.fused_optimizer.state_dict()["state"].items()
        for key, value in entries.items()
    }


def test_spilling_and_loading_the_state_is_the_identity(tmp_path):
    run_on_ranks(_round_trip, 2, tmp_path, tmp_path / "rows")


def _too_little_disk(rank: int, world_size: int, folder) -> None:
    """A disk with less room than the tables with their state: refused on every rank before any row is
    written (the files are written through mappings, where a full disk would end the process)."""
    embedding = EmbeddingOptimizer(*OPTIMIZERS["adagrad"][:2])
    setup = _setup("dlrm", world_size)
    _, _, fae_dmp, fae_optimizer, _, _ = _baseline_and_fae("dlrm", world_size, embedding, False, setup)
    resplit.shutil.disk_usage = lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1000)
    refused = r"rows: a re-plan writes the tables with their optimizer state here, [\d.]+ [KM]iB"
    with pytest.raises(ValueError, match=refused + ", and its disk has 1000 B free"):
        spill_unsplit_state(fae_dmp, fae_optimizer, embedding, folder)
    assert not list(folder.rglob("*.npy"))


def test_a_replan_without_room_on_disk_for_the_tables_is_refused(tmp_path):
    run_on_ranks(_too_little_disk, 2, tmp_path, tmp_path / "rows")


def test_an_optimizer_whose_state_cannot_move_is_refused():
    with pytest.raises(ValueError, match="lr_decay"):
        _ = EmbeddingOptimizer(torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}).row_state


def _sorted_rows(ids: np.ndarray) -> np.ndarray:
    return ids[np.lexsort(ids.T[::-1])]


def test_the_rest_of_an_epoch_holds_every_untrained_input_once():
    """The steps done and the re-partitioned rest hold every input of the data exactly once, whatever
    the split point and world size, and the rest keeps the data's order."""
    data = SyntheticCriteo(3000, batch_size=500, scale=0.0005, seed=3)
    tables = data.table_configs(8)
    stats = AccessProfiler(tables, 0.3, seed=0, holdout_size=200).profile(data)
    partition = HotColdPartition.of(data.blocks(), stats.hot_set(48 << 10), data.feature_names)
    data_ids = np.concatenate([b.ids for b in data.blocks()])
    for world_size, done in ((1, 0), (1, 7), (2, 5), (2, 1000)):
        steps = make_schedule(partition.is_hot, 32, world_size, seed=4)
        trained = trained_inputs(partition.is_hot, steps[:done])
        taken = [
            partition.part(part).slice(start, stop).ids
            for step in steps[:done]
            for spans in step.spans
            for part, start, stop in spans
        ]
        rest = list(partition.inputs(~trained, block_size=97))
        assert all(0 < len(block) <= 97 for block in rest)
        rest_ids = np.concatenate([b.ids for b in rest]) if rest else data_ids[:0]
        assert np.array_equal(rest_ids, data_ids[~trained])  # the untrained inputs, in the data's order
        taken_ids = np.concatenate(taken) if taken else data_ids[:0]
        assert len(taken_ids) == int(trained.sum())  # no input trained twice
        assert np.array_equal(_sorted_rows(taken_ids), _sorted_rows(data_ids[trained]))
        assert len(taken_ids) + len(rest_ids) == len(data_ids)
