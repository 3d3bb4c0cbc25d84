"""The FAE sharding planner for TorchRec: hot rows on HBM, cold rows in UVM-cached tables.

``FAEShardingPlanner`` plans models built with ``fae_torchrec.FAEEmbeddingBagCollection`` on top of
TorchRec's ``EmbeddingShardingPlanner``: ``constraints`` writes the ``ParameterConstraints`` of the
parts, ``cache_statistics`` the ``CacheStatistics`` of cold tables, ``cache_sizing`` their load
factors, and ``report`` the predicted figures of a plan; ``topology`` builds a ``Topology`` through
TorchRec's ``TopologyFactory``. ``baseline`` holds TorchRec's own planners for the unsplit model
(default, scale-up caches, all in HBM), what FAE is measured against.
"""

from planner.baseline import (
    BaselinePlan,
    default_planner,
    dry_run,
    hbm_planner,
    scaleup_planner,
    torchrec_default_plan,
)
from planner.cache_sizing import cache_load_factors
from planner.cache_statistics import AccessCacheStatistics
from planner.constraints import fae_constraints
from planner.fae_planner import FAEShardingPlanner
from planner.report import FAEPlanReport, PartPlacement, RankTotals
from planner.topology import make_topology

__all__ = [
    "AccessCacheStatistics",
    "BaselinePlan",
    "FAEPlanReport",
    "FAEShardingPlanner",
    "PartPlacement",
    "RankTotals",
    "cache_load_factors",
    "default_planner",
    "dry_run",
    "fae_constraints",
    "hbm_planner",
    "make_topology",
    "scaleup_planner",
    "torchrec_default_plan",
]
