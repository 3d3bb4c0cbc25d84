"""Checkpoints: resume equals training straight through; every kind of bad checkpoint is refused or,
for a save that not every rank finished, falls back to the last complete one."""

import resource
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM, DLRMTrain

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.modules import load_full_state_dict
from fae_torchrec.modules.state import gather_full_state_dict
from fae_torchrec.train.checkpoint import CheckpointError, Checkpoints
from fae_torchrec.train.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.step import train_step
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks

STEPS, SAVE_AT = 16, 7
CONFIG = {"--batch-size": 32, "--optimizer": "rowwise_adagrad"}


class _Run:
    """An FAE DLRM on DMP, its router and its checkpoints, built alike on every rank."""

    def __init__(self, rank: int, world_size: int) -> None:
        data = SyntheticCriteo(STEPS * 32 * world_size + 500, batch_size=4096, scale=0.0005, seed=6)
        self.tables = data.table_configs(8)
        self.stats = AccessProfiler(self.tables, 0.3, seed=0, holdout_size=500).profile(data)
        self.hot_set = self.stats.hot_set(32 << 10)
        self.topology = Topology(world_size=world_size, compute_device="cpu")
        partition = HotColdPartition.of(data.blocks(), self.hot_set, DEFAULT_CAT_NAMES)
        self.router = BatchRouter(partition, 32, world_size, rank, seed=2)

    def fresh(self, seed: int):
        torch.manual_seed(seed)
        split = FAEEmbeddingBagCollection(self.tables, self.hot_set)
        model = DLRMTrain(DLRM(split, 13, [16, 8], [8, 1]))
        embedding = EmbeddingOptimizer(torchrec.optim.RowWiseAdagrad, {"lr": 0.05})
        embedding.apply(split)
        full = {k: v.detach().clone() for k, v in model.state_dict().items()}
        planner = FAEShardingPlanner(self.topology, self.stats, batch_size=32, hot_budget_bytes=32 << 10)
        self.plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(
            model, device=torch.device("cpu"), plan=self.plan, sharders=get_default_sharders()
        )
        load_full_state_dict(dmp, full)
        dense = unfused_optimizer(dmp, embedding, lambda params: torch.optim.Adagrad(params, lr=0.05))
        return dmp, dense

    def train(self, dmp, dense, start: int, stop: int) -> None:
        for routed in self.router.epoch(0, start_step=start):
            if routed.step >= stop:
                break
            train_step(dmp, routed.batch, dense)


def _assert_same_state(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-6)


def _resume_matches(rank: int, world_size: int, directory: str) -> None:
    run = _Run(rank, world_size)
    straight, straight_dense = run.fresh(0)
    run.train(straight, straight_dense, 0, STEPS)
    expected = gather_full_state_dict(straight)

    first, first_dense = run.fresh(0)
    run.train(first, first_dense, 0, SAVE_AT)
    Checkpoints(directory, CONFIG, run.plan).save(SAVE_AT, first, first_dense, {"step": SAVE_AT})
    resumed, resumed_dense = run.fresh(123)  # other initial weights: everything must come from the checkpoint
    position = Checkpoints(directory, CONFIG, run.plan).load(resumed, resumed_dense)
    assert position == {"step": SAVE_AT}
    run.train(resumed, resumed_dense, position["step"], STEPS)
    _assert_same_state(gather_full_state_dict(resumed), expected)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_equals_training_straight_through(tmp_path, world_size):
    run_on_ranks(_resume_matches, world_size, tmp_path, str(tmp_path / "checkpoint"))


def _on_rank_zero(rank: int, action) -> None:
    """Change the files on rank 0 only, then let every rank go on."""
    if rank == 0:
        action()
    dist.barrier()


def _refused(checkpoints: Checkpoints, model, dense, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        checkpoints.load(model, dense)


def _damage_and_fallback(rank: int, world_size: int, directory: str) -> None:
    run = _Run(rank, world_size)
    model, dense = run.fresh(0)
    root = Path(directory)
    checkpoints = Checkpoints(root, CONFIG, run.plan)
    run.train(model, dense, 0, 3)
    checkpoints.save(3, model, dense, {"step": 3})
    run.train(model, dense, 3, 5)
    at_five = gather_full_state_dict(model)
    checkpoints.save(5, model, dense, {"step": 5})
    dist.barrier()  # every rank has removed its older files
    assert sorted(p.name for p in root.iterdir()) == ["step-000000005"]  # the older one went
    _on_rank_zero(rank, lambda: shutil.copytree(root / "step-000000005", root.parent / "backup"))

    # a crash between two ranks' saves: rank 1 never wrote step 8, so step 5 is kept everywhere
    run.train(model, dense, 5, 8)
    checkpoints.save(8, model, dense, {"step": 8})
    dist.barrier()
    _on_rank_zero(rank, lambda: shutil.copytree(root.parent / "backup", root / "step-000000005"))
    (root / "step-000000008" / "rank1.json").unlink(missing_ok=True)
    (root / "step-000000008" / "rank1.pt").unlink(missing_ok=True)
    dist.barrier()
    resumed, resumed_dense = run.fresh(1)
    if world_size > 1:
        assert Checkpoints(root, CONFIG, run.plan).load(resumed, resumed_dense) == {"step": 5}
        _assert_same_state(gather_full_state_dict(resumed), at_five)
        # what the interrupted save left is gone: written again later, it cannot mix with the old one
        assert not (root / "step-000000008" / "rank0.json").exists()
    else:
        assert Checkpoints(root, CONFIG, run.plan).load(resumed, resumed_dense) == {"step": 8}
    _on_rank_zero(rank, lambda: shutil.rmtree(root / "step-000000008", ignore_errors=True))

    # a rank that cannot write makes every rank raise (none waits in a collective)
    blocked = root.parent / "blocked"
    _on_rank_zero(
        rank, lambda: (blocked / "step-000000011" / f"rank{world_size - 1}.pt.tmp").mkdir(parents=True)
    )
    with pytest.raises(CheckpointError, match=f"rank {world_size - 1} could not write its checkpoint"):
        Checkpoints(blocked, CONFIG, run.plan).save(11, resumed, resumed_dense, {"step": 11})

    # another configuration or plan is refused, naming the option or the parameter
    _refused(
        Checkpoints(root, {**CONFIG, "--batch-size": 64}, run.plan), resumed, resumed_dense, "--batch-size"
    )
    _refused(Checkpoints(root, {"--batch-size": 32}, run.plan), resumed, resumed_dense, "--optimizer")
    _refused(Checkpoints(root, CONFIG, None), resumed, resumed_dense, "was sharded as")

    # damaged files: 4 KiB overwritten in the middle, truncated, zero bytes, a damaged manifest
    saved = root / "step-000000005" / "rank0.pt"
    good, manifest = saved.read_bytes(), saved.with_suffix(".json").read_text()

    def overwrite_middle():
        with open(saved, "r+b") as file:
            file.seek(len(good) // 2)
            file.write(b"\x5a" * 4096)

    for damage, match in (
        (overwrite_middle, "rank0.pt: damaged: its SHA-256 differs"),
        (lambda: saved.write_bytes(good[: len(good) // 3]), "rank0.pt: damaged .truncated"),
        (lambda: saved.write_bytes(b""), "rank0.pt: damaged .truncated"),
        (lambda: saved.with_suffix(".json").write_text('{"format": 1, "st'), "rank0.json: damaged manifest"),
        (
            lambda: saved.with_suffix(".json").write_text(manifest.replace('"step": 5', '"step": 4')),
            "rank0.json: damaged manifest .step 4 in another folder",
        ),
    ):
        _on_rank_zero(rank, damage)
        _refused(Checkpoints(root, CONFIG, run.plan), resumed, resumed_dense, match)
        _on_rank_zero(
            rank, lambda: (saved.write_bytes(good), saved.with_suffix(".json").write_text(manifest))
        )

    # a new run does not write over another run's checkpoints; resuming the run continues it
    with pytest.raises(CheckpointError, match="holds checkpoints of another run"):
        Checkpoints(root, CONFIG, run.plan).save(9, resumed, resumed_dense, {"step": 9})
    continued = Checkpoints(root, CONFIG, run.plan)
    continued.load(resumed, resumed_dense)
    continued.save(9, resumed, resumed_dense, {"step": 9})
    dist.barrier()
    assert sorted(p.name for p in root.iterdir()) == ["step-000000009"]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_damaged_foreign_and_half_written_checkpoints(tmp_path, world_size):
    run_on_ranks(_damage_and_fallback, world_size, tmp_path, str(tmp_path / "checkpoint"))


def _save(rank: int, world_size: int, directory: str) -> None:
    run = _Run(rank, world_size)
    model, dense = run.fresh(0)
    Checkpoints(directory, CONFIG, run.plan).save(0, model, dense, {"step": 0})


def _load_refused(rank: int, world_size: int, directory: str, match: str) -> None:
    run = _Run(rank, world_size)
    model, dense = run.fresh(0)
    _refused(Checkpoints(directory, CONFIG, run.plan), model, dense, match)


@pytest.mark.slow
def test_another_world_size_is_refused(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    for group in "abcd":
        (tmp_path / group).mkdir()
    run_on_ranks(_save, 1, tmp_path / "a", one)
    run_on_ranks(_save, 2, tmp_path / "b", two)
    run_on_ranks(_load_refused, 2, tmp_path / "c", one, "written by 1 rank.s., this run has 2")
    run_on_ranks(_load_refused, 1, tmp_path / "d", two, "written by 2 rank.s., this run has 1")


def _save_on_a_full_disk(rank: int, world_size: int, directory: str) -> None:
    """A save that runs out of room (a file size limit on this rank's process, a real failed write)
    leaves no partial file, names the file, and keeps the checkpoint before it whole."""
    run = _Run(rank, world_size)
    model, dense = run.fresh(0)
    checkpoints = Checkpoints(directory, CONFIG, run.plan)
    checkpoints.save(1, model, dense, {"step": 1})
    whole = Path(directory) / "step-000000001" / "rank0.pt"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (whole.stat().st_size // 2, limits[1]))
    try:
        with pytest.raises(CheckpointError) as refused:
            checkpoints.save(2, model, dense, {"step": 2})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    written = Path(directory) / "step-000000002" / "rank0.pt"
    assert (
        str(refused.value) == f"rank 0 could not write its checkpoint: [Errno 27] File too large: '{written}'"
    )
    assert not any(written.parent.iterdir()), "no partial file left"
    assert Checkpoints(directory, CONFIG, run.plan).load(model, dense) == {"step": 1}


def test_a_full_disk_leaves_no_partial_checkpoint(tmp_path):
    run_on_ranks(_save_on_a_full_disk, 1, tmp_path, str(tmp_path / "checkpoint"))


def _nothing_to_resume(rank: int, world_size: int, directory: str) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        Checkpoints(directory, CONFIG).load(None, None)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    run_on_ranks(_nothing_to_resume, 1, tmp_path, str(tmp_path / "empty"))


def _peak_rss_reset() -> int:
    """The resident bytes now, after resetting this process's peak to them (``/proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def _status_bytes(key: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) << 10


def _save_and_load_in_bounded_memory(rank: int, world_size: int, directory: str) -> None:
    """A 256 MiB table with Adagrad's state (512 MiB over the ranks): saving, then loading into a fresh
    model, each rank's peak stays within its resident bytes before plus 10% of the state it holds."""
    tables = [
        torchrec.EmbeddingBagConfig(name="big", embedding_dim=64, num_embeddings=1 << 20, feature_names=["f"])
    ]
    topology = Topology(world_size=world_size, compute_device="cpu")
    embedding = EmbeddingOptimizer(torchrec.optim.Adagrad, {"lr": 0.05})
    plan = None

    def fresh():
        nonlocal plan
        ebc = torchrec.EmbeddingBagCollection(tables, device=torch.device("meta"))
        embedding.apply(ebc)
        plan = plan or EmbeddingShardingPlanner(topology).collective_plan(
            ebc, get_default_sharders(), dist.GroupMember.WORLD
        )
        dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan)
        return dmp, unfused_optimizer(dmp, embedding, lambda params: torch.optim.Adagrad(params, lr=0.05))

    model, dense = fresh()
    shards = model.state_dict()["embedding_bags.big.weight"].local_shards()
    with torch.no_grad():
        for shard in shards:
            shard.tensor.normal_()
    held = 2 * sum(shard.tensor.nbytes for shard in shards)  # the rank's rows and their Adagrad state
    before = _peak_rss_reset()
    Checkpoints(directory, CONFIG, plan).save(1, model, dense, {"step": 1})
    saved_extra = _status_bytes("VmHWM") - before
    expected = gather_full_state_dict(model)
    del model, dense
    resumed, resumed_dense = fresh()
    before = _peak_rss_reset()
    assert Checkpoints(directory, CONFIG, plan).load(resumed, resumed_dense) == {"step": 1}
    loaded_extra = _status_bytes("VmHWM") - before
    _assert_same_state(gather_full_state_dict(resumed), expected)
    bound = max(held, 1 << 28) / 10  # a rank holding no rows still has the other's buffers to pay for
    assert saved_extra < bound and loaded_extra < bound, (saved_extra, loaded_extra, held)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_saving_and_loading_hold_no_second_copy_of_the_tables(tmp_path, world_size):
    run_on_ranks(_save_and_load_in_bounded_memory, world_size, tmp_path, str(tmp_path / "checkpoint"))
