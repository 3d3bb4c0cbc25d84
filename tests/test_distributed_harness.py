"""The multi-rank test harness: a rank aborted by SIGABRT reruns the group once unless every rank had
finished; other failures fail."""

import multiprocessing.util
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.distributed import run_on_ranks


def _abort_first_time(rank: int, world_size: int, marker: str) -> None:
    if rank == 1 and not Path(marker).exists():
        Path(marker).touch()
        os.abort()


def _abort_after_finishing(rank: int, world_size: int, runs: str) -> None:
    with open(runs, "a") as file:
        file.write(f"{rank}\n")
    if rank == 1:
        # as gloo's abort comes: when the rank's process tears down, after the test returned
        multiprocessing.util.Finalize(None, os.abort, exitpriority=0)


def _always_abort(rank: int, world_size: int) -> None:
    if rank == 1:
        os.abort()


def _raise(rank: int, world_size: int, marker: str) -> None:
    with open(marker, "a") as runs:
        runs.write(f"{rank}\n")
    raise ValueError("a real failure")


def test_a_rank_aborted_once_reruns_the_group(tmp_path):
    with pytest.warns(UserWarning, match="rank 1 got SIGABRT; running the group again"):
        run_on_ranks(_abort_first_time, 2, tmp_path, str(tmp_path / "aborted"))


def test_an_abort_after_every_rank_finished_passes_without_a_rerun(tmp_path):
    runs = tmp_path / "runs"
    with pytest.warns(UserWarning, match="rank 1 got SIGABRT after the test had passed"):
        run_on_ranks(_abort_after_finishing, 2, tmp_path, str(runs))
    assert sorted(runs.read_text().split()) == ["0", "1"], "the test ran once on each rank"


def test_a_second_abort_and_an_exception_fail_at_once(tmp_path):
    aborted, raised = tmp_path / "aborted", tmp_path / "raised"  # a store file serves one group
    aborted.mkdir()
    raised.mkdir()
    with pytest.warns(UserWarning), pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        run_on_ranks(_always_abort, 2, aborted)
    runs = tmp_path / "runs"
    with pytest.raises(mp.ProcessRaisedException, match="a real failure"):
        run_on_ranks(_raise, 2, raised, str(runs))
    assert len(runs.read_text().split()) <= 2, "an exception is not retried"
