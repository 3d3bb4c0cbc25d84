"""FAE (Frequently Accessed Embeddings) for TorchRec, in three stages.

1. ``fae_torchrec.stats``: profile a sample of the inputs and choose the hot rows (``AccessProfiler``,
   ``AccessStats``, ``HotSet``, hot-input share estimates).
2. ``fae_torchrec.modules``: split embedding tables into hot and cold parts
   (``FAEEmbeddingBagCollection``), which the top-level ``planner`` package places for
   ``DistributedModelParallel``.
3. ``fae_torchrec.train``: prepare the data once (``prepare_data``: profile, hot set, the inputs split into
   entirely-hot and other ones) and train with a router whose hot mini-batches run the hot part only, on
   TorchRec's train pipelines (``FAETrainPipeline``).

Here are the names a TorchRec training script needs (docs/adopt.md); the others live in their stage's
package (``fae_torchrec.stats``, ``fae_torchrec.modules``, ``fae_torchrec.train``, ``fae_torchrec.data``).
Importing the package loads no torch (each name is imported where first used: a command's ``--help``
answers at once), draws nothing and configures nothing (no plotting backend, no logging), but for one
thing, and only where torch is not loaded yet and no wait policy is set: OpenMP's idle threads spin
for about 0.1 ms instead of 3 ms before they sleep (``fae_torchrec.threads``: a spinning pool slows every
process of a busy machine).
"""

from fae_torchrec.threads import bound_spinning

bound_spinning()  # before anything loads torch, and with it OpenMP

# isort: split
import importlib

#: The names a TorchRec training script needs, by the package that holds them, imported when first
#: used: a command's ``--help`` (``fae_torchrec.cli``, the examples) then answers without loading torch.
_EXPORTED = {
    "fae_torchrec.modules": ("FAEEmbeddingBagCollection",),
    "fae_torchrec.stats": ("AccessProfiler", "AccessStats", "HotSet"),
    "fae_torchrec.train": (
        "BatchRouter", "Checkpoints", "EmbeddingOptimizer", "FAEPrefetchTrainPipeline", "FAETrainPipeline",
        "HotColdPartition", "evaluate", "prepare_data", "train_step", "unfused_optimizer",
    ),
}  # fmt: skip
_HOME = {name: package for package, names in _EXPORTED.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    """The names above, from their package."""
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'fae_torchrec' has no attribute {name!r}")
