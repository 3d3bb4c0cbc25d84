"""The FAE plan is a function of its inputs: processes with different hash seeds plan alike.

TorchRec's enumerator intersects allowed sharding types and kernels as sets; with FAE's constraints the
plan used to change with ``PYTHONHASHSEED`` (seen at seeds 0 and 2 against 1 and 3 here), so a resumed
run could shard its model into another layout than its checkpoint's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANS = """
import json
import torch
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.train.checkpoint import plan_layout
from fae_torchrec.data import SyntheticCriteo
from planner import FAEShardingPlanner
from planner.baseline import default_planner, dry_run, hbm_planner, scaleup_planner

data = SyntheticCriteo(20000, batch_size=4096, scale=0.0005, seed=3)
tables = data.table_configs(8)
stats = AccessProfiler(tables, 0.3, seed=0, holdout_size=500).profile(data)
plans = {}
for device, world in (("cpu", 1), ("cpu", 2), ("cuda", 2)):
    topology = Topology(world_size=world, compute_device=device, hbm_cap=1 << 20)
    planner = FAEShardingPlanner(topology, stats, batch_size=32, hot_budget_bytes=48 << 10)
    split = FAEEmbeddingBagCollection(tables, planner.choose_hot_set(), device=torch.device("meta"))
    plans[f"fae {device} x{world}"] = plan_layout(planner.plan(split, get_default_sharders()))
    scaleup = dry_run(scaleup_planner(topology, stats, 32), tables)
    plans[f"scaleup {device} x{world}"] = plan_layout(scaleup.plan)
topology = Topology(world_size=2, compute_device="cuda", hbm_cap=64 << 20)
plans["hbm cuda x2"] = plan_layout(dry_run(hbm_planner(topology, tables, 32), tables).plan)
plans["default cuda x2"] = plan_layout(dry_run(default_planner(topology, 32, tables=tables), tables).plan)
print(json.dumps(plans, sort_keys=True))
"""


def _plans(*hash_seeds: str) -> list[dict]:
    """The plans of one process per hash seed, the processes run side by side."""
    command = [sys.executable, "-c", PLANS]
    runs = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for seed in hash_seeds
    ]
    plans = []
    for run in runs:
        stdout, stderr = run.communicate()
        assert run.returncode == 0, stderr[-3000:]
        plans.append(json.loads(stdout.strip().splitlines()[-1]))
    return plans


@pytest.mark.slow
def test_plans_do_not_depend_on_the_hash_seed():
    first, other = _plans("0", "1")  # two seeds that planned apart before the fix
    assert any("data_parallel" in v for v in first["fae cpu x2"].values())
    assert other == first, "PYTHONHASHSEED=1 planned otherwise than 0"
