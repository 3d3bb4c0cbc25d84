"""Recommendation models built on TorchRec's ``EmbeddingBagCollection``, beside TorchRec's own DLRM."""

from fae_torchrec.models.tbsm import TBSM

__all__ = ["TBSM"]
