"""Resume mid-epoch: N steps straight equal k steps, checkpoint, a fresh model, resume, N - k steps."""

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM, DLRMTrain

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection, load_full_state_dict
from fae_torchrec.checkpoint import load_checkpoint, save_checkpoint
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.optimizers import EmbeddingOptimizer, unfused_optimizer
from fae_torchrec.partition import HotColdPartition
from fae_torchrec.router import BatchRouter
from fae_torchrec.state import gather_full_state_dict
from fae_torchrec.training import train_step
from planner import FAEShardingPlanner
from tests.distributed import run_on_ranks

STEPS, SAVE_AT = 16, 7


def _resume_matches(rank: int, world_size: int, directory: str) -> None:
    data = SyntheticCriteo(STEPS * 32 * world_size + 500, batch_size=4096, scale=0.0005, seed=6)
    tables = data.table_configs(8)
    stats = AccessProfiler(tables, 0.3, seed=0, holdout_size=500).profile(data)
    hot_set = stats.hot_set(32 << 10)
    topology = Topology(world_size=world_size, compute_device="cpu")
    partition = HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES)
    router = BatchRouter(partition, 32, world_size, rank, seed=2)

    def fresh(seed: int):
        torch.manual_seed(seed)
        split = FAEEmbeddingBagCollection(tables, hot_set)
        model = DLRMTrain(DLRM(split, 13, [16, 8], [8, 1]))
        embedding = EmbeddingOptimizer(torchrec.optim.RowWiseAdagrad, {"lr": 0.05})
        embedding.apply(split)
        full = {k: v.detach().clone() for k, v in model.state_dict().items()}
        planner = FAEShardingPlanner(topology, stats, batch_size=32, hot_budget_bytes=32 << 10)
        plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(
            model, device=torch.device("cpu"), plan=plan, sharders=get_default_sharders()
        )
        load_full_state_dict(dmp, full)
        dense = unfused_optimizer(dmp, embedding, lambda params: torch.optim.Adagrad(params, lr=0.05))
        return dmp, dense

    def run(dmp, dense, start, stop):
        for routed in router.epoch(0, start_step=start):
            if routed.step >= stop:
                break
            train_step(dmp, routed.batch, dense, hot=routed.hot)

    straight, straight_dense = fresh(0)
    run(straight, straight_dense, 0, STEPS)
    expected = gather_full_state_dict(straight)

    first, first_dense = fresh(0)
    run(first, first_dense, 0, SAVE_AT)
    save_checkpoint(directory, first, first_dense, {"epoch": 0, "step": SAVE_AT}, rank)
    dist.barrier()
    resumed, resumed_dense = fresh(123)  # other initial weights: everything must come from the checkpoint
    position = load_checkpoint(directory, resumed, resumed_dense, rank)
    assert position == {"epoch": 0, "step": SAVE_AT}
    run(resumed, resumed_dense, position["step"], STEPS)
    actual = gather_full_state_dict(resumed)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_equals_training_straight_through(tmp_path, world_size):
    run_on_ranks(_resume_matches, world_size, tmp_path, str(tmp_path / "checkpoint"))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint for rank 0"):
        load_checkpoint(tmp_path, None, None, 0)
