"""Full (unsharded) state dicts in and out of modules sharded by ``DistributedModelParallel``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor


def load_full_state_dict(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors into ``module``'s state, each rank its own shards (plain tensors whole).

    Every rank must pass the same ``state_dict`` (for instance made under the same seed, or loaded
    from one checkpoint): each rank copies only the shards it holds. Raises ``KeyError`` naming the
    first entry of the module that ``state_dict`` lacks.
    """
    with torch.no_grad():
        for name, local in module.state_dict().items():
            if name not in state_dict:
                raise KeyError(f"state dict has no entry {name!r}")
            full = state_dict[name].detach()
            if isinstance(local, ShardedTensor):
                for shard in local.local_shards():
                    shard.tensor.copy_(full[_shard_index(shard)])
            else:
                local.copy_(full)


def gather_full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every entry of ``module``'s state as a full tensor on every rank (sharded entries assembled
    from all ranks' shards with one all-reduce each; a collective: call it on every rank)."""
    full = {}
    for name, local in module.state_dict().items():
        if isinstance(local, ShardedTensor):
            # assembled on the collective's device: NCCL reduces CUDA tensors only
            nccl = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
            tensor = torch.zeros(local.size(), dtype=local.dtype, device=device)
            for shard in local.local_shards():
                tensor[_shard_index(shard)] = shard.tensor.detach().to(device)
            dist.all_reduce(tensor)
            full[name] = tensor.cpu()
        else:
            full[name] = local.detach().cpu().clone()
    return full


def _shard_index(shard) -> tuple[slice, ...]:
    """Where a local shard sits in its full tensor."""
    return tuple(
        slice(offset, offset + size)
        for offset, size in zip(shard.metadata.shard_offsets, shard.tensor.shape, strict=True)
    )
