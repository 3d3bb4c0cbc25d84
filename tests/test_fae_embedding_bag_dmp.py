"""The split module under DistributedModelParallel: 2 gloo ranks on CPU, the plan from
FAEShardingPlanner.collective_plan; outputs equal the unsplit EBC's on hot, cold and mixed batches."""

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import Topology
from torchrec.modules.embedding_configs import PoolingType

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection, load_full_state_dict
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
