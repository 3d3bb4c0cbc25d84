"""FAE's offline step on every rank at once: each rank profiles and partitions its share of the training
data, and every rank opens the one partition they wrote.

Where every rank's source knows its size before it is read (synthetic data, npy files, TBSM samples,
spooled ``Batch``es), the data is cut into one run of whole blocks per rank. Each rank profiles its run,
its profiler's draws advanced to the run's first input, keeping its validation inputs in the same read,
and the ranks join their profiles (counts added, holdouts merged by draw); each rank then partitions its
run into files of its own, which the partition reads one after another. The statistics, the validation
inputs, the hot set and the partition's arrays are those one process makes of all of the data, byte for
byte. A source of unknown size (text files) is profiled and partitioned by rank 0 alone, the others
waiting. A problem found on any rank is raised on every rank, so no rank waits for a collective that the
others left.

The data is a ``BlockSource`` (every rank reads its share), or what a TorchRec script trains on: an
iterable of ``Batch``es, which each rank reads once into a spool beside the partition
(``fae_torchrec.data.batches``), shared out in rank order as one source. Either way the partition's
directory must be one that every rank reads and writes: on several nodes, a shared file system.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from tqdm import tqdm

from fae_torchrec import trace
from fae_torchrec.collectives import (
    all_gathered,
    on_every_rank,
    on_rank_zero,
    raise_on_every_rank,
    rank_and_world,
    where,
)
from fae_torchrec.data.batches import BatchSource, spool_batches
from fae_torchrec.data.block import SampleBlock, rebatch
from fae_torchrec.data.npy_append import NpyFolder
from fae_torchrec.data.row_chain import chain_rows
from fae_torchrec.data.source import BlockSource
from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.stats.profiler import AccessProfiler, profile_draws
from fae_torchrec.train.partition import (
    SHARE,
    HotColdPartition,
    clear_partition,
    finish_shares,
    write_files,
)

#: Inputs per block while the data streams past.
BLOCK = 4096
#: The folder of ``prepare_data``'s directory where several ranks share the validation inputs.
VALIDATION = "validation"
#: The fields of a validation input.
_FIELDS = ("dense", "ids", "labels")
#: Inputs of the data per block of a re-partition (``HotColdPartition.inputs``).
REPARTITION_BLOCK = 1 << 16
#: The folder of ``prepare_data``'s directory where each rank spools its ``Batch``es (removed once the
#: partition is written).
SPOOLS = "batches"
#: The parameters of :func:`prepare_data` its messages name (``names`` may rename them).
NAMED_PARAMETERS = ("sample", "batch_size", "val_every", "exclude_profiled", "stats")


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_data` gives every rank: the profile's statistics, the validation inputs (all
    of them, on every rank, memory-mapped from the directory's ``validation`` folder where there are
    several ranks; None when none was asked for), the training inputs split into hot and
    cold, and the hot set they were split by: build the ``FAEEmbeddingBagCollection`` from it (a split
    module of another hot set refuses the partition's batches)."""

    stats: AccessStats
    validation: SampleBlock | None
    partition: HotColdPartition
    hot_set: HotSet

    @property
    def num_dense(self) -> int:
        """The data's dense values per input (a model's dense width)."""
        return self.partition.cold.dense.shape[1]


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
    """Profile ``sample`` of ``source``'s training inputs (5%, FAE's for DLRM), choose the hot set of
    ``hot_budget`` bytes (None: no hot row, a baseline's all-cold partition) and write the partition of
    the training inputs to ``directory``, each rank its share where the source's size is known (the module
    docstring); collective under a process group, a problem on any rank raised on every rank as
    ``ValueError`` naming the rank, its host and the path, batch, feature or parameter.

    ``source``: a ``BlockSource``, or an iterable of TorchRec ``Batch``es read once (its first
    ``num_batches``; an endless one needs it) into ``directory/batches``, by every rank, each its own
    share (``each_rank``, the default), or by rank 0 alone (``each_rank=False``; docs/adopt.md).
    ``directory`` must be one every rank reads and writes (on several nodes, a shared file system).
    ``optimizer_class``: the embedding optimizer, whose row state the budget counts as
    ``FAEShardingPlanner`` counts it. ``stats``: a profile of these training inputs made before
    (``AccessStats.load``), used instead of profiling. ``val_every``: one input in N held out for
    validation (0: none; None: the source's own split). ``exclude_profiled``: the partition holds only
    the inputs the profile did not sample. ``balance``, ``seed``: :meth:`HotColdPartition.write`'s.
    ``names``: how messages name the data and these parameters (``{"batch_size": "--batch-size"}``);
    ``progress`` draws bars.

    Raises ``ValueError`` when there is no training input, no validation input where some were asked
    for, or fewer training inputs than one ``batch_size`` per rank (nothing is written then), and
    ``TypeError`` when ``source`` is neither kind (such as a path)."""
    directory = Path(directory)
    existed = directory.exists()  # before any rank writes to it (the collective below comes first)
    blocks = _agree_on_source(source, num_batches, each_rank)
    _check_options(blocks, num_batches, each_rank, val_every, stats is not None, exclude_profiled)
    names = {"data": "the data", **{key: key for key in NAMED_PARAMETERS}, **(names or {})}
    with record_function(trace.PREPARE):
        spools = []
        if not blocks:
            spools = _spool(source, tables, directory, num_batches, each_rank is not False, progress)
        with _removed_where_refused(directory, spools, existed):
            read = on_every_rank(lambda: _read_spools(spools, tables)) if spools else source
            assert isinstance(read, BlockSource)  # spooled, or one to begin with (_agree_on_source)
            return _profile_and_partition(
                read, tables, directory, sample, batch_size, hot_budget, optimizer_class, stats,
                val_every, balance, seed, exclude_profiled, names, progress,
            )  # fmt: skip


@contextmanager
def _removed_where_refused(directory: Path, spools: Sequence[Path], existed: bool) -> Iterator[None]:
    """Around the pass, on rank 0: the validation inputs' files removed where it is refused (alike on
    every rank), the spools once every rank read them (whether the partition was written or not), and
    ``directory`` where the pass made it (``existed``: it did not) and left it empty."""
    first = rank_and_world()[0] == 0
    try:
        yield
    except ValueError:
        if first:
            shutil.rmtree(directory / VALIDATION, ignore_errors=True)
        raise
    finally:
        if first and spools:
            shutil.rmtree(directory / SPOOLS, ignore_errors=True)
        if first and not existed and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def _check_options(
    blocks: bool,
    num_batches: int | None,
    each_rank: bool | None,
    val_every: int | None,
    given: bool,
    exclude_profiled: bool,
) -> None:
    """``ValueError`` for :func:`prepare_data`'s options that do not go together."""
    if blocks and (num_batches is not None or each_rank):
        raise ValueError(
            "num_batches and each_rank are for an iterable of Batches; a BlockSource is read whole, on "
            "rank 0 (give each rank's share of the data as its Batches to read every rank's)"
        )
    if not blocks and val_every is None:
        raise ValueError("val_every=None keeps a BlockSource's own split; Batches have none: give val_every")
    if given and exclude_profiled:
        raise ValueError(
            "exclude_profiled needs a profile made here: which inputs stats sampled is not known"
        )


def _agree_on_source(source: object, num_batches: int | None, each_rank: bool | None) -> bool:
    """Whether the data is a ``BlockSource`` (else ``Batch``es), agreed by every rank that reads its
    ``source`` (rank 0, and every rank unless ``each_rank`` is False; the others' is not looked at) in one
    collective, so that a source refused on one rank is refused on every rank: ``TypeError`` for one that
    is neither, ``ValueError`` for an endless one without ``num_batches`` or ranks that disagree."""
    rank, world_size = rank_and_world()
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
    seen = all_gathered((isinstance(source, BlockSource) if reads else None, problem))
    problems = [(r, found) for r, (_, found) in enumerate(seen) if found is not None]
    if problems:
        r, (kind, message) = problems[0]
        message = f"{where(r)}: {message}" if world_size > 1 else message
        raise TypeError(message) if kind == "TypeError" else ValueError(message)
    kinds = {kind for kind, _ in seen if kind is not None}
    if len(kinds) > 1:
        raise ValueError(
            "some ranks give prepare_data a BlockSource, others Batches: give every rank the same kind"
        )
    return kinds.pop()


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
    rank, world_size = rank_and_world()
    readers = range(world_size) if each_rank else range(1)
    spools = [directory / SPOOLS / f"rank-{reader}" for reader in readers]

    def spool() -> None:
        if rank in readers:
            spool_batches(batches, tables, spools[rank], num_batches, progress=progress and rank == 0)

    on_every_rank(spool)
    return spools


def _read_spools(spools: Sequence[Path], tables: Sequence[EmbeddingBagConfig]) -> BatchSource:
    """Every rank's spooled batches, as one source; ``ValueError`` saying that ``prepare_data``'s
    directory must be shared where another rank's spool is not there."""
    try:
        return BatchSource(spools, tables)
    except FileNotFoundError as error:
        raise ValueError(
            f"cannot read the batches another rank spooled: {error}; prepare_data's directory "
            "must be on a file system every rank shares (on several nodes, a shared one)"
        ) from error


def _open_on_every_rank(directory: Path) -> HotColdPartition:
    """The partition written to ``directory``, opened on every rank; ``ValueError`` on every rank naming
    the rank and host that cannot open it."""
    partition, problem = None, None
    try:
        partition = HotColdPartition.open(directory)
    except (OSError, ValueError) as error:
        problem = (
            f"{where(rank_and_world()[0])} cannot open the partition written to {directory.resolve()}: "
            f"{error}; the directory must be on a file system every rank reads (on several nodes, a "
            "shared one)"
        )
    raise_on_every_rank(problem)
    assert partition is not None  # no rank had a problem: each opened it
    return partition


def repartition(
    partition: HotColdPartition,
    chosen: np.ndarray,
    hot_set: HotSet,
    directory: str | os.PathLike,
    balance: float = 0.0,
    seed: int = 0,
    block_size: int = REPARTITION_BLOCK,
) -> HotColdPartition:
    """The inputs of ``partition`` that the mask ``chosen`` selects (over its data, in order; such as
    those a re-plan left untrained) partitioned again against ``hot_set`` into ``directory``, in
    blocks of ``block_size`` inputs of the data: each rank its share of the blocks, every rank opens it
    (collective when a process group is initialised; an error on any rank is raised on every rank)."""
    world_size = rank_and_world()[1]
    windows = np.arange(0, len(chosen), block_size)
    used = np.logical_or.reduceat(np.asarray(chosen, dtype=bool), windows) if len(windows) else windows
    bounds = [r * len(windows) // world_size for r in range(world_size + 1)]
    ranges = [(first, stop if used[first:stop].any() else first) for first, stop in pairwise(bounds)]

    def read(first: int, stop: int | None) -> Iterator[tuple[SampleBlock, np.ndarray]]:
        end = len(chosen) if stop is None else min(stop * block_size, len(chosen))
        blocks = partition.inputs(chosen, block_size, first * block_size, end)
        return ((block, np.ones(len(block), dtype=bool)) for block in blocks)

    runs = _Runs(ranges, read, lambda first: int(np.count_nonzero(used[:first])))
    try:
        return _partition(runs, hot_set, partition.keys, Path(directory), balance, seed, False)
    except ValueError as error:
        raise ValueError(f"{directory}: {error}") from error


@dataclass(frozen=True)
class _Share:
    """One rank's share of the data: its raw inputs ``start`` to ``stop`` (None: the end), ``start`` a
    multiple of ``BLOCK``, so that its blocks are numbered on from those of the shares before."""

    start: int
    stop: int | None

    @property
    def empty(self) -> bool:
        return self.stop is not None and self.stop <= self.start


def _shares(source: BlockSource) -> list[_Share]:
    """Each rank's share of ``source`` (collective): equal runs of whole blocks where every rank's
    source knows the same size before it is read, else all of it for rank 0 (a text file's lines are
    not counted before they are read)."""
    world_size = rank_and_world()[1]
    sizes = all_gathered(source.num_samples)
    size = sizes[0]
    if size is None or any(other != size for other in sizes):
        return [_Share(0, None)] + [_Share(0, 0)] * (world_size - 1)
    starts = [min(size, (r * size // world_size) // BLOCK * BLOCK) for r in range(world_size)]
    return [_Share(start, stop) for start, stop in zip(starts, [*starts[1:], size], strict=True)]


def _masked(
    source: BlockSource, val_every: int | None, share: _Share
) -> Iterator[tuple[SampleBlock, np.ndarray]]:
    """``share``'s inputs in blocks of ``BLOCK``, each with the mask of its validation inputs."""
    if share.empty:
        return iter(())
    if val_every == 0:
        blocks = rebatch(source.raw_range(share.start, share.stop), BLOCK)
        return ((block, np.zeros(len(block), dtype=bool)) for block in blocks)
    return source.split_masks(val_every, BLOCK, share.start, share.stop)


def _training(
    source: BlockSource, val_every: int | None, share: _Share, held: _HeldOut | None = None
) -> Iterator[tuple[SampleBlock, np.ndarray]]:
    """``share``'s blocks that hold training inputs (:func:`_masked`), each with the mask of them; the
    validation inputs appended to ``held`` as they pass (None: not kept)."""
    for block, validation in _masked(source, val_every, share):
        if held is not None and validation.any():
            held.append(block.select(validation))
        if not validation.all():
            yield block, ~validation


def _selected(blocks: Iterable[tuple[SampleBlock, np.ndarray]]) -> Iterator[SampleBlock]:
    """Each block's inputs that its mask chooses (the block itself where it chooses all)."""
    return (block if chosen.all() else block.select(chosen) for block, chosen in blocks)


@dataclass(frozen=True)
class _Runs:
    """The training inputs in numbered units (blocks of the data, windows of a partition), each rank's
    run of them (``ranges``: first unit and the unit after the last, None: to the end) and how to read
    any run: ``read(first, stop)`` yields its blocks that hold training inputs, each with the mask of
    them, the first of them block ``first_block(first)`` of all (the block a writer of everything
    numbers it, for the label balance's draws)."""

    ranges: Sequence[tuple[int, int | None]]
    read: Callable[[int, int | None], Iterator[tuple[SampleBlock, np.ndarray]]]
    first_block: Callable[[int], int]

    def writers(self) -> list[int]:
        """The ranks whose run holds units."""
        return [r for r, (first, stop) in enumerate(self.ranges) if stop is None or stop > first]


def _source_runs(
    source: BlockSource, val_every: int | None, shares: Sequence[_Share], sample: float | None, seed: int
) -> _Runs:
    """Each rank's ``shares`` of ``source`` as runs of ``BLOCK`` inputs; with ``sample`` (the profile's
    fraction; None: none), less the inputs the profile of ``seed`` sampled (its draws, made again)."""
    size = source.num_samples

    def read(first: int, stop: int | None) -> Iterator[tuple[SampleBlock, np.ndarray]]:
        end = None if stop is None else stop * BLOCK
        share = _Share(first * BLOCK, end if end is None or size is None else min(end, size))
        blocks = _training(source, val_every, share)
        if sample is None:
            return blocks
        draws = profile_draws(seed, source.training_before(share.start, val_every))
        return ((block, _unsampled(chosen, draws, sample)) for block, chosen in blocks)

    ranges = [
        (share.start // BLOCK, None if share.stop is None else -(-share.stop // BLOCK)) for share in shares
    ]
    return _Runs(ranges, read, lambda first: first)


def _unsampled(chosen: np.ndarray, draws: np.random.Generator, sample: float) -> np.ndarray:
    """``chosen`` less the inputs it marks that the profile sampled (the next of its ``draws`` below
    ``sample``)."""
    kept = chosen.copy()
    kept[chosen] = draws.random(int(np.count_nonzero(chosen))) >= sample
    return kept


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
) -> PreparedData:
    """:func:`prepare_data` of a source, each rank its share (collective): the statistics (``stats``,
    else profiled here), the validation set, the hot set, and the partition written to ``directory``."""
    shares = _shares(source)
    rank, world_size = rank_and_world()
    share = shares[rank]
    given = stats is not None
    on_rank_zero(lambda: shutil.rmtree(directory / VALIDATION, ignore_errors=True))  # an earlier run's

    def held_out() -> _HeldOut:  # where this rank keeps its validation inputs
        return _HeldOut(None if world_size == 1 else directory / VALIDATION / SHARE.format(rank))

    if stats is not None:
        stats = stats.for_tables(tables, names["stats"])
        _check_count(stats, _training_inputs(source, val_every), names)
        mine = held_out()
        on_every_rank(lambda: deque(_training(source, val_every, share, mine), maxlen=0))
        num_inputs, num_sampled = stats.num_inputs, stats.num_sampled
    else:
        profiler, mine = _profile(
            source, share, tables, sample, val_every, seed, exclude_profiled, names, progress, held_out
        )
        num_inputs, num_sampled = profiler.num_inputs, profiler.num_sampled
    stats, hot_set, problem = _hot_set(stats or profiler, tables, hot_budget, optimizer_class)
    validation = mine.share()
    if validation is None and val_every != 0:
        raise ValueError(
            f"no validation input: {names['data']} has {num_inputs} inputs, fewer than "
            f"{names['val_every']} {val_every} (one input in every {val_every} is held out for validation)"
            if val_every
            else f"no validation input: {names['data']} has {num_inputs} training inputs and none "
            "to validate on"
        )
    _check_batch_size(
        batch_size, num_inputs - (num_sampled if exclude_profiled else 0), exclude_profiled, names
    )
    if problem is not None:
        raise problem
    assert stats is not None and hot_set is not None  # made where there is no problem
    runs = _source_runs(source, val_every, shares, sample if exclude_profiled else None, seed)
    partition = _partition(runs, hot_set, source.feature_names, directory, balance, seed, progress)
    if given:  # where the size was not known before
        _check_count(stats, len(partition.hot) + len(partition.cold), names)
    return PreparedData(stats, validation, partition, hot_set)


def _hot_set(
    counted: AccessStats | AccessProfiler,
    tables: Sequence[EmbeddingBagConfig],
    hot_budget: int | None,
    optimizer_class: type[torch.optim.Optimizer] | None,
) -> tuple[AccessStats | None, HotSet | None, ValueError | None]:
    """The statistics of ``counted`` (given, or a profiler's), the hot set of ``hot_budget`` bytes (None:
    none hot) and the problem they have (None: none), raised once the data's size is checked: alike on
    every rank, whose statistics are the same."""
    try:
        stats = counted if isinstance(counted, AccessStats) else counted.stats()
        if hot_budget is None:
            return stats, HotSet(tuple(tables), tuple(np.empty(0, dtype=np.int64) for _ in tables)), None
        return stats, stats.hot_set(hot_budget, optimizer_class), None
    except ValueError as error:
        return None, None, error


class _HeldOut:
    """This rank's validation inputs, kept as the profile's read passes them (``append``): in memory
    where one rank reads all the data, else appended to files of its own in ``folder``, which every
    rank then reads (``share``): no rank copies, sends or holds the others'."""

    def __init__(self, folder: Path | None) -> None:
        self.blocks: list[SampleBlock] = []
        self.files = None if folder is None else NpyFolder(folder)
        self.ids_per_feature: tuple[int, ...] | None = None

    def append(self, block: SampleBlock) -> None:
        self.ids_per_feature = block.ids_per_feature
        if self.files is None:
            self.blocks.append(block)
            return
        for field in _FIELDS:
            self.files.append(field, getattr(block, field))

    def close(self) -> None:
        """Close its files (done with the inputs it keeps, or before they are kept anew)."""
        if self.files is not None:
            self.files.close()

    def share(self) -> SampleBlock | None:
        """Every rank's validation inputs, in rank order, on every rank (collective; None: there are
        none): in memory on one rank, memory-mapped from every rank's files on several."""
        if self.files is None:
            return SampleBlock.concat(self.blocks) if self.blocks else None
        self.files.close()
        everyone = all_gathered(self.ids_per_feature)
        shares = self.files.folder.parent
        folders = [shares / SHARE.format(r) for r, held in enumerate(everyone) if held is not None]
        if not folders:
            return None

        def chained(field: str) -> np.ndarray:
            return chain_rows([np.load(folder / f"{field}.npy", mmap_mode="r") for folder in folders])

        ids_per_feature = next(held for held in everyone if held is not None)
        return on_every_rank(
            lambda: SampleBlock(
                **{field: chained(field) for field in _FIELDS}, ids_per_feature=ids_per_feature
            )
        )


def _partition(
    runs: _Runs,
    hot_set: HotSet,
    keys: Sequence[str],
    directory: Path,
    balance: float,
    seed: int,
    progress: bool,
) -> HotColdPartition:
    """The partition of every rank's run of ``runs`` (in rank order) into ``directory``, opened on every
    rank (collective). Where several ranks write, each writes its run into files of its own (``SHARE``),
    which the partition reads one after another: the arrays one process writes."""
    rank = rank_and_world()[0]
    writers = runs.writers()
    first, stop = runs.ranges[rank]
    blocks = _selected(runs.read(first, stop))
    on_rank_zero(lambda: clear_partition(directory))
    if len(writers) <= 1:  # one rank writes it all (none: rank 0 says there is nothing to write)

        def write() -> None:
            if rank == (writers or [0])[0]:
                HotColdPartition.write(
                    blocks, hot_set, keys, directory, balance=balance, seed=seed, progress=progress,
                    first_block=runs.first_block(first),
                )  # fmt: skip

        on_every_rank(write)
        return _open_on_every_rank(directory)
    written = on_every_rank(
        lambda: write_files(
            blocks, hot_set, keys, directory / SHARE.format(rank), balance, seed, runs.first_block(first),
            progress and rank == 0,
        )
    )  # fmt: skip
    everyone = all_gathered(written)
    wrote = [(r, share.layout()) for r, share in enumerate(everyone) if share.ids_per_feature is not None]
    for r, layout in wrote[1:]:
        if layout != wrote[0][1]:
            raise ValueError(
                f"{where(r)} reads inputs of {layout} (files, ids per feature), where "
                f"{where(wrote[0][0])} reads {wrote[0][1]}: every rank must read the same data"
            )
    on_rank_zero(lambda: finish_shares(directory, everyone, keys, hot_set))
    return _open_on_every_rank(directory)


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
    share: _Share,
    tables: Sequence[EmbeddingBagConfig],
    sample: float,
    val_every: int | None,
    seed: int,
    exclude_profiled: bool,
    names: Mapping[str, str],
    progress: bool,
    held_out: Callable[[], _HeldOut],
) -> tuple[AccessProfiler, _HeldOut]:
    """The profile of ``sample`` of ``source``'s training inputs, each rank counting its ``share``'s
    (collective: the counts added, the holdout merged, as one profiler of all of them would have them),
    and the validation inputs of ``share``, kept in the same read (in what ``held_out`` makes)."""

    everything = _training_inputs(source, val_every)

    def count(bounded: bool) -> tuple[AccessProfiler, _HeldOut]:
        first = source.training_before(share.start, val_every)
        profiler = AccessProfiler(
            tables, sample, seed=seed, first_input=first, total_inputs=everything if bounded else None
        )
        held = held_out()
        total = everything
        if share.stop is not None:
            total = source.training_before(share.stop, val_every) - first
        bar = tqdm(total=total, desc="profiling", unit="input", leave=False, unit_scale=True,
                   disable=not progress or rank_and_world()[0] != 0)  # fmt: skip
        for block in _selected(_training(source, val_every, share, held)):
            profiler.update(block.to_batch(source.feature_names))
            bar.update(len(block))
        bar.close()
        return profiler, held

    profiler, held = on_every_rank(lambda: count(True))
    _join(profiler)
    if profiler.holdout_short():  # the holdout's bound did not hold (never in practice): count anew without
        held.close()
        profiler, held = on_every_rank(lambda: count(False))
        _join(profiler)
    if profiler.num_inputs == 0:
        raise ValueError(f"no training input: {names['data']} has no inputs")
    if exclude_profiled and profiler.num_sampled == profiler.num_inputs:
        raise ValueError(
            f"{names['exclude_profiled']}: {names['sample']} {sample} profiled all {profiler.num_inputs} "
            f"training inputs of {names['data']}, which leaves none to train on"
        )
    return profiler, held


def _join(profiler: AccessProfiler) -> None:
    """Make each rank's ``profiler`` (of its share) the profiler of every rank's share (collective).
    The counts of a table whose rows the ranks counted are few (a small sample of a large table) go
    as those rows and their counts; the others are summed whole."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    rank = rank_and_world()[0]
    counted = [np.flatnonzero(counts) for counts in profiler.counts]
    # with the rows counted, the draws of the holdout's inputs (those drawn least): one exchange
    described = all_gathered(([len(rows) for rows in counted], profiler.holdout_draws()))
    sizes = [held for held, _ in described]
    sparse = [2 * sum(held[t] for held in sizes) < len(c) for t, c in enumerate(profiler.counts)]
    mine = {t: (rows, profiler.counts[t][rows]) for t, rows in enumerate(counted) if sparse[t]}
    everyone = all_gathered(mine)
    for other, theirs in enumerate(everyone):
        for t, (rows, values) in theirs.items() if other != rank else ():
            profiler.counts[t][rows] += values
    for t, counts in enumerate(profiler.counts):
        if not sparse[t]:
            tensor = torch.from_numpy(counts)
            summed = tensor.cuda() if dist.get_backend() == "nccl" else tensor
            dist.all_reduce(summed)
            tensor.copy_(summed)
    shares = all_gathered(profiler.share(profiler.holdout_below([draws for _, draws in described])))
    profiler.join(shares)


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
