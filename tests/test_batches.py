"""The TorchRec data path: ``Batch``es read once into a spool (what is refused, and why), ``prepare_data``
over them (every rank's inputs, in rank order, or rank 0's; the partition directory shared), the hot
budget counted with the embedding optimizer's state, and the router's batches epoch after epoch."""

import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import BatchRouter, FAEEmbeddingBagCollection, prepare_data
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.batches import BatchSource, spool_batches
from fae_torchrec.data.block import SampleBlock
from tests.distributed import run_on_ranks

BATCH = 8


def _block(small_tables, n: int, seed: int, ids_per_feature=(1, 1, 1, 1)) -> SampleBlock:
    rng = np.random.default_rng(seed)
    rows = np.repeat([10, 20, 30, 30], ids_per_feature)
    return SampleBlock(
        rng.normal(size=(n, 2)).astype(np.float32),
        (rng.random((n, len(rows))) ** 4 * rows).astype(np.int64),  # skewed: low ids are popular
        rng.integers(0, 2, n).astype(np.int32),
        tuple(ids_per_feature),
    )


def _batches(small_tables, count: int, seed: int = 0, ids_per_feature=(1, 1, 1, 1)) -> list[Batch]:
    keys = [f for t in small_tables for f in t.feature_names]
    return [
        _block(small_tables, BATCH, seed * 1000 + i, ids_per_feature).to_batch(keys) for i in range(count)
    ]


def test_batches_spool_to_the_same_inputs_in_the_tables_feature_order(tmp_path, small_tables):
    """Multi-hot features of a fixed length are kept; keys in another order are put in the tables'; an
    empty batch adds nothing."""
    blocks = [_block(small_tables, n, i, (2, 1, 3, 1)) for i, n in enumerate([0, BATCH, BATCH, BATCH])]
    batches = [block.to_batch(["a", "b", "c1", "c2"]) for block in blocks]
    reordered = [Batch(b.dense_features, b.sparse_features.permute([3, 2, 0, 1]), b.labels) for b in batches]
    assert reordered[0].sparse_features.keys() == ["c2", "c1", "a", "b"]
    assert spool_batches(iter(reordered), small_tables, tmp_path / "spool", num_batches=3) == 2 * BATCH
    source = BatchSource([tmp_path / "spool"], small_tables)
    read = SampleBlock.concat(list(source.raw_blocks()))
    expected = SampleBlock.concat(blocks[1:3])
    for field in ("dense", "ids", "labels"):
        np.testing.assert_array_equal(getattr(read, field), getattr(expected, field))
    assert read.ids_per_feature == (2, 1, 3, 1) and source.num_dense == 2
    assert isinstance(read.ids, np.memmap), "the second read pages the spool in"


def _jagged(batch: Batch) -> Batch:
    """``batch`` with feature b's first input one id longer (and c1's first input one id shorter)."""
    features = batch.sparse_features
    lengths = features.lengths().clone()
    lengths[BATCH] += 1  # b, input 0
    lengths[2 * BATCH] -= 1  # c1, input 0
    return Batch(batch.dense_features, KeyedJaggedTensor(features.keys(), features.values(), lengths=lengths),
                 batch.labels)  # fmt: skip


def _with(batch: Batch, **fields) -> Batch:
    return Batch(**{"dense_features": batch.dense_features, "sparse_features": batch.sparse_features,
                    "labels": batch.labels, **fields})  # fmt: skip


def _bad_dense(batch: Batch) -> Batch:
    dense = batch.dense_features.clone()
    dense[3, 1] = float("nan")
    return _with(batch, dense_features=dense)


def _bad_label(batch: Batch) -> Batch:
    labels = batch.labels.float()
    labels[5] = 0.5
    return _with(batch, labels=labels)


def _renamed(batch: Batch) -> Batch:
    features = batch.sparse_features
    keys = ["a", "b", "c1", "x"]
    return _with(
        batch, sparse_features=KeyedJaggedTensor(keys, features.values(), lengths=features.lengths())
    )


def _weighted(batch: Batch) -> Batch:
    features = batch.sparse_features
    weighted = KeyedJaggedTensor(
        features.keys(), features.values(), torch.ones(len(features.values())), lengths=features.lengths()
    )
    return _with(batch, sparse_features=weighted)


def _out_of_range(batch: Batch) -> Batch:
    features = batch.sparse_features
    values = features.values().clone()
    values[BATCH + 2] = 20  # b's table has 20 rows
    return _with(
        batch, sparse_features=KeyedJaggedTensor(features.keys(), values, lengths=features.lengths())
    )


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_jagged, r"^batch 1, feature b: from 1 to 2 ids per input; .*fixed length"),
        (_bad_dense, r"^batch 1, dense column 1 \(input 3\): nan is not a finite number"),
        (_bad_label, r"^batch 1, labels \(input 5\): 0\.5 is not 0 or 1"),
        (_renamed, r"^batch 1: its features .* are not the tables' .*missing \['c2'\], unknown \['x'\]"),
        (_weighted, r"^batch 1: weighted features"),
        (_out_of_range, r"^batch 1, feature b \(table t_b\): id 20 out of range \[0, 20\)"),
    ],
)  # fmt: skip
def test_a_batch_that_does_not_fit_is_refused_naming_the_batch_and_the_feature(
    tmp_path, small_tables, spoil, message
):
    batches = _batches(small_tables, 3)
    batches[1] = spoil(batches[1])
    with pytest.raises(ValueError, match=message):
        spool_batches(batches, small_tables, tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no finished spool"):
        BatchSource([tmp_path], small_tables)


def test_a_feature_that_changes_its_number_of_ids_is_refused(tmp_path, small_tables):
    batches = _batches(small_tables, 2) + _batches(small_tables, 1, ids_per_feature=(1, 2, 1, 1))
    with pytest.raises(ValueError, match=r"^batch 2, feature b: 2 ids per input where batch 0 has 1"):
        spool_batches(batches, small_tables, tmp_path)


def test_prepare_data_reads_batches_as_it_reads_the_same_data_as_a_source(tmp_path):
    """The same inputs as Batches or as a BlockSource: the same statistics, hot set and partition; the
    spool is removed once the partition is written."""
    data = SyntheticCriteo(3000, batch_size=500, scale=0.0005, seed=2)
    tables = data.table_configs(8)
    common = {"sample": 0.3, "batch_size": 64, "hot_budget": 4 << 10, "val_every": 7}
    of_source = prepare_data(data, tables, tmp_path / "source", **common)
    of_batches = prepare_data(iter(data), tables, tmp_path / "batches", **common)
    assert of_batches.hot_set.digest == of_source.hot_set.digest
    assert of_batches.stats.num_inputs == of_source.stats.num_inputs == 3000 * 6 // 7 + (3000 * 6 % 7 > 0)
    np.testing.assert_array_equal(of_batches.partition.is_hot, of_source.partition.is_hot)
    np.testing.assert_array_equal(of_batches.validation.labels, of_source.validation.labels)
    assert not (tmp_path / "batches" / "batches").exists()
    with pytest.raises(ValueError, match="num_batches and each_rank are for an iterable of Batches"):
        prepare_data(data, tables, tmp_path / "x", num_batches=3, **common)


def test_the_hot_budget_counts_the_embedding_optimizers_state(tmp_path):
    data = SyntheticCriteo(3000, batch_size=500, scale=0.0005, seed=2)
    tables = data.table_configs(4)  # RowWiseAdagrad's float a row: a quarter more
    budget = 2 << 10
    sgd = prepare_data(data, tables, tmp_path / "sgd", sample=0.3, batch_size=64, hot_budget=budget)
    adagrad = prepare_data(
        data, tables, tmp_path / "adagrad", sample=0.3, batch_size=64, hot_budget=budget,
        optimizer_class=RowWiseAdagrad,
    )  # fmt: skip
    assert adagrad.hot_set.digest == adagrad.stats.hot_set(budget, RowWiseAdagrad).digest
    assert adagrad.hot_set.hot_bytes(RowWiseAdagrad) <= budget < sgd.hot_set.hot_bytes(RowWiseAdagrad)
    assert adagrad.hot_set.total_hot < sgd.hot_set.total_hot


def test_the_router_gives_its_batches_epoch_after_epoch(tmp_path, small_tables):
    prepared = prepare_data(
        _batches(small_tables, 6), small_tables, tmp_path, sample=0.5, batch_size=BATCH, hot_budget=400
    )
    module = FAEEmbeddingBagCollection(small_tables, prepared.hot_set)
    router = BatchRouter(prepared.partition, BATCH, order="shuffled", split=torch.nn.Sequential(module))
    per_epoch = [[routed.batch for routed in router.epoch(epoch)] for epoch in range(3)]
    assert sum(batch.sparse_features.is_hot for batch in per_epoch[0]) not in (0, len(per_epoch[0]))
    endless = router.batches()
    for batch in [*per_epoch[0], *per_epoch[1], *per_epoch[2]]:
        served = next(endless)
        torch.testing.assert_close(served.dense_features, batch.dense_features)
        assert served.sparse_features.is_hot == batch.sparse_features.is_hot
    assert len(list(router.batches(epochs=2, start_epoch=1))) == len(per_epoch[1]) + len(per_epoch[2])
    with pytest.raises(ValueError, match="the Linear holds no FAEEmbeddingBagCollection"):
        BatchRouter(prepared.partition, BATCH, split=torch.nn.Linear(1, 1))


def _each_rank(rank: int, world_size: int, tmp_path: Path, small_tables) -> None:
    """Every rank's batches trained (in rank order), or rank 0's; a bad batch, another rank's spool
    out of reach and a partition a rank cannot open are raised on every rank, naming rank and host."""
    mine = _batches(small_tables, 5, seed=rank)
    union = prepare_data(
        iter(mine), small_tables, tmp_path / "union", sample=0.5, batch_size=BATCH, hot_budget=400
    )
    inputs = SampleBlock.concat(list(union.partition.inputs(np.ones(len(union.partition.is_hot), bool))))
    every = SampleBlock.concat([_block(small_tables, BATCH, r * 1000 + i) for r in range(world_size)
                                for i in range(5)])  # fmt: skip
    np.testing.assert_array_equal(inputs.dense, every.dense)
    first = prepare_data(  # the other ranks' data is not looked at
        mine if rank == 0 else None, small_tables, tmp_path / "first", sample=0.5, batch_size=BATCH,
        hot_budget=400, each_rank=False,
    )  # fmt: skip
    assert len(first.partition.is_hot) == 5 * BATCH
    host = socket.gethostname()
    spoiled = [*mine[:3], _bad_label(mine[3])] if rank == 1 else mine
    with pytest.raises(ValueError, match=rf"^rank 1 \(host {host}\): batch 3, labels \(input 5\)"):
        prepare_data(spoiled, small_tables, tmp_path / "bad", sample=0.5, batch_size=BATCH, hot_budget=400)

    def failing():
        yield from mine[:2]
        raise RuntimeError("the loader broke")

    with pytest.raises(ValueError, match=rf"^rank 1 \(host {host}\): RuntimeError: the loader broke"):
        prepare_data(failing() if rank == 1 else mine, small_tables, tmp_path / "broke", sample=0.5,
                     batch_size=BATCH, hot_budget=400)  # fmt: skip
    own = tmp_path / f"own-{rank}"  # each rank its own directory: as if not shared across nodes
    with pytest.raises(ValueError, match=rf"^rank 0 \(host {host}\): cannot read the batches another rank"):
        prepare_data(mine, small_tables, own, sample=0.5, batch_size=BATCH, hot_budget=400)
    with pytest.raises(ValueError, match=rf"^rank 1 \(host {host}\): cannot read the batches another rank"):
        prepare_data(mine, small_tables, own, sample=0.5, batch_size=BATCH, hot_budget=400, each_rank=False)


def test_each_rank_contributes_its_batches_to_one_partition(tmp_path, small_tables):
    run_on_ranks(_each_rank, 2, tmp_path, tmp_path, small_tables)


def test_what_prepare_data_refuses_or_warns_about(tmp_path, small_tables, caplog):
    """A stream shorter than num_batches is read whole, with a warning; an item that is no Batch, a
    source's own split asked of Batches, and statistics of other tables are refused; a failure leaves no
    spool behind."""
    batches = _batches(small_tables, 5)
    common = {"sample": 0.5, "batch_size": BATCH, "hot_budget": 400}
    prepared = prepare_data(batches, small_tables, tmp_path / "short", num_batches=9, **common)
    assert len(prepared.partition.is_hot) == 5 * BATCH
    assert "num_batches=9, but the batches ended after 5" in caplog.text
    with pytest.raises(ValueError, match=r"batch 1: a tuple, not a torchrec.datasets.utils.Batch"):
        prepare_data([batches[0], (1, 2)], small_tables, tmp_path / "tuple", **common)
    with pytest.raises(ValueError, match="val_every=None keeps a BlockSource's own split"):
        prepare_data(batches, small_tables, tmp_path / "split", val_every=None, **common)
    other = [t.__class__(**{**t.__dict__, "num_embeddings": t.num_embeddings + 1}) for t in small_tables]
    stats = prepare_data(_batches(other, 5), other, tmp_path / "other", **common).stats
    with pytest.raises(ValueError, match=r"^stats: statistics are for other tables: table #0"):
        prepare_data(batches, small_tables, tmp_path / "mixed", stats=stats, **common)
    assert not (tmp_path / "mixed" / "batches").exists(), "the spools are removed after a failure too"
