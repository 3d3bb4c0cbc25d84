"""Shared fixtures: small table configs, the real Criteo samples in ../shared and the real Taobao slice
named by ``FAE_TAOBAO_CSV`` (tests skip when they are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def realdata(relative: str) -> Path:
    """A file under ``../shared/realdata``; skip the test with the reason when it is absent."""
    path = REALDATA / relative
    if not path.exists():
        pytest.skip(f"real data sample not available: {path} (research-only, kept in ../shared)")
    return path


def taobao_slice() -> Path:
    """The real Taobao slice (``UserBehavior.csv``) at ``$FAE_TAOBAO_CSV``; skip the test when it is unset
    or not a file (its terms forbid keeping a copy anywhere shared: each user fetches it)."""
    path = os.environ.get("FAE_TAOBAO_CSV")
    if not path or not os.path.isfile(path):
        pytest.skip(
            "set FAE_TAOBAO_CSV to UserBehavior.csv fetched as ../shared/realdata/taobao_userbehavior_2h/"
            "PROVENANCE.md says (docs/data.md)" + (f" (not a file: {path})" if path else "")
        )
    return Path(path)


@pytest.fixture
def small_tables() -> list[EmbeddingBagConfig]:
    """Three tables; the last one is read by two features (a shared table)."""
    return [
        EmbeddingBagConfig(name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
        EmbeddingBagConfig(name="t_b", embedding_dim=8, num_embeddings=20, feature_names=["b"]),
        EmbeddingBagConfig(name="t_c", embedding_dim=4, num_embeddings=30, feature_names=["c1", "c2"]),
    ]
