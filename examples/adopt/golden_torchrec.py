"""A TorchRec training script of the shape of TorchRec's golden trainer (examples/golden_training in
pytorch/torchrec), written here: DLRM whose EmbeddingBagCollection is built on the meta device, sharded
by DistributedModelParallel's own planner with a custom sharder, RowWiseAdagrad applied in backward,
TrainPipelineSparseDist over an endless RandomRecDataset per rank, a fixed number of iterations.
docs/adopt.md turns it into FAE (golden_fae.py beside it).

    python examples/adopt/golden_torchrec.py
    torchrun --nproc_per_node 2 examples/adopt/golden_torchrec.py
"""

import os
import tempfile

import torch
from torch import distributed as dist
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from tqdm import tqdm

NUM_EMBEDDINGS, EMBEDDING_DIM, BATCH_SIZE, ITERATIONS, LEARNING_RATE = 100, 16, 32, 100, 0.1


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
    model = DLRMTrain(
        DLRM(
            EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
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
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device)

    batches, losses = iter(dataset), []
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
