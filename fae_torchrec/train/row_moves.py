"""A re-plan that moves only the rows that change part, rank to rank, with their optimizer state.

The cold part keeps every row at its original id (``FAEEmbeddingBagCollection``), so a new hot set
changes no cold table's size and no cold row's place. :func:`move_rows`:

1. assembles on every rank, with one all-reduce per table and per-row tensor (weights, each optimizer
   state), the old hot part's rows and the rows entering it from the cold part: each rank adds the rows it
   holds (a data-parallel part's rank 0), into zeros elsewhere;
2. writes the rows leaving the hot part into their places in the cold part, each rank into its shards;
3. frees the old hot part and puts a split module of the new hot set in the model, with the cold part as
   it is (sharded) and a new hot part, which ``DistributedModelParallel`` shards by the new plan: DMP keeps
   a module that is sharded already (``_shard_modules_impl``) and collects the fused optimizers again, as
   its own ``reshard`` does; the dense layers' DDP is made anew over the same parameters;
4. loads the new hot part's rows, and carries the unfused optimizer's state over parameter by parameter.

Every value is copied, none recomputed, so training goes on exactly as if the rows had lived in their new
part from the start. Besides the model a rank holds the hot set's rows with their state, twice at most;
no table is copied, written or read whole. A new hot set with cold rows in a table the cold part lacks (one
entirely hot) is refused: the recipe keeps such a table entirely hot (:func:`kept_in_place`). With a
planned cold tier, whose host rows are the cold part, a re-plan goes through ``fae_torchrec.train.resplit``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.optim.keyed import KeyedOptimizer

from fae_torchrec.collectives import rank_and_world
from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection, part_key
from fae_torchrec.modules.state import assemble_full_tensor, copy_rows
from fae_torchrec.stats.hot_set import COLD, HOT, HotSet
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.resplit import (
    EMBEDDING_KEY,
    fae_module,
    free_tensors,
    is_fae_key,
    row_shapes,
    row_tensors,
)


@dataclass(frozen=True)
class RowMoves:
    """What :func:`move_rows` moved: rows leaving and entering the hot part, and the bytes of the rows
    (weights and optimizer state) every rank assembled."""

    leaving: int
    entering: int
    gathered_bytes: int


def moves_rows_in_place(model: nn.Module, hot_set: HotSet, has_cold_tier: bool) -> bool:
    """Whether :func:`move_rows` can move ``model``'s FAE module to ``hot_set``: its cold part keeps every
    table that has cold rows in ``hot_set``, and no planned cold tier holds the cold rows."""
    fae = fae_module(model)[1]
    with_cold = {
        c.name for c, ids in zip(hot_set.tables, hot_set.hot_ids, strict=True) if len(ids) < c.num_embeddings
    }
    return not has_cold_tier and fae.cold_slots is None and with_cold <= set(fae.cold_rows)


def kept_in_place(model: nn.Module, hot_set: HotSet) -> HotSet:
    """``hot_set`` with every table that ``model``'s cold part lacks (one entirely hot in it) kept entirely
    hot, so that the rows can move in place: a table entirely hot stays so across such re-plans (at most its
    rows more than ``hot_set``; such tables are those small enough for the budget to hold whole)."""
    fae = fae_module(model)[1]
    return HotSet(
        hot_set.tables,
        tuple(
            ids if c.name in fae.cold_rows else np.arange(c.num_embeddings)
            for c, ids in zip(hot_set.tables, hot_set.hot_ids, strict=True)
        ),
    )


def move_rows(
    model: DistributedModelParallel,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    hot_set: HotSet,
    plan: ShardingPlan,
    sharders: Sequence[ModuleSharder[nn.Module]],
    make_unfused: Callable[[DistributedModelParallel], KeyedOptimizer],
) -> tuple[DistributedModelParallel, KeyedOptimizer, RowMoves]:
    """``model`` (a DMP model holding one ``FAEEmbeddingBagCollection``) moved to ``hot_set`` (a
    collective: call it on every rank), see the module docstring. ``plan`` is a plan of the model split by
    ``hot_set`` (its cold part's entry is replaced by the one the cold part has), ``sharders`` DMP's,
    ``make_unfused`` makes the new model's unfused optimizer (as ``unfused_optimizer`` was made).
    Returns the new DMP model, its unfused optimizer and what moved; ``model`` and ``unfused_optimizer``
    cannot train afterwards. ``ValueError`` unless :func:`moves_rows_in_place`."""
    if not moves_rows_in_place(model, hot_set, False):
        raise ValueError(
            "the cold part lacks a table with cold rows in the new hot set: re-plan through the files"
        )
    path, fae = fae_module(model)
    prefix = f"{path}."
    names = embedding.row_state
    fused_state = model.fused_optimizer.state_dict()
    tensors = row_tensors(model.state_dict(), fused_state, unfused_optimizer, names, prefix, fae, None)
    shapes = row_shapes(tensors, fae, None)
    new_rows, moves = _new_hot_rows(fae, hot_set, tensors, shapes)
    model.fused_optimizer.load_state_dict(fused_state)  # the leaving rows' state, where it is a copy
    held = _unfused_state(unfused_optimizer, prefix)
    free_tensors([t for keyed in tensors.values() for key, t in keyed.items() if key.startswith(HOT)])
    inner, device = model.module, model.device
    wrapped = model._dmp_wrapped_module  # its DDP's hooks would reduce the dense gradients twice
    if isinstance(wrapped, DistributedDataParallel):
        wrapped._remove_autograd_hooks()
    new_fae = FAEEmbeddingBagCollection(
        fae.embedding_bag_configs(),
        hot_set,
        fae.is_weighted(),
        torch.device("meta"),
        cold_tables=fae.cold_rows,
    )
    if new_fae.hot is not None:
        embedding.apply(new_fae.hot)
    new_fae.cold = fae.cold
    parent, _, leaf = path.rpartition(".")
    setattr(inner.get_submodule(parent), leaf, new_fae)
    plan.plan[f"{prefix}{COLD}"] = model.plan.plan[f"{prefix}{COLD}"]
    del model, fae, tensors, wrapped
    dmp = DistributedModelParallel(inner, device=device, plan=plan, sharders=list(sharders))
    dense = make_unfused(dmp)
    _load_hot_rows(dmp, dense, names, prefix, new_fae, new_rows)
    _restore_unfused_state(dense, held, prefix)
    return dmp, dense, moves


def _new_hot_rows(
    fae: FAEEmbeddingBagCollection,
    hot_set: HotSet,
    tensors: dict[str, dict[str, torch.Tensor]],
    shapes: dict[str, dict[str, tuple[tuple[int, ...], str]]],
) -> tuple[dict[str, dict[str, torch.Tensor]], RowMoves]:
    """Per row name and table with hot rows in ``hot_set``, its new hot part's rows, on every rank; the
    rows leaving the hot part written into the cold part (``tensors``: this rank's per-row tensors)."""
    new_rows: dict[str, dict[str, torch.Tensor]] = {name: {} for name in tensors}
    leaving = entering = gathered = 0
    for config, old, new in zip(
        fae.embedding_bag_configs(), fae.hot_set().hot_ids, hot_set.hot_ids, strict=True
    ):
        stays = np.isin(new, old)
        goes = old[~np.isin(old, new)]
        comes = torch.from_numpy(new[~stays].astype(np.int64))
        # the assembled rows: the old hot part's, then those entering it
        where = np.searchsorted(old, new)
        where[~stays] = len(old) + np.arange(len(comes))
        hot_key, cold_key = (part_key(config.name, part) for part in (HOT, COLD))
        for name, keyed in tensors.items():
            shape, dtype = shapes[name][config.name]
            pieces = _held_pieces(keyed.get(hot_key), torch.arange(len(old)), 0, shape)
            pieces += _held_pieces(keyed.get(cold_key), comes, len(old), shape)
            rows = assemble_full_tensor((len(old) + len(comes), *shape), getattr(torch, dtype), pieces)
            gathered += rows.numel() * rows.element_size()
            if len(goes) and cold_key in keyed:  # a rank lists only the tables it holds shards of
                ids = torch.from_numpy(goes.astype(np.int64))
                _write_rows(keyed[cold_key], ids, rows[torch.from_numpy(np.searchsorted(old, goes))])
            if len(new):
                new_rows[name][config.name] = rows[torch.from_numpy(where)]
        leaving, entering = leaving + len(goes), entering + len(comes)
    return new_rows, RowMoves(leaving, entering, gathered)


def _held_pieces(
    tensor: torch.Tensor | None, rows: torch.Tensor, first: int, shape: tuple[int, ...]
) -> list[tuple[tuple, torch.Tensor]]:
    """Of rows ``rows`` (ascending) of a per-row tensor, those this rank adds to an assembly whose row
    ``first + i`` is ``rows[i]``: (where each sits, its values) for its shards, or all of a plain
    (data-parallel) tensor on rank 0 alone."""
    if tensor is None or not len(rows):
        return []
    if not isinstance(tensor, ShardedTensor):
        rank_zero = rank_and_world()[0] == 0
        return (
            [((slice(first, first + len(rows)),), tensor[rows].reshape(len(rows), *shape))]
            if rank_zero
            else []
        )
    pieces = []
    for shard in tensor.local_shards():
        low, high, row, columns = _in_shard(shard, rows)
        if low < high:
            pieces.append(((slice(first + low, first + high), *columns), shard.tensor[rows[low:high] - row]))
    return pieces


def _in_shard(shard, ids: torch.Tensor) -> tuple[int, int, int, tuple[slice, ...]]:
    """Of ``ids`` (ascending rows), those in a local ``shard``: ``ids[low:high]``; the shard's first row,
    and where its columns sit in a row."""
    row, *columns = shard.metadata.shard_offsets
    low, high = (int(i) for i in torch.searchsorted(ids, torch.tensor([row, row + shard.tensor.shape[0]])))
    return (
        low,
        high,
        row,
        tuple(slice(c, c + w) for c, w in zip(columns, shard.tensor.shape[1:], strict=True)),
    )


def _write_rows(tensor: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows`` into rows ``ids`` (ascending) of a per-row tensor: those of this rank's shards, or all
    of a plain tensor."""
    with torch.no_grad():
        if not isinstance(tensor, ShardedTensor):
            tensor[ids] = rows.reshape(len(ids), *tensor.shape[1:]).to(tensor.device)
            return
        for shard in tensor.local_shards():
            low, high, row, columns = _in_shard(shard, ids)
            if low < high:
                shard.tensor[ids[low:high] - row] = rows[(slice(low, high), *columns)].to(shard.tensor.device)


def _load_hot_rows(
    dmp: DistributedModelParallel,
    dense: KeyedOptimizer,
    names: dict[str, str],
    prefix: str,
    fae: FAEEmbeddingBagCollection,
    new_rows: dict[str, dict[str, torch.Tensor]],
) -> None:
    """Copy ``new_rows`` into the new hot part's weights and per-row optimizer state (fused or dense)."""
    fused_state = dmp.fused_optimizer.state_dict()
    tensors = row_tensors(dmp.state_dict(), fused_state, dense, names, prefix, fae, None)
    for name, keyed in tensors.items():
        for key, tensor in keyed.items():
            if key.startswith(HOT):
                copy_rows(tensor, 0, new_rows[name][fae.part_tables[key]])
    dmp.fused_optimizer.load_state_dict(fused_state)


def _unfused_state(optimizer: KeyedOptimizer, prefix: str) -> tuple[dict, torch.Tensor | None]:
    """The unfused optimizer's state by parameter, of the parameters outside the FAE module's hot part
    (dense layers, a cold part's data-parallel tables), and the latest step counter of the FAE module's
    data-parallel tables (None: none)."""
    hot = f"{EMBEDDING_KEY}{prefix}{HOT}."
    state = {
        param: dict(optimizer.state.get(param, {}))
        for key, param in optimizer.params.items()
        if not key.startswith(hot)
    }
    steps = [
        held["step"]
        for key, param in optimizer.params.items()
        if is_fae_key(key, prefix) and "step" in (held := optimizer.state.get(param, {}))
    ]
    return state, max(steps, key=float) if steps else None


def _restore_unfused_state(
    optimizer: KeyedOptimizer, held: tuple[dict, torch.Tensor | None], prefix: str
) -> None:
    """Copy the unfused state ``held`` into ``optimizer`` for the parameters both train, and its step
    counter into the new hot part's data-parallel tables' state."""
    by_param, step = held
    with torch.no_grad():
        for key, param in optimizer.params.items():
            current = optimizer.state.get(param, {})
            if param in by_param:
                for name, value in by_param[param].items():
                    current[name].copy_(value)
            elif is_fae_key(key, prefix) and "step" in current and step is not None:
                current["step"].copy_(step)
