"""Shared fixtures: small table configs, the real Criteo samples in ../shared and the real Taobao slice
named by ``FAE_TAOBAO_CSV`` (tests skip when they are absent)."""

from __future__ import annotations

# first: importing fae_torchrec sets OpenMP's wait policy before torch loads (fae_torchrec.threads)
from fae_torchrec.cli import main

# isort: split
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.stats import AccessStats
from fae_torchrec.threads import intra_op_threads

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def pytest_configure(config: pytest.Config) -> None:
    """Share the cores among pytest-xdist's workers: the cores this process may use, divided among the
    workers, in the worker and in the ranks and commands it starts (``OMP_NUM_THREADS``). Each process's
    default of one thread per core would put several pools on every core, which slows rank-heavy tests up
    to twice. An ``OMP_NUM_THREADS`` the caller set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = intra_op_threads(workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


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


def dense_counts(stats: AccessStats) -> list[np.ndarray]:
    """Per table, the count of every row of ``stats`` (0 where the sample saw none)."""
    dense = [np.zeros(config.num_embeddings, np.int64) for config in stats.tables]
    for counts, ids, seen in zip(dense, stats.seen_rows, stats.seen_counts, strict=True):
        counts[ids] = seen
    return dense


def exits_2(argv: list[str], capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> str:
    """Run ``fae-torchrec`` on ``argv``; assert exit status 2 and return what it reported."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return caplog.text + capsys.readouterr().err
