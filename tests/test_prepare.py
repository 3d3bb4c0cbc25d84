"""``prepare_data``: what it reads, and the hot set its partition records, which a split module of another
hot set cannot train from (refused alike on every rank, before any step)."""

import json
from pathlib import Path

import pytest
from torchrec.datasets.random import RandomRecDataset

from fae_torchrec import FAEEmbeddingBagCollection, prepare_data
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from tests.distributed import run_on_ranks

BATCH = 64


def test_a_path_is_refused_naming_what_prepare_data_reads(tmp_path, small_tables):
    with pytest.raises(
        TypeError, match=r"BlockSource or an iterable of TorchRec Batches, not a builtins\.str"
    ):
        prepare_data("train.txt", small_tables, tmp_path, sample=0.1, batch_size=BATCH, hot_budget=1 << 10)
    assert not any(tmp_path.iterdir()), "nothing written"


def test_an_endless_torchrec_dataset_needs_a_number_of_batches(tmp_path, small_tables):
    dataset = RandomRecDataset(["a", "b"], batch_size=BATCH, hash_size=10, ids_per_feature=1, num_dense=2)
    with pytest.raises(ValueError, match=r"RandomRecDataset is endless .*give prepare_data num_batches="):
        prepare_data(dataset, small_tables, tmp_path, sample=0.1, batch_size=BATCH, hot_budget=1 << 10)
    assert not any(tmp_path.iterdir()), "nothing written"


def _another_hot_set_is_refused(rank: int, world_size: int, directory: str) -> None:
    data = SyntheticCriteo(4000 * world_size, batch_size=1024, scale=0.0005, seed=3)
    tables = data.table_configs(8)
    prepared = prepare_data(data, tables, directory, sample=0.2, batch_size=BATCH, hot_budget=8 << 10)
    assert json.loads((Path(directory) / "partition.json").read_text())["hot_set"] == prepared.hot_set.digest
    assert prepared.partition.hot_set_digest == prepared.hot_set.digest
    larger = prepared.stats.hot_set(32 << 10)
    assert larger.total_hot > prepared.hot_set.total_hot
    wrong = FAEEmbeddingBagCollection(tables, larger)
    with pytest.raises(ValueError, match=f"another hot set \\(digest {prepared.hot_set.digest}\\)"):
        BatchRouter(prepared.partition, BATCH, world_size, rank, split=wrong.split)
    right = FAEEmbeddingBagCollection(tables, prepared.hot_set)
    router = BatchRouter(prepared.partition, BATCH, world_size, rank, split=right.split)
    assert any(routed.hot for routed in router.epoch(0))


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_split_module_of_another_hot_set_is_refused_on_every_rank(tmp_path, world_size):
    run_on_ranks(_another_hot_set_is_refused, world_size, tmp_path, str(tmp_path / "partition"))


def test_a_partition_without_its_hot_set_digest_is_refused(tmp_path):
    data = SyntheticCriteo(2000, batch_size=1024, scale=0.0005, seed=3)
    prepare_data(data, data.table_configs(8), tmp_path, sample=0.2, batch_size=BATCH, hot_budget=8 << 10)
    meta = tmp_path / "partition.json"
    described = json.loads(meta.read_text())
    del described["hot_set"]
    meta.write_text(json.dumps(described))
    with pytest.raises(ValueError, match="no digest of its hot set; the partition was written by an older"):
        HotColdPartition.open(tmp_path)
