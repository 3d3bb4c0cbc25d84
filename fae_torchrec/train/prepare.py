"""FAE's offline step on every rank at once: one rank profiles the training data and writes its hot/cold
partition, every rank then opens it.

Profiling and partitioning stream the whole data set once; doing it on every rank would read it
``world_size`` times and could write the partition from several processes. Rank 0 does it, broadcasts the
statistics and the validation inputs, and every rank memory-maps the partition (it reads only its own
batches). A problem found on rank 0 is raised on every rank, so no rank waits for a collective that the
others left.

The data is a ``BlockSource`` (read by rank 0 alone), or what a TorchRec script trains on: an iterable of
``Batch``es, which each rank reads once into a spool beside the partition (``fae_torchrec.data.batches``),
so that rank 0 profiles and partitions the inputs of every rank, in rank order. Either way the
partition's directory must be one that every rank reads and writes: on several nodes, a shared file
system.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from tqdm import tqdm

from fae_torchrec.data.batches import BatchSource, spool_batches
from fae_torchrec.data.block import SampleBlock, rebatch
from fae_torchrec.data.source import BlockSource
from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.stats.profiler import AccessProfiler
from fae_torchrec.train.partition import HotColdPartition

#: Inputs per block while the data streams past.
BLOCK = 4096
#: The folder of ``prepare_data``'s directory where each rank spools its ``Batch``es (removed once the
#: partition is written).
SPOOLS = "batches"
T = TypeVar("T")
#: The parameters of :func:`prepare_data` its messages name (``names`` may rename them).
NAMED_PARAMETERS = ("sample", "batch_size", "val_every", "exclude_profiled", "stats")


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_data` gives every rank: the profile's statistics, the validation inputs (all
    of them, on every rank; None when none was asked for), the training inputs split into hot and
    cold, and the hot set they were split by: build the ``FAEEmbeddingBagCollection`` from it (a split
    module of another hot set refuses the partition's batches)."""

    stats: AccessStats
    validation: SampleBlock | None
    partition: HotColdPartition
    hot_set: HotSet


def prepare_data(
    source: BlockSource | Iterable[Batch],
    tables: Sequence[EmbeddingBagConfig],
    directory: str | os.PathLike,
    *,
    sample: float = 0.05,
    batch_size: int,
    hot_budget: int | None,
    optimizer_class: type[torch.optim.Optimizer] | None = None,
    stats: AccessStats | None = None,
    num_batches: int | None = None,
    each_rank: bool | None = None,
    val_every: int | None = 0,
    balance: float = 0.0,
    seed: int = 0,
    exclude_profiled: bool = False,
    names: Mapping[str, str] | None = None,
    progress: bool = False,
) -> PreparedData:
    """Profile ``sample`` of ``source``'s training inputs (5% by default, as FAE does for DLRM), choose
    the hot set of ``hot_budget`` bytes (None: no hot row, a baseline's partition, all cold) and write
    the partition of the training inputs to ``directory``; collective over the default process group
    when one is initialised.

    ``source`` is a ``BlockSource``, read on rank 0 alone, or an iterable of TorchRec ``Batch``es (a
    ``DataLoader``, a ``RandomRecDataset``), read once, its first ``num_batches`` batches (None: until it
    ends; an endless dataset needs it), into ``directory/batches/rank-R`` (removed once the partition is
    written): on every rank, each rank's batches its own share of the data (``each_rank``, the default for
    batches), or on rank 0 alone (``each_rank=False``: the other ranks' iterables are not read). Rank 0
    profiles and partitions the inputs of the ranks read, in rank order. ``directory`` must be readable
    and writable by every rank (on several nodes, a shared file system): a rank that cannot open the
    partition (or, for rank 0, another rank's batches) raises ``ValueError`` on every rank naming the
    rank, its host and the path. A ``Batch`` that does not fit (jagged or weighted features, other keys
    than ``tables``' feature names, labels other than 0 and 1, dense values that are not finite) raises
    ``ValueError`` on every rank naming the rank, the batch and the feature or column
    (``fae_torchrec.data.batches``).

    A hot row costs its weights and its ``optimizer_class`` state (``AccessStats.hot_set``; None: SGD's,
    none): give the embedding optimizer the model trains with (``torchrec.optim.RowWiseAdagrad``, a
    ``torch.optim`` class, a value of ``fae_torchrec.train.EMBEDDING_OPTIMIZERS``), as to
    ``FAEShardingPlanner``, so that the budget counts what the planner counts. ``stats``: the statistics
    of a profile made before (``fae-torchrec profile``'s file, ``AccessStats.load``) of these training
    inputs, to choose the hot set from instead of profiling here; ``ValueError`` when they count another
    number of training inputs.

    Every ``val_every``-th input is held out for validation (0, the default: none, every input trains;
    None: the source's own split, such as TBSM's by time). With ``exclude_profiled`` the partition holds
    only the inputs the profile did not sample, so that what training measures comes from inputs
    disjoint from those that chose the hot set. ``balance`` and ``seed`` are
    :meth:`HotColdPartition.write`'s. Raises ``ValueError`` when there is no training input, no
    validation input where some were asked for, or fewer training inputs than one ``batch_size`` on
    every rank (a smaller batch would train, but not the batch that was planned); nothing is written
    then. The messages name the data and these parameters as ``names`` says (such as
    ``{"data": "--data train.txt", "batch_size": "--batch-size"}``), else as "the data" and by their own
    names. ``progress`` draws bars while reading, profiling and partitioning. Raises ``TypeError``, on
    every rank before any collective, when ``source`` is neither (such as a path)."""
    blocks = _agree_on_source(source, num_batches, each_rank)
    if blocks and (num_batches is not None or each_rank):
        raise ValueError(
            "num_batches and each_rank are for an iterable of Batches; a BlockSource is read whole, on "
            "rank 0 (give each rank's share of the data as its Batches to read every rank's)"
        )
    if not blocks and val_every is None:
        raise ValueError("val_every=None keeps a BlockSource's own split; Batches have none: give val_every")
    if stats is not None and exclude_profiled:
        raise ValueError(
            "exclude_profiled needs a profile made here: which inputs stats sampled is not known"
        )
    names = {"data": "the data", **{key: key for key in NAMED_PARAMETERS}, **(names or {})}
    spools = []
    if not blocks:
        spools = _spool(source, tables, Path(directory), num_batches, each_rank is not False, progress)

    def work() -> tuple[AccessStats, SampleBlock | None, HotSet]:
        try:
            return _profile_and_partition(
                source if blocks else _read_spools(spools, tables), tables, Path(directory), sample,
                batch_size, hot_budget, optimizer_class, stats, val_every, balance, seed, exclude_profiled,
                names, progress,
            )  # fmt: skip
        finally:  # the spools read, whether the partition was written or not
            if spools:
                shutil.rmtree(Path(directory) / SPOOLS, ignore_errors=True)

    stats, validation, hot_set = on_rank_zero(work)
    return PreparedData(stats, validation, _open_on_every_rank(Path(directory)), hot_set)


def _agree_on_source(source: object, num_batches: int | None, each_rank: bool | None) -> bool:
    """Whether the data is a ``BlockSource`` (else ``Batch``es), agreed by every rank that reads its
    ``source`` (rank 0, and every rank unless ``each_rank`` is False; the others' is not looked at) in one
    collective, so that a source refused on one rank is refused on every rank: ``TypeError`` for one that
    is neither, ``ValueError`` for an endless one without ``num_batches`` or ranks that disagree."""
    rank, world_size = _rank()
    reads = rank == 0 or each_rank is not False
    problem = None
    if reads and (
        isinstance(source, str | bytes | os.PathLike) or not isinstance(source, BlockSource | Iterable)
    ):
        problem = (
            "TypeError",
            "prepare_data reads a fae_torchrec.data.source.BlockSource or an iterable of TorchRec Batches, "
            f"not a {type(source).__module__}.{type(source).__qualname__}: open your files with a "
            "BlockSource (fae_torchrec.data.columnar.ColumnarSource for Parquet or CSV files and a schema, "
            "fae_torchrec.data's CriteoTsvReader, CriteoNpyReader or TaobaoCsvReader; docs/data.md), or "
            "give the DataLoader or dataset your training loop iterates",
        )
    elif reads and num_batches is None and getattr(source, "num_batches", 0) is None:
        problem = (
            "ValueError",
            f"the {type(source).__name__} is endless (its num_batches is None): give prepare_data "
            "num_batches=, the number of its batches to profile and train on",
        )
    seen = [(isinstance(source, BlockSource) if reads else None, problem)]
    if dist.is_initialized():
        seen = [None] * world_size
        dist.all_gather_object(seen, (isinstance(source, BlockSource) if reads else None, problem))
    problems = [(r, found) for r, (_, found) in enumerate(seen) if found is not None]
    if problems:
        r, (kind, message) = problems[0]
        message = f"{_where(r)}: {message}" if world_size > 1 else message
        raise TypeError(message) if kind == "TypeError" else ValueError(message)
    kinds = {kind for kind, _ in seen if kind is not None}
    if len(kinds) > 1:
        raise ValueError(
            "some ranks give prepare_data a BlockSource, others Batches: give every rank the same kind"
        )
    return kinds.pop()


def _rank() -> tuple[int, int]:
    """This rank and the number of ranks (0 and 1 without a process group)."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _where(rank: int) -> str:
    return f"rank {rank} (host {socket.gethostname()})"


def _raise_on_every_rank(problem: str | None) -> None:
    """Raise ``ValueError`` on every rank with the first problem any rank met (collective when a
    process group is initialised), so that none goes on into a collective the others left."""
    problems = [problem]
    if dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    found = [found for found in problems if found is not None]
    if found:
        raise ValueError(found[0])


def _spool(
    batches: Iterable[Batch],
    tables: Sequence[EmbeddingBagConfig],
    directory: Path,
    num_batches: int | None,
    each_rank: bool,
    progress: bool,
) -> list[Path]:
    """Each reading rank's ``batches`` spooled to ``directory/batches/rank-R``; the spools of the ranks
    read, in rank order. A problem on any rank is raised on every rank."""
    rank, world_size = _rank()
    readers = range(world_size) if each_rank else range(1)
    spools = [directory / SPOOLS / f"rank-{reader}" for reader in readers]
    problem = None
    if rank in readers:
        try:
            spool_batches(batches, tables, spools[rank], num_batches, progress=progress and rank == 0)
        except Exception as error:  # raised on every rank: the others would wait in the collective below
            said = (
                str(error) if isinstance(error, ValueError | OSError) else f"{type(error).__name__}: {error}"
            )
            problem = f"{_where(rank)}: {said}" if world_size > 1 else said
    _raise_on_every_rank(problem)
    return spools


def _read_spools(spools: Sequence[Path], tables: Sequence[EmbeddingBagConfig]) -> BatchSource:
    """Rank 0's view of every rank's spooled batches; ``ValueError`` saying that ``prepare_data``'s
    directory must be shared where another rank's spool is not there."""
    try:
        return BatchSource(spools, tables)
    except FileNotFoundError as error:
        raise ValueError(
            f"{_where(0)} cannot read the batches another rank spooled: {error}; prepare_data's directory "
            "must be on a file system every rank shares (on several nodes, a shared one)"
        ) from error


def _open_on_every_rank(directory: Path) -> HotColdPartition:
    """The partition rank 0 wrote, opened on every rank; ``ValueError`` on every rank naming the rank
    and host that cannot open it."""
    partition, problem = None, None
    try:
        partition = HotColdPartition.open(directory)
    except (OSError, ValueError) as error:
        problem = (
            f"{_where(_rank()[0])} cannot open the partition rank 0 wrote to {directory.resolve()}: "
            f"{error}; the directory must be on a file system every rank reads (on several nodes, a "
            "shared one)"
        )
    _raise_on_every_rank(problem)
    return partition


def repartition(
    partition: HotColdPartition,
    chosen: np.ndarray,
    hot_set: HotSet,
    directory: str | os.PathLike,
    balance: float = 0.0,
    seed: int = 0,
) -> HotColdPartition:
    """The inputs of ``partition`` that the mask ``chosen`` selects (over its data, in order; such as
    those a re-plan left untrained) partitioned again against ``hot_set`` into ``directory``: rank 0
    writes it, every rank opens it (collective when a process group is initialised; an error on rank 0
    is raised on every rank)."""

    def write() -> None:
        try:
            HotColdPartition.write(
                partition.inputs(chosen), hot_set, partition.keys, directory, balance=balance, seed=seed
            )
        except (ValueError, OSError) as error:
            raise ValueError(f"{directory}: {error}") from error

    on_rank_zero(write)
    return HotColdPartition.open(directory)


def on_rank_zero(work: Callable[[], T]) -> T:
    """``work()`` on rank 0 alone, its result broadcast to every rank (collective when a process group
    is initialised); a ``ValueError`` or ``OSError`` it raises is raised on every rank as ``ValueError``,
    so that no rank waits for a collective the others left (another error is raised as it is on rank 0 and
    as ``ValueError`` on the others)."""
    shared: list = [None, None]
    failed = None  # an error of another kind, raised as it is on rank 0
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            shared = [work(), None]
        except (ValueError, OSError) as error:
            shared = [None, str(error)]
        except Exception as error:
            failed, shared = error, [None, f"rank 0 failed: {type(error).__name__}: {error}"]
    if dist.is_initialized():
        dist.broadcast_object_list(shared, src=0)
    if failed is not None:
        raise failed
    result, problem = shared
    if problem is not None:
        raise ValueError(problem)
    return result


def _split(source: BlockSource, validation: bool, val_every: int | None) -> Iterator[SampleBlock]:
    if val_every == 0:
        return iter(()) if validation else rebatch(source.raw_blocks(), BLOCK)
    return source.split_blocks(validation, val_every, BLOCK)


def _profile_and_partition(
    source: BlockSource,
    tables: Sequence[EmbeddingBagConfig],
    directory: Path,
    sample: float,
    batch_size: int,
    hot_budget: int | None,
    optimizer_class: type[torch.optim.Optimizer] | None,
    stats: AccessStats | None,
    val_every: int | None,
    balance: float,
    seed: int,
    exclude_profiled: bool,
    names: Mapping[str, str],
    progress: bool,
) -> tuple[AccessStats, SampleBlock | None, HotSet]:
    """Rank 0's part of :func:`prepare_data`: the statistics (``stats``, else profiled here), the
    validation set and the hot set; the partition is written to ``directory``."""
    given = stats is not None
    if given:
        stats = stats.for_tables(tables, names["stats"])
        _check_count(stats, _training_inputs(source, val_every), names)
    profiler, profiled = None, None  # with exclude_profiled, per training block, the inputs profiled
    if stats is None:
        profiler, profiled = _profile(
            source, tables, sample, val_every, seed, exclude_profiled, names, progress
        )
    num_inputs, num_sampled = (stats or profiler).num_inputs, (stats or profiler).num_sampled
    held_out = list(_split(source, True, val_every))
    if not held_out and val_every != 0:
        raise ValueError(
            f"no validation input: {names['data']} has {num_inputs} inputs, fewer than "
            f"{names['val_every']} {val_every} (one input in every {val_every} is held out for validation)"
            if val_every
            else f"no validation input: {names['data']} has {num_inputs} training inputs and none "
            "to validate on"
        )
    num_train = num_inputs - (num_sampled if exclude_profiled else 0)
    _check_batch_size(batch_size, num_train, exclude_profiled, names)
    stats = stats or profiler.stats()
    hot_set = (
        HotSet(tuple(tables), tuple(np.empty(0, dtype=np.int64) for _ in tables))
        if hot_budget is None
        else stats.hot_set(hot_budget, optimizer_class)
    )
    training = _split(source, False, val_every)
    if profiled is not None:
        training = (
            block.select(np.delete(np.arange(len(block)), counted))
            for block, counted in zip(training, profiled, strict=True)
        )
    partition = HotColdPartition.write(
        training, hot_set, source.feature_names, directory, balance=balance, seed=seed, progress=progress,
        total=num_train,
    )  # fmt: skip
    if given:  # where the size was not known before
        _check_count(stats, len(partition.hot) + len(partition.cold), names)
    return stats, SampleBlock.concat(held_out) if held_out else None, hot_set


def _check_count(stats: AccessStats, num_train: int | None, names: Mapping[str, str]) -> None:
    """``ValueError`` naming ``stats`` where they count another number of training inputs than
    ``num_train`` (None: not known yet)."""
    if num_train is not None and num_train != stats.num_inputs:
        raise ValueError(
            f"{names['stats']}: statistics of {stats.num_inputs:,} training inputs, but {names['data']} has "
            f"{num_train:,} (other data, or another sample of it?)"
        )


def _profile(
    source: BlockSource,
    tables: Sequence[EmbeddingBagConfig],
    sample: float,
    val_every: int | None,
    seed: int,
    exclude_profiled: bool,
    names: Mapping[str, str],
    progress: bool,
) -> tuple[AccessProfiler, list[np.ndarray] | None]:
    """The profile of ``sample`` of ``source``'s training inputs and, with ``exclude_profiled``, per
    training block, the inputs it counted (None without)."""
    profiler = AccessProfiler(tables, sample, seed=seed)
    profiled = []
    bar = tqdm(total=_training_inputs(source, val_every), desc="profiling", unit="input", leave=False,
               unit_scale=True, disable=not progress)  # fmt: skip
    for block in _split(source, False, val_every):
        counted = profiler.update(block.to_batch(source.feature_names))
        bar.update(len(block))
        if exclude_profiled:
            profiled.append(np.flatnonzero(counted).astype(np.int32))
    bar.close()
    if profiler.num_inputs == 0:
        raise ValueError(f"no training input: {names['data']} has no inputs")
    if exclude_profiled and profiler.num_sampled == profiler.num_inputs:
        raise ValueError(
            f"{names['exclude_profiled']}: {names['sample']} {sample} profiled all {profiler.num_inputs} "
            f"training inputs of {names['data']}, which leaves none to train on"
        )
    return profiler, profiled if exclude_profiled else None


def _training_inputs(source: BlockSource, val_every: int | None) -> int | None:
    """How many training inputs ``source`` holds, where its size is known before reading it (synthetic
    data, Criteo npy files, Taobao sources); None otherwise (text files)."""
    if val_every is None:
        return getattr(source, "num_train", None)
    inputs = getattr(source, "num_samples", None)
    return None if inputs is None else inputs - (inputs // val_every if val_every else 0)


def _check_batch_size(
    batch_size: int, num_train: int, exclude_profiled: bool, names: Mapping[str, str]
) -> None:
    """Raise ``ValueError`` naming ``batch_size`` unless ``num_train`` training inputs fill one step on
    every rank."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if num_train < batch_size * world:
        ranks = f" per rank on {world} ranks ({batch_size * world:,} in all)" if world > 1 else ""
        per_rank = f", {num_train // world:,} per rank" if world > 1 else ""
        trained = f" not profiled ({names['exclude_profiled']})" if exclude_profiled else ""
        raise ValueError(
            f"{names['batch_size']} {batch_size}{ranks} is larger than the training data: {names['data']} "
            f"has {num_train:,} training inputs{trained}{per_rank}"
        )
