"""Train TBSM (the time-based sequence model) with FAE on DistributedModelParallel, or a baseline.

The same driver as ``examples/train_dlrm_fae.py``, with the same options and outputs, on TBSM over
Taobao-like user histories: a sample is a user's last ``--ts-length`` events and a target item, each
step looking up the user, item and category tables. An input is hot only when every id of every step
is hot. The profile samples 20% of the inputs by default (FAE's TBSM setting; DLRM: 5%).

    python examples/train_tbsm_fae.py                          # built-in synthetic Taobao-like data
    python examples/train_tbsm_fae.py --baseline               # the same model and data, TorchRec alone
    torchrun --nproc_per_node 2 examples/train_tbsm_fae.py     # 2 ranks
    python examples/train_tbsm_fae.py --data taobao-csv UserBehavior.csv

Validation takes one window per test user (users whose last event is after the 70th percentile of
last events, as the reference's split).
"""

from __future__ import annotations

import argparse

from torch import nn
from torchrec.models.dlrm import DLRMTrain
from train_dlrm_fae import BLOCK, ModelFamily, run

from fae_torchrec.data.sources import PROFILE_SAMPLE, add_taobao_arguments, open_taobao_source
from fae_torchrec.models import TBSM


def _tbsm(sparse: nn.Module, args: argparse.Namespace) -> nn.Module:
    """TBSM with the reference run's layer sizes, the bottom MLP ending in ``--dim``; TorchRec's
    ``DLRMTrain`` is its binary cross-entropy wrapper (it serves any model of dense and sparse
    features)."""
    return DLRMTrain(TBSM(sparse, ts_length=args.ts_length, dense_arch_layer_sizes=[args.dim]))


TBSM_FAMILY = ModelFamily(
    name="TBSM",
    description=__doc__.split("\n")[0],
    add_arguments=lambda parser: add_taobao_arguments(parser, num_users=20_000, scale=0.01),
    open_source=lambda args: open_taobao_source(args, batch_size=BLOCK),
    build_model=_tbsm,
    sparse_path="model.embedding_bag_collection",
    # label balance and warm-up: without them FAE's hot steps, 60% positive against 40% for the other
    # inputs, cost TBSM accuracy, and can keep it at a constant prediction (BENCHMARKS.md, section 6)
    defaults={"batch_size": 256, "sample": PROFILE_SAMPLE["tbsm"], "budget": "2MiB", "balance": 0.5},
    warmup=0.1,
)

if __name__ == "__main__":
    run(TBSM_FAMILY)
