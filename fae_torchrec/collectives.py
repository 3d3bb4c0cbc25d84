"""Collectives that keep ranks together when one of them fails: a rank that meets a problem tells the
others, and every rank raises, so that none goes on into a collective the others left (and hangs there).
Each works in one process too, with no process group."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size (0 and 1 without a process group)."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def where(rank: int) -> str:
    """``rank`` and this host's name, for a message that says where a problem is."""
    return f"rank {rank} (host {socket.gethostname()})"


def all_gathered(mine: T, group: dist.ProcessGroup | None = None) -> list[T]:
    """Every rank's ``mine`` in rank order (collective over ``group``, the world by default, where a
    process group is initialised; this rank's alone where none is)."""
    if not dist.is_initialized():
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group)
    return everyone


def raise_on_every_rank(problem: str | None, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` on every rank with the first problem any rank met (collective when a process
    group is initialised), so that none goes on into a collective the others left."""
    found = [found for found in all_gathered(problem) if found is not None]
    if found:
        raise error(found[0])


def on_every_rank(work: Callable[[], T]) -> T:
    """``work()`` on this rank, after which every rank raises ``ValueError`` (a collective) when any
    rank's failed, naming that rank where there are several (its error chained on its own rank), so
    that none goes on into a collective the others left."""
    rank, world_size = rank_and_world()
    result, problem, failed = None, None, None
    try:
        result = work()
    except Exception as error:
        known = isinstance(error, ValueError | OSError)
        said = str(error) if known else f"{type(error).__name__}: {error}"
        problem, failed = (f"{where(rank)}: {said}" if world_size > 1 else said), error
    try:
        raise_on_every_rank(problem)
    except ValueError as raised:
        raise raised from failed
    return cast(T, result)  # work() returned it: no rank failed


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
