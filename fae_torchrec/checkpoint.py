"""Checkpoint and resume mid-epoch: model, fused and dense optimizer state, and the router position.

Each rank writes its own file with the shards it holds (``rank{r}.pt``); resuming needs the same world
size and plan, which ``collective_plan`` gives again for the same model, statistics and topology.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel


def save_checkpoint(
    directory: str | os.PathLike,
    model: DistributedModelParallel,
    dense_optimizer: torch.optim.Optimizer,
    position: dict,
    rank: int,
) -> None:
    """Write this rank's part of the training state; ``position`` says where to resume (such as
    ``{"epoch": e, "step": s}``, the next step to run, or a router's ``state_dict``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "model": _local(model.state_dict()),
        "fused_optimizer": _local(model.fused_optimizer.state_dict()),
        "dense_optimizer": dense_optimizer.state_dict(),
        "position": dict(position),
    }
    temporary = directory / f"rank{rank}.pt.tmp"
    torch.save(state, temporary)
    temporary.replace(directory / f"rank{rank}.pt")


def load_checkpoint(
    directory: str | os.PathLike,
    model: DistributedModelParallel,
    dense_optimizer: torch.optim.Optimizer,
    rank: int,
) -> dict:
    """Restore this rank's training state written by :func:`save_checkpoint`; return the position."""
    path = Path(directory) / f"rank{rank}.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no checkpoint for rank {rank}")
    state = torch.load(path, weights_only=False)
    with torch.no_grad():
        _restore(model.state_dict(), state["model"], str(path))
        fused = model.fused_optimizer.state_dict()
        _restore(fused, state["fused_optimizer"], str(path))
        model.fused_optimizer.load_state_dict(fused)
    dense_optimizer.load_state_dict(state["dense_optimizer"])
    return state["position"]


def _local(value: Any) -> Any:
    """``value`` with every ``ShardedTensor`` replaced by copies of this rank's shards."""
    if isinstance(value, ShardedTensor):
        return [shard.tensor.detach().cpu().clone() for shard in value.local_shards()]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _local(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_local(item) for item in value)
    return value


def _restore(current: Any, saved: Any, where: str, name: str = "") -> None:
    """Copy ``saved`` (from :func:`_local`) into the tensors of ``current`` in place."""
    if isinstance(current, ShardedTensor):
        shards = current.local_shards()
        if len(shards) != len(saved):
            raise ValueError(f"{where}: {name} has {len(saved)} saved shards, the model {len(shards)}")
        for shard, tensor in zip(shards, saved, strict=True):
            shard.tensor.copy_(tensor)
    elif isinstance(current, torch.Tensor):
        current.copy_(saved)
    elif isinstance(current, dict):
        missing = sorted(set(current) - set(saved), key=str)
        if missing:
            raise ValueError(f"{where}: no saved state for {name}{missing[0]}")
        for key, item in current.items():
            _restore(item, saved[key], where, f"{name}{key}.")
    elif isinstance(current, list | tuple):
        for index, item in enumerate(current):
            _restore(item, saved[index], where, f"{name}{index}.")
