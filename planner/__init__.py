"""The FAE sharding planner for TorchRec: hot rows on HBM, cold rows in UVM-cached tables.

``FAEShardingPlanner`` plans models built with ``fae_torchrec.FAEEmbeddingBagCollection`` on top of
TorchRec's ``EmbeddingShardingPlanner``; ``make_topology`` builds a ``Topology`` through TorchRec's
``TopologyFactory``. The modules: ``constraints`` writes the ``ParameterConstraints`` of the parts,
``cache_statistics`` the ``CacheStatistics`` of cold tables, ``cache_sizing`` their load factors, and
``report`` the predicted figures of a plan; ``baseline`` holds TorchRec's own planners for the unsplit
model (default, scale-up caches, all in HBM), what FAE is measured against.
"""

from planner.fae_planner import FAEShardingPlanner
from planner.topology import make_topology

__all__ = ["FAEShardingPlanner", "make_topology"]
