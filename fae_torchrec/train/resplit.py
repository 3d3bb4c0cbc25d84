"""Rows moved between the hot and the cold part of a model in training, with their optimizer state.

A row move changes the sizes of both parts' tables, which TorchRec's ``DistributedModelParallel.reshard``
cannot do (it moves whole shards between ranks, keeping their sizes), so the move goes through full
tensors: :func:`gather_unsplit_state` assembles, on every rank, the model's weights and the per-row
optimizer state of every FAE table in the original (unsplit) layout: FBGEMM's fused state of the sharded
parts and the dense form's state of data-parallel parts alike. The caller builds the model split by the
new hot set, plans and shards it as it did the first one, and :func:`load_unsplit_state` copies into it
the rows each rank holds. Every value is copied, none recomputed, so training goes on exactly as if the
rows had lived in their new part from the start. The other parameters' state (dense layers, other
sharded modules) is carried over by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torchrec.optim.keyed import KeyedOptimizer

from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection
from fae_torchrec.modules.state import gather_full_tensor, load_full_tensor
from fae_torchrec.train.cold_tier import PlannedColdTier, check_cold_tier
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.step import find_fae_module

#: The key prefix ``unfused_optimizer`` gives embedding tables in its ``CombinedOptimizer``.
_EMBEDDING_KEY = "embedding."


@dataclass
class UnsplitState:
    """A model's training state as full tensors on the CPU, the FAE module's tables in the unsplit layout.

    ``weights``: the model's state dict, the FAE module's entries replaced by a plain EBC's
    (``{path}.embedding_bags.{table}.weight``, ``path`` the module's place in the model).
    ``row_state``: per state name of FBGEMM's fused optimizer (``momentum1``), the FAE tables' per-row
    state keyed as their weights (rows first, then the state's own shape).
    ``fused``: the fused optimizer's state of parameters outside the FAE module, by parameter and key.
    ``unfused``: the unfused optimizer's state of parameters outside the FAE module, by its key.
    ``step``: the dense form's step counter of data-parallel FAE tables (None when there is none).
    """

    path: str
    weights: dict[str, torch.Tensor]
    row_state: dict[str, dict[str, torch.Tensor]]
    fused: dict[str, dict[str, torch.Tensor]]
    unfused: dict[str, dict[str, torch.Tensor]]
    step: torch.Tensor | None

    def nbytes(self) -> int:
        """Bytes of its tensors (what every rank holds during a move)."""
        groups = [self.weights, *self.row_state.values(), *self.fused.values(), *self.unfused.values()]
        return sum(t.numel() * t.element_size() for group in groups for t in group.values())


def gather_unsplit_state(
    model: nn.Module,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    cold_tier: PlannedColdTier | None = None,
) -> UnsplitState:
    """``model``'s (a DMP model holding one ``FAEEmbeddingBagCollection``) training state in the unsplit
    layout, on every rank (a collective: call it on every rank). ``unfused_optimizer`` is the model's
    ``unfused_optimizer``, ``embedding`` the embedding optimizer both forms run; ``cold_tier`` the
    model's planned cold tier, whose host rows are the cold rows (written back first)."""
    path, fae = _fae_module(model, cold_tier)
    names = embedding.row_state  # refuses an optimizer whose state does not move row by row
    prefix = f"{path}."
    full = {name: gather_full_tensor(local) for name, local in model.state_dict().items()}
    held: dict[str, dict[str, torch.Tensor]] = {}
    if cold_tier is not None:  # the cold rows in place of the slots
        cold_tier.flush()
        held = {
            name: {prefix + key: rows for key, rows in tensors.items()}
            for name, tensors in cold_tier.gather_cold_state().items()
        }
        full |= held.pop("weight")
    weights = {name: value for name, value in full.items() if not name.startswith(prefix)}
    weights |= {prefix + name: value for name, value in fae.ebc_state_dict(full, prefix).items()}
    part_state: dict[str, dict[str, torch.Tensor]] = {fused: {} for fused in names}
    fused_other: dict[str, dict[str, torch.Tensor]] = {}
    for (parameter, key), value in _gather_fused_state(model).items():
        if parameter.startswith(prefix):  # keyed "{part table}.{state name}"
            name = key.rsplit(".", 1)[1]
            part_state[name][parameter] = held.get(name, {}).get(parameter, value)
        else:
            fused_other.setdefault(parameter, {})[key] = value
    unfused, steps = {}, []
    for key, parameter in unfused_optimizer.params.items():
        state = unfused_optimizer.state.get(parameter, {})
        fqn = key.removeprefix(_EMBEDDING_KEY)
        if key.startswith(_EMBEDDING_KEY) and fqn.startswith(prefix):
            for fused, dense in names.items():
                part_state[fused][fqn] = state[dense].detach().cpu().clone()
            if "step" in state:
                steps.append(state["step"].detach().cpu().clone())
        else:
            unfused[key] = {name: value.detach().cpu().clone() for name, value in state.items()}
    row_state = {}
    for fused, parts in part_state.items():
        # each part's state in the fused form's shape (the dense form of a row-wise state has a column)
        shaped = {name: value.reshape(len(value), -1).squeeze(1) for name, value in parts.items()}
        row_state[fused] = {
            prefix + name: value for name, value in fae.ebc_state_dict(shaped, prefix).items()
        }
    step = max(steps, key=float) if steps else None
    return UnsplitState(path, weights, row_state, fused_other, unfused, step)


def load_unsplit_state(
    model: nn.Module,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    state: UnsplitState,
    cold_tier: PlannedColdTier | None = None,
) -> None:
    """Copy ``state`` into ``model`` (a DMP model holding an ``FAEEmbeddingBagCollection`` of the same
    tables at ``state.path``, split and sharded in any way) and its optimizers: each rank the rows it
    holds; the cold rows into ``cold_tier``, the model's planned cold tier, if it has one (its slots
    emptied). Raises ``KeyError`` naming an entry of the model that ``state`` lacks."""
    path, fae = _fae_module(model, cold_tier)
    if path != state.path:
        raise KeyError(f"the FAE module is at {path!r}, the state's at {state.path!r}")
    names = embedding.row_state
    prefix = f"{path}."
    tables = {
        name.removeprefix(prefix): value for name, value in state.weights.items() if name.startswith(prefix)
    }
    parts = {prefix + name: value for name, value in fae.split_state(tables).items()}
    slots = set() if cold_tier is None else {prefix + key for key in cold_tier.keys}
    for name, local in model.state_dict().items():
        if name.startswith(prefix) and (name not in parts or name in slots):
            continue  # the split's own buffers (which rows are hot): the new model's; the tier's rows
        if name not in parts and name not in state.weights:
            raise KeyError(f"the state has no entry {name!r}")
        load_full_tensor(local, parts[name] if name in parts else state.weights[name])
    row_parts = {
        fused: {prefix + name: value for name, value in fae.split_state(_local_keys(rows, prefix)).items()}
        for fused, rows in state.row_state.items()
    }
    if cold_tier is not None:
        cold = {"weight": parts, **row_parts}
        cold_tier.load_cold_state({n: {k: cold[n][prefix + k] for k in cold_tier.keys} for n in cold})
    fused_state = model.fused_optimizer.state_dict()
    for parameter, entries in fused_state["state"].items():
        for key, local in entries.items():
            if parameter in slots:
                continue
            if parameter.startswith(prefix):
                load_full_tensor(local, row_parts[key.rsplit(".", 1)[1]][parameter])
            else:
                load_full_tensor(local, state.fused[parameter][key])
    model.fused_optimizer.load_state_dict(fused_state)
    with torch.no_grad():
        for key, parameter in unfused_optimizer.params.items():
            current = unfused_optimizer.state.get(parameter, {})
            fqn = key.removeprefix(_EMBEDDING_KEY)
            if key.startswith(_EMBEDDING_KEY) and fqn.startswith(prefix):
                for fused, dense in names.items():
                    load_full_tensor(current[dense], row_parts[fused][fqn])
                if "step" in current and state.step is not None:
                    current["step"].copy_(state.step)
            else:
                if key not in state.unfused:
                    raise KeyError(f"the state has no optimizer state of {key!r}")
                for name, value in current.items():
                    value.copy_(state.unfused[key][name])


def _gather_fused_state(model: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """The fused optimizer's state of every table, full tensors by (parameter, key), on every rank (a
    collective). A rank's ``state_dict`` lists only the tables it holds shards of, so the ranks first
    share which entries exist, and then assemble each one in the same order."""
    local = {
        (parameter, key): value
        for parameter, entries in model.fused_optimizer.state_dict()["state"].items()
        for key, value in entries.items()
    }
    described = {name: (tuple(value.size()), value.dtype) for name, value in local.items()}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, described)
    entries = dict(sorted(kv for held in everyone for kv in held.items()))
    return {
        name: gather_full_tensor(local.get(name), torch.Size(size), dtype)
        for name, (size, dtype) in entries.items()
    }


def _local_keys(rows: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``rows`` keyed as in the FAE module (``prefix`` taken off)."""
    return {name.removeprefix(prefix): value for name, value in rows.items()}


def _fae_module(model: nn.Module, cold_tier: PlannedColdTier | None) -> tuple[str, FAEEmbeddingBagCollection]:
    """The FAE module in ``model`` and its place in the model's state-dict names; ``ValueError`` unless
    ``cold_tier`` is its planned cold tier, where it has one."""
    fae = find_fae_module(model)
    if fae is None:
        raise ValueError("the model holds no FAEEmbeddingBagCollection")
    check_cold_tier(model, cold_tier)
    inner = getattr(model, "module", model)  # DMP names its entries after the model it wraps
    return next(name for name, module in inner.named_modules() if module is fae), fae
