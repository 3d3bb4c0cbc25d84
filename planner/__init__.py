"""The FAE sharding planner for TorchRec: hot rows on HBM, cold rows in UVM-cached tables.

``FAEShardingPlanner`` plans models built with ``fae_torchrec.FAEEmbeddingBagCollection`` on top of
TorchRec's ``EmbeddingShardingPlanner``: ``constraints`` writes the ``ParameterConstraints`` of the
parts, ``cache_statistics`` the ``CacheStatistics`` of cold tables, ``cache_sizing`` their load
factors, and ``report`` the predicted figures of a plan.
"""

from planner.baseline import torchrec_default_plan
from planner.cache_sizing import cache_load_factors
from planner.cache_statistics import AccessCacheStatistics
from planner.constraints import fae_constraints
from planner.fae_planner import FAEShardingPlanner
from planner.report import FAEPlanReport, PartPlacement, RankTotals

__all__ = [
    "AccessCacheStatistics",
    "FAEPlanReport",
    "FAEShardingPlanner",
    "PartPlacement",
    "RankTotals",
    "cache_load_factors",
    "fae_constraints",
    "torchrec_default_plan",
]
