"""Full (unsharded) state dicts in and out of modules sharded by ``DistributedModelParallel``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor


def load_full_state_dict(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors into ``module``'s state, each rank its own shards (plain tensors whole).

    Raises ``KeyError`` naming the first entry of the module that ``state_dict`` lacks.
    """
    with torch.no_grad():
        for name, local in module.state_dict().items():
            if name not in state_dict:
                raise KeyError(f"state dict has no entry {name!r}")
            full = state_dict[name].detach()
            if isinstance(local, ShardedTensor):
                for shard in local.local_shards():
                    index = tuple(
                        slice(offset, offset + size)
                        for offset, size in zip(shard.metadata.shard_offsets, shard.tensor.shape, strict=True)
                    )
                    shard.tensor.copy_(full[index])
            else:
                local.copy_(full)
