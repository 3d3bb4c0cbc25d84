"""examples/adopt/golden_torchrec.py made FAE (docs/adopt.md shows the diff): the first batches of each
rank's endless dataset read once, profiled and partitioned, the tables split into hot and cold parts
(still built inline on the meta device, still planned by DMP with the same sharder), and FAE's pipeline
trained, for the same number of iterations, on the batch router's batches, epoch after epoch.

    python examples/adopt/golden_fae.py
    torchrun --nproc_per_node 2 examples/adopt/golden_fae.py
"""

import os
import tempfile

import torch
from torch import distributed as dist
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from tqdm import tqdm

from fae_torchrec import BatchRouter, FAEEmbeddingBagCollection, FAETrainPipeline, prepare_data

NUM_EMBEDDINGS, EMBEDDING_DIM, BATCH_SIZE, ITERATIONS, LEARNING_RATE = 100, 16, 32, 100, 0.1
HOT = 140_000  # bytes of hot rows, RowWiseAdagrad's state included


def main() -> None:
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("gloo")
    else:  # a plain `python` run: a group of one
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1
        )
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    torch.manual_seed(0)

    tables = [
        EmbeddingBagConfig(
            name=f"t_{feature}", embedding_dim=EMBEDDING_DIM, num_embeddings=NUM_EMBEDDINGS,
            feature_names=[feature],
        )
        for feature in DEFAULT_CAT_NAMES
    ]  # fmt: skip
    dataset = RandomRecDataset(
        keys=DEFAULT_CAT_NAMES, batch_size=BATCH_SIZE, hash_size=NUM_EMBEDDINGS, ids_per_feature=1,
        num_dense=len(DEFAULT_INT_NAMES), manual_seed=rank,
    )  # fmt: skip
    prepared = prepare_data(dataset, tables, "partition", num_batches=50, sample=0.2, batch_size=BATCH_SIZE,
                            hot_budget=HOT, optimizer_class=RowWiseAdagrad)  # fmt: skip
    model = DLRMTrain(
        DLRM(
            FAEEmbeddingBagCollection(tables, prepared.hot_set, device=torch.device("meta")),
            dense_in_features=len(DEFAULT_INT_NAMES),
            dense_arch_layer_sizes=[64, EMBEDDING_DIM],
            over_arch_layer_sizes=[64, 1],
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": LEARNING_RATE})
    sharder = EmbeddingBagCollectionSharder(
        qcomm_codecs_registry=get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)
        )
    )
    dmp = DistributedModelParallel(module=model, device=device, sharders=[sharder])
    optimizer = KeyedOptimizerWrapper(
        dict(dmp.named_parameters()), lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE)
    )
    pipeline = FAETrainPipeline(dmp, optimizer, device)

    router = BatchRouter(prepared.partition, BATCH_SIZE, world_size, rank, split=dmp)
    batches, losses = router.batches(), []
    for _ in tqdm(range(ITERATIONS), disable=rank > 0):
        losses.append(float(pipeline.progress(batches)[0]))
    if rank == 0:
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print(
            f"{len(losses)} steps on {world_size} ranks; mean loss: first 20 {first:.4f}, last 20 {last:.4f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
