"""``OrderedEnumerator``: TorchRec's ``EmbeddingEnumerator`` with a plan that does not depend on hashing.

TorchRec's enumerator intersects a constraint's sharding types and compute kernels with the sharder's
as Python sets, so the order of the sharding options, and with it which of two equally good options
the proposers and the partitioner keep, changes with ``PYTHONHASHSEED``. A resumed run would then plan
another layout than the one its checkpoint holds. This enumerator keeps the sharder's own order.
"""

from __future__ import annotations

from torchrec.distributed.planner.enumerators import EmbeddingEnumerator


class OrderedEnumerator(EmbeddingEnumerator):
    """``EmbeddingEnumerator`` whose filtered sharding types and kernels keep the sharder's order."""

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        kept = super()._filter_sharding_types(name, allowed_sharding_types, sharder_key)
        return sorted(kept, key=allowed_sharding_types.index)

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        kept = super()._filter_compute_kernels(name, allowed_compute_kernels, sharding_type)
        return sorted(kept, key=allowed_compute_kernels.index)
