"""Train every parameter of a TorchRec model exactly once: fused tables in backward, the rest by step.

``apply_optimizer_in_backward`` gives embedding tables a fused (FBGEMM) optimizer, but TorchRec drops
it for a table it shards data-parallel: such a table gets ``.grad`` like a dense layer and stays at its
initial values unless an ordinary optimizer steps it. :class:`EmbeddingOptimizer` is the embedding
optimizer in both forms, with the same rule and hyperparameters, and :func:`unfused_optimizer` builds
the optimizer of every parameter that no fused optimizer trains, so that a data-parallel table (a
small table, or FAE's hot part) trains as the same rows would in a fused table.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torchrec
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
)
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from fae_torchrec.command_line import OPTIMIZER_NAMES

logger = logging.getLogger(__name__)

#: TorchRec's placeholders for fused optimizers, and the optimizers that run the same rule on a dense
#: gradient (``torchrec.optim.RowWiseAdagrad`` and ``torch.optim`` classes run as they are).
DENSE_COUNTERPARTS: dict[type[torch.optim.Optimizer], type[torch.optim.Optimizer]] = {
    torchrec.optim.SGD: torch.optim.SGD,
    torchrec.optim.Adagrad: torch.optim.Adagrad,
    torchrec.optim.Adam: torch.optim.Adam,
}
#: Embedding optimizers by the name the command line and the examples give them.
EMBEDDING_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = dict(
    zip(
        OPTIMIZER_NAMES,
        (torch.optim.SGD, torch.optim.Adagrad, torchrec.optim.RowWiseAdagrad, torch.optim.Adam),
        strict=True,
    )
)
#: Per dense optimizer class, its per-row state by the name of the same state in FBGEMM's fused form
#: (a table's rows move between the two forms when FAE re-plans: ``fae_torchrec.train.resplit``).
ROW_STATE: dict[type[torch.optim.Optimizer], dict[str, str]] = {
    torch.optim.SGD: {},
    torch.optim.Adagrad: {"momentum1": "sum"},
    torchrec.optim.RowWiseAdagrad: {"momentum1": "sum"},
}
#: Dense optimizers that move a row whose gradient is zero (SGD, Adagrad and RowWiseAdagrad do not).
MOVES_UNUSED_ROWS = (torch.optim.Adam,)
#: FBGEMM's ``eps`` when none is given (``torch.optim`` defaults to another one).
FBGEMM_EPS: float = inspect.signature(SplitTableBatchedEmbeddingBagsCodegen).parameters["eps"].default


@dataclass(frozen=True)
class EmbeddingOptimizer:
    """An embedding optimizer: its class (``torch.optim.SGD``, ``torch.optim.Adagrad``,
    ``torchrec.optim.RowWiseAdagrad``, a ``torchrec.optim`` placeholder, ...) and keyword arguments.

    ``kwargs`` are completed with FBGEMM's defaults where ``torch.optim`` has others (``eps``), so
    that the fused and the dense form compute the same update.
    """

    optimizer_class: type[torch.optim.Optimizer]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        accepted = inspect.signature(self.dense_class).parameters
        completed = {"eps": FBGEMM_EPS} if "eps" in accepted else {}
        object.__setattr__(self, "kwargs", {**completed, **self.kwargs})
        if self.dense_class in MOVES_UNUSED_ROWS or self.kwargs.get("weight_decay"):
            logger.warning(
                "%s%s: the dense form moves rows no batch used (momentum or weight decay), FBGEMM's "
                "fused form only the rows a batch used; a data-parallel table then trains otherwise "
                "than a fused one, and FAE's model differs from the baseline's",
                self.optimizer_class.__name__,
                " with weight_decay" if self.kwargs.get("weight_decay") else "",
            )

    @property
    def dense_class(self) -> type[torch.optim.Optimizer]:
        """The optimizer class that steps a parameter with a dense ``.grad`` by the same rule."""
        return DENSE_COUNTERPARTS.get(self.optimizer_class, self.optimizer_class)

    def apply(self, module: nn.Module) -> None:
        """Attach the fused optimizer to every parameter of ``module`` (before planning and DMP)."""
        # TorchRec keeps (and mutates) the dict it is given: each call gets its own copy
        apply_optimizer_in_backward(self.optimizer_class, module.parameters(), dict(self.kwargs))

    @property
    def row_state(self) -> dict[str, str]:
        """The dense form's per-row state by its fused form's name (``ROW_STATE``); ``ValueError``
        for an optimizer whose state cannot move between the forms row by row."""
        if self.dense_class not in ROW_STATE or self.kwargs.get("lr_decay"):
            raise ValueError(
                f"{self.optimizer_class.__name__}{' with lr_decay' if self.kwargs.get('lr_decay') else ''}: "
                f"rows cannot move between the hot and cold part with their optimizer state; use "
                f"{', '.join(c.__name__ for c in ROW_STATE)} (without lr_decay)"
            )
        return ROW_STATE[self.dense_class]

    def dense(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The dense form over ``params``."""
        return self.dense_class(params, **self.kwargs)


def unfused_optimizer(
    model: nn.Module,
    embedding: EmbeddingOptimizer,
    dense: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
) -> CombinedOptimizer:
    """The optimizer of every parameter of ``model`` that no fused optimizer trains.

    Embedding tables without one (TorchRec's data-parallel tables, in any embedding module) get
    ``embedding.dense``; every other such parameter (dense layers) gets ``dense``. Parameters with a
    fused optimizer are left to it, so each parameter is trained exactly once. Returns a TorchRec
    ``CombinedOptimizer`` (keys ``embedding.NAME`` and ``dense.NAME``) to ``zero_grad``, ``step`` and
    checkpoint as one.
    """
    embedding_ids = {
        id(param)
        for module in model.modules()
        if isinstance(module, ShardedModule | EmbeddingBagCollectionInterface | EmbeddingCollectionInterface)
        for param in module.parameters()
    }
    unfused = dict(in_backward_optimizer_filter(model.named_parameters()))
    groups = {
        "embedding": (
            {n: p for n, p in unfused.items() if id(p) in embedding_ids},
            embedding.dense,
        ),
        "dense": ({n: p for n, p in unfused.items() if id(p) not in embedding_ids}, dense),
    }
    return CombinedOptimizer(
        [(key, KeyedOptimizerWrapper(params, factory)) for key, (params, factory) in groups.items() if params]
    )
