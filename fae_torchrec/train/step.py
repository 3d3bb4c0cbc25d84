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


def train_step(model: nn.Module, batch: Batch, dense_optimizer: torch.optim.Optimizer) -> float:
    """Forward, backward and optimizer steps on ``batch``; the loss.

    ``model(batch)`` returns ``(loss, ...)`` as TorchRec's ``DLRMTrain`` does. Embedding weights are
    updated by their fused optimizers during backward; ``dense_optimizer`` updates the rest, data-
    parallel tables included (build it with :func:`fae_torchrec.train.optimizers.unfused_optimizer`).
    Whether the step is hot travels with the batch: a batch whose ``sparse_features`` is a
    ``SplitFeatures`` that ``is_hot`` (as :class:`BatchRouter` makes them, alike on every rank) runs the
    hot part of the FAE module only.
    """
    dense_optimizer.zero_grad()
    loss = model(batch)[0]
    loss.backward()
    dense_optimizer.step()
    return float(loss.detach())
