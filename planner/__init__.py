"""The FAE sharding planner for TorchRec (hot rows on HBM, cold rows UVM-cached).

Built on ``torchrec.distributed.planner`` in the next step of the project; it consumes the
``AccessStats`` and ``HotSet`` of :mod:`fae_torchrec`.
"""
