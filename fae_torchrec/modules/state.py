"""Full (unsharded) state dicts in and out of modules sharded by ``DistributedModelParallel``, and
initial tables made where they live."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection
from fae_torchrec.stats.hot_set import COLD
from fae_torchrec.torchrec_compat import ShardedTensor

#: Rows of a table made at once by :func:`load_initial_tables`, each block from its own seed.
INIT_BLOCK_ROWS = 1 << 20


def load_full_state_dict(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors into ``module``'s state, each rank its own shards (plain tensors whole).

    Every rank must pass the same ``state_dict`` (for instance made under the same seed, or loaded
    from one checkpoint): each rank copies only the shards it holds. Raises ``KeyError`` naming the
    first entry of the module that ``state_dict`` lacks.
    """
    for name, local in module.state_dict().items():
        if name not in state_dict:
            raise KeyError(f"state dict has no entry {name!r}")
        load_full_tensor(local, state_dict[name])


def load_full_tensor(local: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``local``: its shards this rank holds for a ``ShardedTensor``
    (``full`` reshaped to its size first), all of it for a plain tensor."""
    with torch.no_grad():
        full = full.detach()
        if isinstance(local, ShardedTensor):
            full = full.reshape(local.size())
            for shard in local.local_shards():
                shard.tensor.copy_(full[_shard_index(shard)])
        else:
            local.copy_(full.reshape(local.shape))


def gather_full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every entry of ``module``'s state as a full tensor on every rank (sharded entries assembled
    from all ranks' shards with one all-reduce each; a collective: call it on every rank)."""
    return {name: gather_full_tensor(local) for name, local in module.state_dict().items()}


def gather_full_tensor(
    local: torch.Tensor | None, size: torch.Size | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``local`` as a full tensor on the CPU, on every rank: a ``ShardedTensor`` assembled from all
    ranks' shards with one all-reduce (a collective: call it on every rank), a plain tensor copied.
    None: this rank holds nothing of a sharded tensor of ``size`` and ``dtype`` that others hold
    (a fused optimizer's state lists only the tables a rank has shards of)."""
    if local is not None and not isinstance(local, ShardedTensor):
        return local.detach().cpu().clone()
    if local is not None:
        size, dtype = local.size(), local.dtype
    if size is None or dtype is None:
        raise ValueError("a rank that holds no shard of a sharded tensor needs its size and dtype")
    shards = [] if local is None else local.local_shards()
    return assemble_full_tensor(size, dtype, [(_shard_index(shard), shard.tensor) for shard in shards])


def assemble_full_tensor(
    size: Sequence[int], dtype: torch.dtype, pieces: Sequence[tuple[tuple[slice, ...], torch.Tensor]]
) -> torch.Tensor:
    """A full tensor of ``size`` on the CPU, on every rank, from each rank's ``pieces`` (where each sits
    in it, its values): zeros elsewhere, summed over the ranks with one all-reduce (a collective: call
    it on every rank; each element held by one rank)."""
    # assembled on the collective's device: NCCL reduces CUDA tensors only
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    tensor = torch.zeros(tuple(size), dtype=dtype, device=device)
    for index, piece in pieces:
        tensor[index] = piece.detach().to(device)
    dist.all_reduce(tensor)
    return tensor.cpu()


def load_initial_tables(module: nn.Module, tables: Sequence[EmbeddingBagConfig], seed: int) -> None:
    """Set every table of ``module`` to its initial weights, a block of rows at a time, straight
    into the rows this rank holds: no full copy of the tables is made.

    ``module`` is an ``EmbeddingBagCollection`` or an ``FAEEmbeddingBagCollection`` (whose parts get
    each row where it lives; the cold rows of one built with ``cold_slots`` are its planned cold tier's:
    ``PlannedColdTier.load_initial_tables``), sharded by ``DistributedModelParallel`` (build it on the
    ``meta`` device, so that the only copy of the tables is the shards) or not. Every rank and both
    layouts (FAE and the unsplit baseline) get the same tables (:func:`initial_blocks`).
    """
    state = module.state_dict()
    slots = isinstance(module, FAEEmbeddingBagCollection) and module.cold_slots is not None

    def copy(name: str, key: str, first: int, rows: torch.Tensor) -> None:
        if not (slots and key.startswith(COLD)):
            copy_rows(state[key], first, rows)

    load_row_blocks(
        module,
        ((config, start, {"weight": rows}) for config, start, rows in initial_blocks(tables, seed)),
        copy,
    )


def load_row_blocks(
    module: nn.Module,
    blocks: Iterable[tuple[EmbeddingBagConfig, int, Mapping[str, torch.Tensor]]],
    copy: Callable[[str, str, int, torch.Tensor], None],
) -> None:
    """Hand each block of rows of the original tables to where ``module`` keeps them: ``blocks`` gives
    (table, first row, per name its rows: weights, or an optimizer's per-row state), and ``copy(name,
    key, first, rows)`` is called per part holding any of them (``key``: the part weight's name in
    ``module``'s state dict, ``first``: the part row of the first of ``rows``). ``module`` is an
    ``FAEEmbeddingBagCollection`` (rows split between its parts) or an ``EmbeddingBagCollection``."""
    with torch.no_grad():
        for config, start, named in blocks:
            stop = start + len(next(iter(named.values())))
            ranges: Sequence[tuple[str, int, torch.Tensor | slice]]
            if isinstance(module, FAEEmbeddingBagCollection):
                ranges = module.row_ranges(config.name, start, stop)
            else:
                ranges = [(f"embedding_bags.{config.name}.weight", start, slice(None))]
            for key, first, chosen in ranges:
                for name, rows in named.items():
                    copy(name, key, first, rows[chosen])


def initial_blocks(
    tables: Sequence[EmbeddingBagConfig], seed: int
) -> Iterator[tuple[EmbeddingBagConfig, int, torch.Tensor]]:
    """Every table's initial weights, a block of ``INIT_BLOCK_ROWS`` rows at a time: (table, first row,
    rows). A block is drawn by the table's ``init_fn`` under a seed made of ``seed``, the table's index
    and the block's, so that any rank draws the same rows."""
    for index, config in enumerate(tables):
        for start in range(0, config.num_embeddings, INIT_BLOCK_ROWS):
            stop = min(start + INIT_BLOCK_ROWS, config.num_embeddings)
            rows = torch.empty(stop - start, config.embedding_dim, dtype=torch.float32)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(np.random.SeedSequence([seed, index, start]).generate_state(1)[0]))
                config.init_fn(rows)
            yield config, start, rows


def copy_rows(local: torch.Tensor, first: int, rows: torch.Tensor) -> None:
    """Copy ``rows`` into rows ``first:`` of a per-row tensor (a table's weight, or an optimizer's
    per-row state): the parts of them in this rank's shards (any row and column offsets) for a
    ``ShardedTensor``, all of them for a plain tensor (``rows`` reshaped to its rows' shape: the dense
    form of a row-wise state has a column the fused form has not)."""
    with torch.no_grad():
        if not isinstance(local, ShardedTensor):
            local[first : first + len(rows)].copy_(rows.reshape(len(rows), *local.shape[1:]))
            return
        for shard in local.local_shards():
            row, *columns = shard.metadata.shard_offsets
            height = shard.tensor.shape[0]
            begin, end = max(first, row), min(first + len(rows), row + height)
            if begin < end:
                widths = zip(columns, shard.tensor.shape[1:], strict=True)
                index = (slice(begin - first, end - first), *(slice(c, c + w) for c, w in widths))
                shard.tensor[begin - row : end - row].copy_(rows[index])


def _shard_index(shard) -> tuple[slice, ...]:
    """Where a local shard sits in its full tensor."""
    return tuple(
        slice(offset, offset + size)
        for offset, size in zip(shard.metadata.shard_offsets, shard.tensor.shape, strict=True)
    )
