"""One training step of a TorchRec model whose embeddings may be FAE-split."""

from __future__ import annotations

import torch
from torch import nn
from torchrec.datasets.utils import Batch

from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection


def find_fae_module(model: nn.Module) -> FAEEmbeddingBagCollection | None:
    """The ``FAEEmbeddingBagCollection`` inside ``model`` (also under DMP), if any."""
    found = [m for m in model.modules() if isinstance(m, FAEEmbeddingBagCollection)]
    if len(found) > 1:
        raise ValueError(f"expected at most one FAEEmbeddingBagCollection, found {len(found)}")
    return found[0] if found else None


def train_step(
    model: nn.Module, batch: Batch, dense_optimizer: torch.optim.Optimizer, hot: bool = False
) -> float:
    """Forward, backward and optimizer steps on ``batch``; the loss.

    ``model(batch)`` returns ``(loss, ...)`` as TorchRec's ``DLRMTrain`` does. Embedding weights are
    updated by their fused optimizers during backward; ``dense_optimizer`` updates the rest, data-
    parallel tables included (build it with :func:`fae_torchrec.train.optimizers.unfused_optimizer`). A
    ``hot`` step runs the hot part of the FAE module only (every rank must agree on ``hot``).
    """
    fae = find_fae_module(model)
    if fae is not None:
        fae.hot_only = hot
    try:
        dense_optimizer.zero_grad()
        loss = model(batch)[0]
        loss.backward()
        dense_optimizer.step()
    finally:
        if fae is not None:
            fae.hot_only = False
    return float(loss.detach())
