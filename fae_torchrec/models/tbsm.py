"""TBSM, the time-based sequence model (Ishkhanov et al., arXiv 2008.11922), on TorchRec's modules.

Each of the ``ts_length`` history steps and the target step goes through a DLRM tower: the step's
dense features through TorchRec's ``DenseArch``, its pooled embeddings (one feature per table and
step) and the dense output through TorchRec's ``InteractionArch`` (pairwise dot products), then a top
MLP. The target's vector ``w`` attends over the history's vectors ``H`` (the reference's time-series
layer: scores ``H A^T A w``, weighted by an MLP ending in a sigmoid), and a final MLP maps the context
and ``w`` to the click logit. The defaults are the reference run's (facebookresearch/tbsm,
``bench/tbsm_bench.sh``: ``--tsl-inner def --tsl-num-heads 1 --tsl-mechanism mlp``, bottom MLP 1-16,
top MLP 15-15, TSL MLP 15-15, final MLP 60-1). The model returns logits, not probabilities: TorchRec's
``DLRMTrain`` (a binary cross-entropy wrapper for any model of dense and sparse features) trains it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class TBSM(nn.Module):
    """TBSM over an ``EmbeddingBagCollection`` (or a module with its interface, such as
    ``FAEEmbeddingBagCollection``) whose tables each read one feature per step.

    Args:
        embedding_bag_collection: the tables; each table reads ``ts_length + 1`` features, one per
            step, in step order (``tbsm_table_configs`` makes them), all of one embedding dimension.
        ts_length: history steps; an input has ``ts_length + 1`` steps, the target last.
        dense_in_features: dense features per step (the reference: 1, the step's position).
        dense_arch_layer_sizes: the bottom MLP; its last size must be the embedding dimension.
        top_arch_layer_sizes: the top MLP of each step's DLRM tower (its output is a step's vector).
        tsl_layer_sizes: the hidden layers of the attention MLP (``ts_length`` in and out).
        final_arch_layer_sizes: the final MLP over the context and the target's vector; ends in 1.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        ts_length: int = 20,
        dense_in_features: int = 1,
        dense_arch_layer_sizes: Sequence[int] = (16,),
        top_arch_layer_sizes: Sequence[int] = (15, 15),
        tsl_layer_sizes: Sequence[int] = (15, 15),
        final_arch_layer_sizes: Sequence[int] = (60, 1),
    ) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        steps = ts_length + 1
        dims = {c.embedding_dim for c in configs}
        if len(dims) != 1:
            raise ValueError(f"TBSM needs one embedding dimension for all tables, got {sorted(dims)}")
        (dim,) = dims
        bad = [c.name for c in configs if len(c.feature_names) != steps]
        if bad:
            raise ValueError(
                f"tables {bad} must each read {steps} features, one per step (ts_length {ts_length})"
            )
        if dense_arch_layer_sizes[-1] != dim:
            raise ValueError(
                f"the bottom MLP must end in the embedding dimension {dim}, "
                f"got {list(dense_arch_layer_sizes)}"
            )
        if final_arch_layer_sizes[-1] != 1:
            raise ValueError(f"the final MLP must end in one logit, got {list(final_arch_layer_sizes)}")
        self.embedding_bag_collection = embedding_bag_collection
        self.ts_length = ts_length
        self.dense_in_features = dense_in_features
        #: feature names, step-major: the tables' features of step 0, then of step 1, ...
        self.step_features = [c.feature_names[step] for step in range(steps) for c in configs]
        self.dense_arch = DenseArch(dense_in_features, list(dense_arch_layer_sizes))
        self.inter_arch = InteractionArch(num_sparse_features=len(configs))
        interactions = dim + (len(configs) + 1) * len(configs) // 2
        self.top_arch = MLP(interactions, list(top_arch_layer_sizes))
        out = top_arch_layer_sizes[-1]
        self.tsl_weight = nn.Parameter(torch.randn(out, out) * np.sqrt(2 / (out + out)))
        self.tsl_arch = _mlp_then_linear(ts_length, tsl_layer_sizes, ts_length)
        self.final_arch = _mlp_then_linear(2 * out, final_arch_layer_sizes[:-1], 1)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """Click logits ``(B, 1)`` of inputs with ``dense_features`` ``(B, steps * dense_in_features)``
        (step-major) and one id per feature and step."""
        batch, steps = dense_features.shape[0], self.ts_length + 1
        pooled = self.embedding_bag_collection(sparse_features).to_dict()
        # (B * steps, tables, dim): each step of each input is one row of DLRM's tower
        embedded = torch.stack([pooled[name] for name in self.step_features], dim=1)
        embedded = embedded.reshape(batch * steps, -1, embedded.shape[-1])
        dense = self.dense_arch(dense_features.reshape(batch * steps, self.dense_in_features))
        vectors = self.top_arch(self.inter_arch(dense, embedded)).reshape(batch, steps, -1)
        vectors = nn.functional.normalize(vectors, p=2, dim=2)  # the reference's projection onto the sphere
        history, target = vectors[:, :-1], vectors[:, -1]
        query = target @ self.tsl_weight.T @ self.tsl_weight  # A^T A w, as a row vector
        scores = torch.bmm(history, query.unsqueeze(2)).squeeze(2)
        weights = torch.sigmoid(self.tsl_arch(scores))
        context = torch.bmm(weights.unsqueeze(1), history).squeeze(1)
        return self.final_arch(torch.cat([context, target], dim=1))


def _mlp_then_linear(in_features: int, hidden: Sequence[int], out_features: int) -> nn.Module:
    """TorchRec's ``MLP`` (a ReLU after every layer) over ``hidden``, then a linear layer without
    activation: the reference's MLPs end in a sigmoid that the caller applies (or the loss does)."""
    layers = [MLP(in_features, list(hidden))] if hidden else []
    return nn.Sequential(*layers, nn.Linear(hidden[-1] if hidden else in_features, out_features))
