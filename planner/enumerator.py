"""``OrderedEnumerator``: TorchRec's ``EmbeddingEnumerator`` with a plan that does not depend on hashing.

TorchRec's enumerator intersects a constraint's sharding types and compute kernels with the sharder's
as Python sets, so the order of the sharding options, and with it which of two equally good options
the proposers and the partitioner keep, changes with ``PYTHONHASHSEED``. A resumed run would then plan
another layout than the one its checkpoint holds. This enumerator keeps the sharder's own order.
"""

from __future__ import annotations

from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

from fae_torchrec.torchrec_compat import EnumeratorFilterHooks


class OrderedEnumerator(EnumeratorFilterHooks, EmbeddingEnumerator):
    """``EmbeddingEnumerator`` whose filtered sharding types and kernels keep the sharder's order."""

    def kept_sharding_types(self, kept: list[str], allowed: list[str]) -> list[str]:
        return sorted(kept, key=allowed.index)

    def kept_compute_kernels(self, kept: list[str], allowed: list[str]) -> list[str]:
        return sorted(kept, key=allowed.index)
