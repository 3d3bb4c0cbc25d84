"""``fae_torchrec.threads``: importing the package before torch bounds how long OpenMP's idle threads spin
(unless a policy is set, or torch came first), and the commands take the cores they may use, shared among
the ranks of the host, less those other processes keep busy."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.bench_busy import GOMP_DEFAULT_SPINS, SPINNER, child_env
from fae_torchrec.threads import SPIN_COUNT, WAIT_VARIABLES, busy_cores, intra_op_threads, usable_cores

_REPORT = """
import json, os, sys
{first}
from fae_torchrec.threads import share_cores
import torch
said = share_cores()
print(json.dumps({{"wait": [os.environ.get(v) for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")],
                  "threads": torch.get_num_threads(), "said": said}}))
"""


def _report(first: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (*WAIT_VARIABLES, "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", _REPORT.format(first=first)], env={**clean, **env}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("first", "env", "wait"),
    [
        ("import fae_torchrec", {}, [None, str(SPIN_COUNT)]),
        ("import fae_torchrec", {"OMP_WAIT_POLICY": "ACTIVE", "LOCAL_WORLD_SIZE": "99"}, ["ACTIVE", None]),
        ("import torch, fae_torchrec", {"OMP_NUM_THREADS": "1"}, [None, None]),
    ],
    ids=["fae_torchrec first", "a policy and many ranks", "torch first, threads set"],
)
def test_the_spin_is_bounded_before_torch_loads_and_threads_follow_the_cores(first, env, wait):
    """OpenMP's idle threads spin briefly where no policy is set and torch is not loaded yet; a rank takes
    at most the cores it may use shared among the ranks of its host, unless ``OMP_NUM_THREADS`` says how
    many, and says so."""
    report = _report(first, **env)
    assert report["wait"] == wait
    if "OMP_NUM_THREADS" in env:
        assert report["threads"] == 1 and report["said"] is None
    else:
        limit = len(usable_cores()) // int(env.get("LOCAL_WORLD_SIZE", "1")) or 1
        assert 1 <= report["threads"] <= limit
        assert report["said"].startswith(
            f"{report['threads']} intra-op thread(s): {len(usable_cores())} usable"
        )


def test_threads_leave_out_the_cores_other_processes_keep_busy():
    cores = len(usable_cores())
    assert intra_op_threads(1) == cores and intra_op_threads(cores + 1) == 1
    assert intra_op_threads(1, busy=cores) == 1 and intra_op_threads(1, busy=cores - 1) == 1
    assert intra_op_threads(1, busy=0.4) == cores
    spinner = subprocess.Popen(SPINNER)
    try:
        assert busy_cores(0.5) >= 0.5, "a process that spins keeps a core busy"
    finally:
        spinner.kill()
        spinner.wait()


def test_bench_busy_prices_the_old_defaults_explicitly():
    before, after = child_env("before", 7), child_env("after", 7)
    assert before["GOMP_SPINCOUNT"] == str(GOMP_DEFAULT_SPINS) and before["OMP_NUM_THREADS"] == "7"
    assert not set(after) & {*WAIT_VARIABLES, "OMP_NUM_THREADS"}, "the example chooses"
