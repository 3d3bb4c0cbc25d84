"""``fae_torchrec.threads``: importing the package before torch makes OpenMP's idle threads sleep (unless
a policy is set, or torch came first), and the commands take the cores they may use, shared among the
ranks of the host."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.bench_busy import GOMP_DEFAULT_SPINS, child_env
from fae_torchrec.threads import WAIT_VARIABLES, intra_op_threads

_REPORT = """
import json, os, sys
{first}
from fae_torchrec.threads import share_cores
import torch
share_cores()
print(json.dumps({{"policy": os.environ.get("OMP_WAIT_POLICY"), "threads": torch.get_num_threads()}}))
"""


def _report(first: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (*WAIT_VARIABLES, "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", _REPORT.format(first=first)], env={**clean, **env}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("first", "env", "policy", "threads"),
    [
        ("import fae_torchrec", {"LOCAL_WORLD_SIZE": "1"}, "PASSIVE", "cores"),
        ("import fae_torchrec", {"OMP_WAIT_POLICY": "ACTIVE", "LOCAL_WORLD_SIZE": "99"}, "ACTIVE", 1),
        ("import torch, fae_torchrec", {"OMP_NUM_THREADS": "1"}, None, 1),
    ],
    ids=["fae_torchrec first", "a policy and many ranks", "torch first, threads set"],
)
def test_the_wait_policy_is_set_before_torch_loads_and_threads_follow_the_cores(first, env, policy, threads):
    """OpenMP's idle threads sleep where no policy is set and torch is not loaded yet; a rank takes the cores
    it may use shared among the ranks of its host, unless ``OMP_NUM_THREADS`` says how many."""
    cores = len(os.sched_getaffinity(0))
    assert _report(first, **env) == {"policy": policy, "threads": cores if threads == "cores" else threads}
    assert intra_op_threads(1) == cores and intra_op_threads(cores + 1) == 1


def test_bench_busy_prices_the_old_defaults_explicitly():
    before, after = child_env("before", 7), child_env("after", 7)
    assert before["GOMP_SPINCOUNT"] == str(GOMP_DEFAULT_SPINS) and before["OMP_NUM_THREADS"] == "7"
    assert not set(after) & {*WAIT_VARIABLES, "OMP_NUM_THREADS"}, "the example chooses"
