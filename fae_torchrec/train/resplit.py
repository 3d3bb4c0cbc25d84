"""Rows moved between the hot and the cold part of a model in training, with their optimizer state.

A row move changes the sizes of both parts' tables, which TorchRec's ``DistributedModelParallel.reshard``
cannot do (it moves whole shards between ranks, keeping their sizes), so the move goes through the
unsplit layout on disk, and never through a second copy of the tables in memory:

1. :func:`spill_unsplit_state`: every rank writes the rows it holds of every FAE table, their weights
   and per-row optimizer state (FBGEMM's fused state of sharded parts, the dense form's state of
   data-parallel parts, a planned cold tier's host rows), into one ``.npy`` file per table and state at
   their original ids, a block of rows at a time. The other parameters' state (dense layers, other
   sharded modules) is kept in memory, as full tensors.
2. :func:`release_tables`: the old model's tables and their state are freed, so that the new model's
   shards take their place instead of adding to them.
3. The caller builds the model split by the new hot set, plans and shards it as it did the first one.
4. :func:`load_unsplit_state` reads the files a block of rows at a time into the rows each rank holds.

Every value is copied, none recomputed, so training goes on exactly as if the rows had lived in their
new part from the start. A rank's memory holds one model's tables and a block of rows; the files (the
tables with their state, once) lie in a folder every rank reads, as the partition does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.keyed import KeyedOptimizer

from fae_torchrec.collectives import all_gathered, on_every_rank, on_rank_zero
from fae_torchrec.data.npy_append import HEADER_BYTES, allocate_npy
from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection
from fae_torchrec.modules.state import copy_rows, gather_full_tensor, load_full_tensor, load_row_blocks
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.cold_tier import PlannedColdTier, check_cold_tier
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.step import find_fae_module
from fae_torchrec.units import format_bytes

#: The key prefix ``unfused_optimizer`` gives embedding tables in its ``CombinedOptimizer``.
EMBEDDING_KEY = "embedding."
#: The name of the weights among the per-row tensors (the others: the fused optimizer's state names).
WEIGHT = "weight"
#: Rows written at once, and the most bytes of a file mapped to write them.
SPILL_ROWS, SPILL_BYTES = 1 << 16, 16 << 20
#: Rows of a table read at once by :func:`load_unsplit_state`.
LOAD_ROWS = 1 << 18


@dataclass
class UnsplitState:
    """A model's training state in the unsplit layout: the FAE module's tables in files, the rest in
    memory as full tensors on the CPU.

    ``folder``: ``{name}/{table}.npy`` per table of the FAE module and per row name (``weight``, and
    each state name of FBGEMM's fused optimizer, such as ``momentum1``), rows at their original ids.
    ``files``: per row name and table, the row shape and dtype of its file.
    ``weights``: the model's state dict without the FAE module's entries.
    ``fused``: the fused optimizer's state of parameters outside the FAE module, by parameter and key.
    ``unfused``: the unfused optimizer's state of parameters outside the FAE module, by its key.
    ``step``: the dense form's step counter of data-parallel FAE tables (None when there is none).
    """

    path: str
    folder: Path
    files: dict[str, dict[str, tuple[tuple[int, ...], str]]]
    weights: dict[str, torch.Tensor]
    fused: dict[str, dict[str, torch.Tensor]]
    unfused: dict[str, dict[str, torch.Tensor]]
    step: torch.Tensor | None

    def nbytes(self) -> int:
        """Bytes of its tensors held in memory (on every rank during a move)."""
        groups = [self.weights, *self.fused.values(), *self.unfused.values()]
        return sum(t.numel() * t.element_size() for group in groups for t in group.values())

    def file_bytes(self) -> int:
        """Bytes of its files."""
        return sum(
            self.path_of(name, table).stat().st_size for name in self.files for table in self.files[name]
        )

    def path_of(self, name: str, table: str) -> Path:
        """The file of ``table``'s rows of ``name``."""
        return self.folder / name / f"{table}.npy"

    def read(self, name: str, table: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` of ``table``'s ``name`` (all of them by default), read into memory."""
        shape, dtype = self.files[name][table]
        width, item = int(np.prod(shape)), np.dtype(dtype).itemsize
        path = self.path_of(name, table)
        if stop is None:
            stop = (path.stat().st_size - HEADER_BYTES) // max(width * item, 1)
        rows = np.fromfile(
            path, dtype, count=(stop - start) * width, offset=HEADER_BYTES + start * width * item
        )
        return torch.from_numpy(rows.reshape(stop - start, *shape))

    def blocks(self, fae: FAEEmbeddingBagCollection) -> Iterator[tuple]:
        """``fae``'s tables a block of ``LOAD_ROWS`` rows at a time: (table, first row, rows by name)."""
        for config in fae.embedding_bag_configs():
            for start in range(0, config.num_embeddings, LOAD_ROWS):
                stop = min(start + LOAD_ROWS, config.num_embeddings)
                yield config, start, {name: self.read(name, config.name, start, stop) for name in self.files}

    def remove(self) -> None:
        """Delete the files: on rank 0 once every rank has read them, before any rank goes on (a
        collective)."""
        if dist.is_initialized():
            dist.barrier()
        on_rank_zero(lambda: shutil.rmtree(self.folder))


def spill_unsplit_state(
    model: DistributedModelParallel,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    folder: Path,
    cold_tier: PlannedColdTier | None = None,
) -> UnsplitState:
    """Write ``model``'s (a DMP model holding one ``FAEEmbeddingBagCollection``) training state in the
    unsplit layout: the FAE tables' rows into files in ``folder`` (each rank the rows it holds), the
    rest gathered into memory on every rank (a collective: call it on every rank). ``unfused_optimizer``
    is the model's ``unfused_optimizer``, ``embedding`` the embedding optimizer both forms run;
    ``cold_tier`` the model's planned cold tier, whose host rows are the cold rows (written back first)."""
    path, fae = fae_module(model, cold_tier)
    names = embedding.row_state  # refuses an optimizer whose state does not move row by row
    prefix = f"{path}."
    if cold_tier is not None:
        cold_tier.flush()
    local = model.state_dict()
    tensors = row_tensors(
        local, model.fused_optimizer.state_dict(), unfused_optimizer, names, prefix, fae, cold_tier
    )
    files = row_shapes(tensors, fae, cold_tier)
    state = UnsplitState(path, Path(folder), files, {}, {}, {}, None)

    num_rows = {config.name: config.num_embeddings for config in fae.embedding_bag_configs()}
    on_rank_zero(lambda: _allocate_files(state, num_rows))
    on_every_rank(lambda: _write_held_rows(state, tensors, fae, cold_tier))
    state.weights = {
        name: gather_full_tensor(value) for name, value in local.items() if not name.startswith(prefix)
    }
    for (parameter, key), value in _gather_fused_state(model, prefix).items():
        state.fused.setdefault(parameter, {})[key] = value
    steps = []
    for key, parameter in unfused_optimizer.params.items():
        held = unfused_optimizer.state.get(parameter, {})
        if is_fae_key(key, prefix):
            if "step" in held:
                steps.append(held["step"].detach().cpu().clone())
        else:
            state.unfused[key] = {name: value.detach().cpu().clone() for name, value in held.items()}
    state.step = max(steps, key=float) if steps else None
    return state


def _allocate_files(state: UnsplitState, num_rows: Mapping[str, int]) -> None:
    """``state``'s files, of ``num_rows`` rows per table; ``ValueError`` naming the folder where its disk
    has not the room (the files are written through mappings: a full disk would end the process)."""
    state.folder.mkdir(parents=True, exist_ok=True)
    needed = sum(
        num_rows[table] * int(np.prod(shape)) * np.dtype(dtype).itemsize
        for tables in state.files.values()
        for table, (shape, dtype) in tables.items()
    )
    free = shutil.disk_usage(state.folder).free
    if free < needed:
        raise ValueError(
            f"{state.folder}: a re-plan writes the tables with their optimizer state here, "
            f"{format_bytes(needed)}, and its disk has {format_bytes(free)} free"
        )
    for name, tables in state.files.items():
        (state.folder / name).mkdir(parents=True, exist_ok=True)
        for table, (shape, dtype) in tables.items():
            allocate_npy(state.path_of(name, table), np.dtype(dtype), (num_rows[table], *shape))


def release_tables(
    model: DistributedModelParallel,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    cold_tier: PlannedColdTier | None = None,
) -> None:
    """Free the memory of ``model``'s FAE tables and their per-row optimizer state (and ``cold_tier``'s
    host rows) once :func:`spill_unsplit_state` has written them, so that a new model's tables take their
    place: ``model`` cannot train afterwards. Memory that cannot be given back while the module lives
    (FBGEMM's unified memory on CUDA) is freed when the model is dropped."""
    path, fae = fae_module(model, cold_tier)
    tensors = row_tensors(
        model.state_dict(), model.fused_optimizer.state_dict(), unfused_optimizer, embedding.row_state,
        f"{path}.", fae, cold_tier,
    )  # fmt: skip
    held = [t for keyed in tensors.values() for t in keyed.values()]
    if cold_tier is not None:
        held += [rows for _, _, named in cold_tier.held_rows() for rows in named.values()]
    free_tensors(held)


def free_tensors(tensors: list[torch.Tensor]) -> None:
    """Free the memory of ``tensors`` (of a sharded tensor, its local shards): they hold nothing afterwards.
    Memory that cannot be given back while its module lives (FBGEMM's unified memory on CUDA) is kept."""
    for tensor in tensors:
        pieces = [s.tensor for s in tensor.local_shards()] if isinstance(tensor, ShardedTensor) else [tensor]
        for piece in pieces:
            try:
                piece.untyped_storage().resize_(0)
            except RuntimeError:  # a storage that cannot give its memory back while the module lives
                pass


def load_unsplit_state(
    model: DistributedModelParallel,
    unfused_optimizer: KeyedOptimizer,
    embedding: EmbeddingOptimizer,
    state: UnsplitState,
    cold_tier: PlannedColdTier | None = None,
) -> None:
    """Copy ``state`` into ``model`` (a DMP model holding an ``FAEEmbeddingBagCollection`` of the same
    tables at ``state.path``, split and sharded in any way) and its optimizers: each rank the rows it
    holds, read from ``state``'s files a block at a time; the cold rows into ``cold_tier``, the model's
    planned cold tier, if it has one (its slots emptied). Raises ``KeyError`` naming an entry of the
    model that ``state`` lacks."""
    path, fae = fae_module(model, cold_tier)
    if path != state.path:
        raise KeyError(f"the FAE module is at {path!r}, the state's at {state.path!r}")
    names = embedding.row_state
    prefix = f"{path}."
    local = model.state_dict()
    for name, value in local.items():
        if name.startswith(prefix):
            continue  # the parts' rows come from the files; the split's buffers are the new model's
        if name not in state.weights:
            raise KeyError(f"the state has no entry {name!r}")
        load_full_tensor(value, state.weights[name])
    fused_state = model.fused_optimizer.state_dict()
    tensors = row_tensors(local, fused_state, unfused_optimizer, names, prefix, fae, cold_tier)
    slots = {} if cold_tier is None else cold_tier.keys
    if cold_tier is not None:
        cold_tier.reset_rows()

    def copy(name: str, key: str, first: int, rows: torch.Tensor) -> None:
        if key in slots:
            assert cold_tier is not None  # slots come from it
            cold_tier.set_rows(slots[key], first, rows, name)
        elif key in tensors[name]:
            copy_rows(tensors[name][key], first, rows)

    load_row_blocks(fae, state.blocks(fae), copy)
    for parameter, entries in fused_state["state"].items():
        if not parameter.startswith(prefix):
            for key, value in entries.items():
                load_full_tensor(value, state.fused[parameter][key])
    model.fused_optimizer.load_state_dict(fused_state)
    with torch.no_grad():
        for key, parameter in unfused_optimizer.params.items():
            current = unfused_optimizer.state.get(parameter, {})
            if is_fae_key(key, prefix):
                if "step" in current and state.step is not None:
                    current["step"].copy_(state.step)
            else:
                if key not in state.unfused:
                    raise KeyError(f"the state has no optimizer state of {key!r}")
                for name, value in current.items():
                    value.copy_(state.unfused[key][name])


def row_tensors(
    local: Mapping[str, torch.Tensor],
    fused_state: Mapping,
    unfused_optimizer: KeyedOptimizer,
    names: Mapping[str, str],
    prefix: str,
    fae: FAEEmbeddingBagCollection,
    cold_tier: PlannedColdTier | None,
) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's per-row tensors of the FAE module's parts by row name and part weight (its name in
    the module's state dict): the weights from the model's state dict ``local``, the per-row optimizer
    state from the fused optimizer's ``fused_state`` (the tables this rank holds shards of) and from the
    dense form's state of data-parallel parts (whole, on every rank). A planned cold tier's slot tables
    are left out: its host rows hold the cold rows."""
    slots = set() if cold_tier is None else set(cold_tier.keys)
    parts = [key for key in fae.part_tables if key not in slots]
    tensors: dict[str, dict[str, torch.Tensor]] = {WEIGHT: {key: local[prefix + key] for key in parts}}
    tensors |= {name: {} for name in names}
    for parameter, entries in fused_state["state"].items():
        key = parameter.removeprefix(prefix)
        if parameter.startswith(prefix) and key not in slots:
            for entry, value in entries.items():  # keyed "{part table}.{state name}"
                tensors[entry.rsplit(".", 1)[1]][key] = value
    for key, parameter in unfused_optimizer.params.items():
        if is_fae_key(key, prefix):
            held = unfused_optimizer.state.get(parameter, {})
            for fused, dense in names.items():
                tensors[fused][key.removeprefix(EMBEDDING_KEY).removeprefix(prefix)] = held[dense]
    return tensors


def row_shapes(
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    fae: FAEEmbeddingBagCollection,
    cold_tier: PlannedColdTier | None,
) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    """Per row name and table, the row shape and dtype of its file, agreed by every rank (a collective:
    a rank lists only the tables it holds). A sharded tensor's rows give the shape; a plain one's (the
    dense form's) where no rank holds a sharded one, its lone column dropped (a row-wise state)."""
    part_tables = fae.part_tables
    mine: dict[tuple[str, str], tuple[bool, tuple[int, ...], str]] = {}
    for name, keyed in tensors.items():
        for key, value in keyed.items():
            sharded = isinstance(value, ShardedTensor)
            shape = tuple(value.size()[1:]) if sharded else tuple(value.shape[1:])
            if not sharded and name != WEIGHT and shape == (1,):
                shape = ()
            _prefer(mine, (name, part_tables[key]), (sharded, shape, _dtype_name(value)))
    if cold_tier is not None:
        for table, _, named in cold_tier.held_rows():
            for name, rows in named.items():
                _prefer(mine, (name, table), (True, tuple(rows.shape[1:]), _dtype_name(rows)))
    everyone = all_gathered(mine)
    agreed: dict[tuple[str, str], tuple[bool, tuple[int, ...], str]] = {}
    for held in everyone:
        for entry, described in held.items():
            _prefer(agreed, entry, described)
    files: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
    for (name, table), (_, shape, dtype) in sorted(agreed.items()):
        files.setdefault(name, {})[table] = (shape, dtype)
    return files


def _prefer(described: dict, entry: tuple[str, str], description: tuple[bool, tuple[int, ...], str]) -> None:
    """Keep ``description`` of ``entry`` unless one is kept already that a sharded tensor gave."""
    if entry not in described or (description[0] and not described[entry][0]):
        described[entry] = description


def _dtype_name(tensor: torch.Tensor) -> str:
    """``tensor``'s dtype as numpy names it."""
    return str(tensor.dtype).removeprefix("torch.")


def _write_held_rows(
    state: UnsplitState,
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    fae: FAEEmbeddingBagCollection,
    cold_tier: PlannedColdTier | None,
) -> None:
    """Write this rank's rows into ``state``'s files: its shards' rows, a plain (data-parallel) part's
    rows from rank 0 alone (every rank holds the same), and ``cold_tier``'s host rows."""
    first_rank = not dist.is_initialized() or dist.get_rank() == 0
    for name, keyed in tensors.items():
        for key, value in keyed.items():
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    row, *columns = shard.metadata.shard_offsets
                    widths = zip(columns, shard.tensor.shape[1:], strict=True)
                    index = tuple(slice(c, c + w) for c, w in widths)
                    _write_rows(state, name, fae, key, row, shard.tensor, index)
            elif first_rank:
                _write_rows(state, name, fae, key, 0, value, ())
    if cold_tier is not None:
        for table, first, named in cold_tier.held_rows():
            key = next(k for k, t in cold_tier.keys.items() if t == table)
            for name, rows in named.items():
                _write_rows(state, name, fae, key, first, rows, ())
    for name, tables in state.files.items():  # on disk, for ranks on other hosts to read
        for table in tables:
            descriptor = os.open(state.path_of(name, table), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def _write_rows(
    state: UnsplitState,
    name: str,
    fae: FAEEmbeddingBagCollection,
    key: str,
    first: int,
    rows: torch.Tensor,
    columns: tuple[slice, ...],
) -> None:
    """Write ``rows``, rows ``first:`` of ``fae``'s part weight ``key`` (their ``columns`` of the file's
    rows), at their original ids in the file of their table's ``name``, those that hold their row's
    values (``held_rows``: not a hot row's copy in the cold part): ``SPILL_ROWS`` at a time, each
    through mappings of ``SPILL_BYTES`` of the file at most (a page touched maps its neighbours too, so
    scattered rows could otherwise map much of the file into memory)."""
    table = fae.part_tables[key]
    shape, dtype = state.files[name][table]
    row_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    region_rows = max(1, SPILL_BYTES // row_bytes)
    for begin in range(0, len(rows), SPILL_ROWS):
        end = min(begin + SPILL_ROWS, len(rows))
        held, original = fae.held_rows(key, first + begin, first + end)
        if not len(held):
            continue
        ids = original.numpy()
        # a copy: numpy's view of a tensor would keep its memory from being freed (release_tables)
        values = rows[begin:end][held].detach().to("cpu", copy=True).numpy()
        if not columns:  # a whole row each: in the file's row shape
            values = values.reshape(len(ids), *shape)
        regions = np.flatnonzero(np.diff(ids // region_rows)) + 1
        for start, stop in zip(np.r_[0, regions], np.r_[regions, len(ids)], strict=True):
            low = int(ids[start]) // region_rows * region_rows
            high = min(low + region_rows, int(ids[stop - 1]) + 1)
            region = np.memmap(
                state.path_of(name, table), dtype, "r+", offset=HEADER_BYTES + low * row_bytes,
                shape=(high - low, *shape),
            )  # fmt: skip
            where: tuple[Any, ...] = (ids[start:stop] - low, *columns)
            region[where] = values[start:stop]
            del region


def _gather_fused_state(model: DistributedModelParallel, prefix: str) -> dict[tuple[str, str], torch.Tensor]:
    """The fused optimizer's state of every table outside the FAE module (``prefix``), full tensors by
    (parameter, key), on every rank (a collective). A rank's ``state_dict`` lists only the tables it holds
    shards of, so the ranks first share which entries exist, and then assemble each one in the same order."""
    local = {
        (parameter, key): value
        for parameter, entries in model.fused_optimizer.state_dict()["state"].items()
        if not parameter.startswith(prefix)
        for key, value in entries.items()
    }
    described = {name: (tuple(value.size()), value.dtype) for name, value in local.items()}
    everyone = all_gathered(described)
    entries = dict(sorted(kv for held in everyone for kv in held.items()))
    return {
        name: gather_full_tensor(local.get(name), torch.Size(size), dtype)
        for name, (size, dtype) in entries.items()
    }


def is_fae_key(key: str, prefix: str) -> bool:
    """Whether ``key`` of the unfused optimizer names a table of the FAE module (``prefix``)."""
    return key.startswith(EMBEDDING_KEY) and key.removeprefix(EMBEDDING_KEY).startswith(prefix)


def fae_module(
    model: nn.Module, cold_tier: PlannedColdTier | None = None
) -> tuple[str, FAEEmbeddingBagCollection]:
    """The FAE module in ``model`` and its place in the model's state-dict names; ``ValueError`` unless
    ``cold_tier`` is its planned cold tier, where it has one."""
    fae = find_fae_module(model)
    if fae is None:
        raise ValueError("the model holds no FAEEmbeddingBagCollection")
    check_cold_tier(model, cold_tier)
    inner = getattr(model, "module", model)  # DMP names its entries after the model it wraps
    return next(name for name, module in inner.named_modules() if module is fae), fae
