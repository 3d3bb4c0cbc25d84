"""examples/adopt/train_torchrec.py made FAE (docs/adopt.md shows the diff): the data profiled and
partitioned once, the tables split into hot and cold parts, placed by FAE's planner, and trained by
FAE's pipeline on the batch router's batches.

    python examples/adopt/train_fae.py
    torchrun --nproc_per_node 2 examples/adopt/train_fae.py
"""

import os
import tempfile
from collections.abc import Callable, Iterable
from itertools import islice

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from fae_torchrec import BatchRouter, FAEEmbeddingBagCollection, FAETrainPipeline, prepare_data
from fae_torchrec.data import SyntheticCriteo
from planner import FAEShardingPlanner

BATCH_SIZE = 512


class Batches(IterableDataset):
    """A DataLoader's view of the batches ``batches()`` gives, anew for each epoch."""

    def __init__(self, batches: Callable[[], Iterable[Batch]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches())


def main() -> float:
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("gloo")
    else:  # a plain `python` run: a group of one
        store = f"file://{tempfile.mkdtemp()}/store"
        dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    torch.manual_seed(0)

    data = SyntheticCriteo(100_000, batch_size=BATCH_SIZE, scale=0.002)
    tables = data.table_configs(embedding_dim=16)
    loader = DataLoader(Batches(lambda: islice(data, rank, None, world_size)), batch_size=None)
    prepared = prepare_data(loader, tables, "partition", batch_size=BATCH_SIZE, hot_budget=256 << 10)

    ebc = FAEEmbeddingBagCollection(tables, prepared.hot_set)
    model = DLRMTrain(
        DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[64, 16], over_arch_layer_sizes=[64, 32, 1])
    )
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.05})
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size), kernel_config=KernelConfig(compute_device=device.type)
    )
    planner = FAEShardingPlanner(topology, prepared.stats, batch_size=BATCH_SIZE)
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan)
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    optimizer = KeyedOptimizerWrapper(dense, lambda params: torch.optim.Adagrad(params, lr=0.05))

    pipeline = FAETrainPipeline(dmp, optimizer, device)
    router = BatchRouter(prepared.partition, BATCH_SIZE, world_size, rank, split=ebc.split)
    batches, losses = router.batches(epochs=1), []
    while True:
        try:
            losses.append(float(pipeline.progress(batches)[0]))
        except StopIteration:
            break
    if rank == 0:
        print(f"{len(losses)} steps, mean loss of the last 20: {sum(losses[-20:]) / 20:.4f}")
    dist.destroy_process_group()
    return sum(losses[-20:]) / 20


if __name__ == "__main__":
    main()
