"""Independent random streams from one seed, one stream per purpose.

numpy's ``SeedSequence`` pads its entropy with zeros, so ``default_rng([seed, 0])`` draws exactly the
numbers of ``default_rng(seed)``: a schedule seeded by ``[seed, epoch]`` replayed, in its first epoch,
the draws that made the synthetic data, and the profile's sample those of the data's first block.
Each purpose named here draws from its own spawn key of the seed instead, which neither
``default_rng(seed)`` nor ``default_rng([seed, ...])`` of fewer than five words reproduces.
"""

from __future__ import annotations

import numpy as np

#: The purposes and their spawn keys; a new purpose takes a new number (never 0, never one reused).
STREAMS = {"profile": 1, "schedule": 2, "holdout": 3, "balance": 4, "recent": 5, "upcoming": 6}


def generator(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """The generator of ``purpose`` (a key of ``STREAMS``) for ``seed``, independent of every other
    purpose's and of the data's; ``keys`` (such as an epoch) give further independent streams."""
    if purpose not in STREAMS:
        raise ValueError(f"unknown random stream {purpose!r}; choose from {sorted(STREAMS)}")
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(STREAMS[purpose], *keys)))
