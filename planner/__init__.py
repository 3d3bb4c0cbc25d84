"""The FAE sharding planner for TorchRec: hot rows on HBM, cold rows in UVM-cached tables.

``FAEShardingPlanner`` plans models built with ``fae_torchrec.FAEEmbeddingBagCollection`` on top of
TorchRec's ``EmbeddingShardingPlanner``; ``make_topology`` builds a ``Topology`` through TorchRec's
``TopologyFactory``. The modules: ``constraints`` writes the ``ParameterConstraints`` of the parts,
``cache_statistics`` the ``CacheStatistics`` of cold tables, ``cache_sizing`` their load factors, and
``report`` the predicted figures of a plan; ``baseline`` holds TorchRec's own planners for the unsplit
model (default, scale-up caches, all in HBM), what FAE is measured against.
"""

import importlib
import warnings

from planner.fae_planner import FAEShardingPlanner
from planner.topology import make_topology

__all__ = ["FAEShardingPlanner", "make_topology"]

#: Names release 0.1 exported here, by the module that holds them now.
_MOVED = {
    **dict.fromkeys(
        (
            "BaselinePlan",
            "default_planner",
            "dry_run",
            "hbm_planner",
            "scaleup_planner",
            "torchrec_default_plan",
        ),
        "planner.baseline",
    ),
    "cache_load_factors": "planner.cache_sizing",
    "AccessCacheStatistics": "planner.cache_statistics",
    "fae_constraints": "planner.constraints",
    **dict.fromkeys(("FAEPlanReport", "PartPlacement", "RankTotals"), "planner.report"),
}


def __getattr__(name: str):
    """Release 0.1's names, from their module, with a ``DeprecationWarning`` that says where."""
    if name not in _MOVED:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    warnings.warn(f"planner.{name} moved: import it from {_MOVED[name]}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)
