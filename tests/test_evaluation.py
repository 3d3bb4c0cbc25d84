"""``evaluate``: AUC and log loss over every rank's validation batches, on real gloo ranks."""

import math

import pytest
import torch
from torch import nn
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import evaluate
from fae_torchrec.train.evaluation import roc_auc
from tests.distributed import run_on_ranks


class _Scores(nn.Module):
    """A model whose logit is the first dense feature, returning what ``DLRMTrain`` returns."""

    def forward(self, batch: Batch):
        logits = batch.dense_features[:, 0]
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
        return loss, (loss.detach(), logits, batch.labels)


def _batches(rank: int, sizes: tuple[int, ...]) -> list[Batch]:
    """Rank ``rank``'s batches: informative logits, so the AUC is far from 0.5."""
    generator = torch.Generator().manual_seed(rank)
    batches = []
    for size in sizes:
        labels = torch.randint(0, 2, (size,), generator=generator)
        logits = 1.5 * (labels - 0.5) + torch.randn(size, generator=generator)
        empty = KeyedJaggedTensor.from_lengths_sync(
            ["f"], torch.zeros(0, dtype=torch.int64), torch.zeros(size, dtype=torch.int32)
        )
        batches.append(Batch(logits.unsqueeze(1), empty, labels))
    return batches


def _evaluate_on_ranks(rank: int, world_size: int) -> None:
    sizes = {0: (64, 64, 17), 1: (64, 64, 5)}  # the same number of batches, not of inputs
    result = evaluate(_Scores(), _batches(rank, sizes[rank]))
    every = [batch for r in range(world_size) for batch in _batches(r, sizes[r])]
    logits = torch.cat([b.dense_features[:, 0] for b in every])
    labels = torch.cat([b.labels for b in every])
    expected_auc = float(binary_auroc(torch.sigmoid(logits), labels, thresholds=None))
    expected_loss = float(nn.functional.binary_cross_entropy_with_logits(logits, labels.float()))
    assert 0.7 < expected_auc < 1.0
    assert result["auc"] == pytest.approx(expected_auc, abs=1e-6), "the AUC of all ranks' inputs together"
    assert result["log_loss"] == pytest.approx(expected_loss, abs=1e-6)


@pytest.mark.parametrize("world_size", [1, 2])
def test_evaluate_covers_every_rank(tmp_path, world_size):
    run_on_ranks(_evaluate_on_ranks, world_size, tmp_path)


def test_roc_auc_is_torchmetrics_exact_auroc_with_ties_and_nan_for_one_class():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (5000,), generator=generator)
    scores = (labels + 2 * torch.rand(5000, generator=generator)).round(decimals=1)  # many ties
    expected = float(binary_auroc(scores, labels, thresholds=None))
    assert 0.6 < expected < 0.9
    assert roc_auc(scores, labels) == pytest.approx(expected, abs=1e-6)  # torchmetrics sums in float32
    assert roc_auc(torch.tensor([0.1, 0.2, 0.2, 0.9]), torch.tensor([0, 1, 0, 1])) == 0.875
    assert math.isnan(roc_auc(scores, torch.ones_like(labels)))
