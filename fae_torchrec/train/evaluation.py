"""Validation of a TorchRec ``DLRMTrain``-like model: AUC and log loss, over all ranks."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torchmetrics.classification import BinaryAUROC
from torchrec.datasets.utils import Batch


def evaluate(model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
    """AUC and mean log loss of ``model`` on ``batches`` (this rank's share; every rank must call
    it with the same number of batches, and the figures cover all ranks)."""
    # on the collective's device: NCCL reduces CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
    auroc = BinaryAUROC().to(device)
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for batch in batches:
            _, (_, logits, labels) = model(batch)
            logits, labels = logits.to(device).float(), labels.to(device).float()
            auroc.update(torch.sigmoid(logits), labels.int())
            loss = nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            loss_sum[0] += loss.double()
            loss_sum[1] += len(labels)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(loss_sum)
    return {"auc": float(auroc.compute()), "log_loss": float(loss_sum[0] / loss_sum[1])}


def _nccl() -> bool:
    return dist.is_initialized() and dist.get_backend() == "nccl"
