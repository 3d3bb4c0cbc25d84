"""Shared fixtures: small table configs and the real Criteo samples in ../shared (skipped if absent)."""

from __future__ import annotations

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


@pytest.fixture
def small_tables() -> list[EmbeddingBagConfig]:
    """Three tables; the last one is read by two features (a shared table)."""
    return [
        EmbeddingBagConfig(name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
        EmbeddingBagConfig(name="t_b", embedding_dim=8, num_embeddings=20, feature_names=["b"]),
        EmbeddingBagConfig(name="t_c", embedding_dim=4, num_embeddings=30, feature_names=["c1", "c2"]),
    ]
