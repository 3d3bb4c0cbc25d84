"""Train TorchRec's DLRM with FAE on DistributedModelParallel, or a baseline with ``--baseline``.

FAE: profile a sample of the training data, choose the hot set, split the embedding tables
(``FAEEmbeddingBagCollection``), plan them with ``FAEShardingPlanner``, and train with the batch router:
hot steps run the hot part only, cold steps both parts. A baseline trains the unsplit DLRM on the same
data with its batches in random order, with the same hyperparameters, planned by one of TorchRec's
planners (``planner.baseline``): ``torchrec`` (the default planner, plain ``--baseline``), ``scaleup``
(UVM caches grown by the scale-up proposer) or ``hbm`` (every table in device memory). On CPU all three
plan TorchRec's CPU kernels.

    python examples/train_dlrm_fae.py                        # built-in synthetic data, one process
    python examples/train_dlrm_fae.py --baseline             # the same model and data, TorchRec alone
    python examples/train_dlrm_fae.py --baseline scaleup --hbm-cap 8GiB   # on a GPU
    torchrun --nproc_per_node 2 examples/train_dlrm_fae.py   # 2 ranks (gloo on CPU, NCCL on GPU)
    python examples/train_dlrm_fae.py --data criteo-tsv train.txt --scale 1.0
    python examples/train_dlrm_fae.py --stats stats.npz --plan plan.pt   # `fae-torchrec profile`'s, `plan`'s
    python examples/train_dlrm_fae.py --cold-tier planned    # cold rows in host memory, copied into slots

Writes ``metrics.json`` (with throughput, hot and cold step times), ``curves.png`` (train loss with its hot
and cold steps, validation AUC; ``--compare RUN`` draws a baseline run beside it) and the profiled
statistics ``stats.npz`` to ``--out``, and ends by naming them. Its defaults are those of
``fae-torchrec profile`` and ``plan`` (``fae_torchrec/defaults.py``): with ``--stats`` it takes the hot set
from ``profile``'s statistics instead of profiling again, with ``--plan`` it shards with the plan ``plan
--out`` wrote from them, and refuses one made for another run.

The recipe it runs (``fae_torchrec.recipes``) builds the run in TorchRec's order: the data prepared on
every rank (``fae_torchrec.train.prepare_data``), the model planned by ``FAEShardingPlanner`` and
sharded by DMP, then trained on ``FAETrainPipeline`` (``fae_torchrec.train.StepRunner``).
docs/adopt.md shows the same steps in a plain TorchRec training script.
"""

from fae_torchrec.recipes import DLRM, run

if __name__ == "__main__":
    run(DLRM)
