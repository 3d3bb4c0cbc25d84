"""``prepare_data``: what it reads, and the hot set its partition records, which a split module of another
hot set cannot train from (refused alike on every rank, before any step)."""

import dataclasses
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from torchrec.datasets.random import RandomRecDataset

from fae_torchrec import FAEEmbeddingBagCollection, prepare_data
from fae_torchrec.data import CriteoNpyReader, SyntheticCriteo, SyntheticTaobao
from fae_torchrec.data.block import SampleBlock
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.prepare import _shares, repartition
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


def test_a_partition_without_its_hot_set_digest_or_with_cold_ids_of_before_is_refused(tmp_path):
    """A partition written before the cold part kept every row at its id numbered the cold rows among
    themselves: its part ids would train other rows."""
    data = SyntheticCriteo(2000, batch_size=1024, scale=0.0005, seed=3)
    prepare_data(data, data.table_configs(8), tmp_path, sample=0.2, batch_size=BATCH, hot_budget=8 << 10)
    meta = tmp_path / "partition.json"
    written = json.loads(meta.read_text())
    assert written["cold_ids"] == "original"
    for field, message in (
        ("hot_set", "no digest of its hot set"),
        ("cold_ids", "no cold ids kept as the original"),
    ):
        described = dict(written)
        del described[field]
        meta.write_text(json.dumps(described))
        with pytest.raises(ValueError, match=f"{message}.*; the partition was written by an older"):
            HotColdPartition.open(tmp_path)


#: A re-partition's options: label balance, and blocks small enough for each rank to hold some.
AGAIN = {"balance": 0.5, "seed": 3, "block_size": 4096}


DAYS = (slice(0, 11_000), slice(11_000, None))


def _write_days(folder: Path) -> None:
    """The synthetic data's inputs as two npy days of uneven length (written once, before any rank
    reads them)."""
    block = SampleBlock.concat(list(SyntheticCriteo(30_000, scale=0.002, seed=2).raw_blocks()))
    for day, rows in enumerate(DAYS):
        np.save(folder / f"day_{day}_dense.npy", np.expm1(block.dense[rows]))
        np.save(folder / f"day_{day}_sparse.npy", block.ids[rows])
        np.save(folder / f"day_{day}_labels.npy", block.labels[rows, None])


def _sources(folder: Path) -> dict:
    """Sources of known size (each rank profiles and partitions its share), and how they are split:
    synthetic Criteo, its npy days (:func:`_write_days`), TBSM samples (split by time)."""
    data = SyntheticCriteo(30_000, scale=0.002, seed=2)
    days = [folder / f"day_{day}" for day in range(len(DAYS))]
    return {
        "synthetic": (data, {"val_every": 7, "exclude_profiled": True, "balance": 0.5}),
        "npy": (CriteoNpyReader(days, table_sizes=data.table_sizes), {"val_every": 0}),
        "taobao": (
            SyntheticTaobao(3000, scale=0.01, ts_length=3, seed=1),
            {"val_every": None, "balance": 1.0},
        ),
    }


def _prepared(source, directory: Path, options: dict):
    tables = source.table_configs(4)
    return prepare_data(source, tables, directory, sample=0.1, batch_size=BATCH, hot_budget=16 << 10,
                        seed=5, **options)  # fmt: skip


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def _contents(directory: Path) -> dict[str, object]:
    """What a partition holds, however many files hold it: its arrays (read whole) and description."""
    partition = HotColdPartition.open(directory)
    described = json.loads((directory / "partition.json").read_text())
    described.pop("shares", None)
    arrays = {
        f"{part}_{field}": np.asarray(getattr(partition.part(part), field)).tobytes()
        for part in ("hot", "cold")
        for field in ("dense", "ids", "labels", "part_ids")
    }
    return arrays | {"is_hot": np.asarray(partition.is_hot).tobytes(), "described": described}


def _same_as_one_process(rank: int, world_size: int, tmp_path: Path) -> None:
    for name, (source, options) in _sources(tmp_path / "data").items():
        assert not any(share.empty for share in _shares(source)), name  # every rank writes its share
        ours = _prepared(source, tmp_path / f"{name}-{world_size}", options)
        one = pickle.loads((tmp_path / f"{name}.pkl").read_bytes())
        assert ours.hot_set.digest == one.hot_set.digest, name
        for mine, theirs in zip(
            ours.stats.seen_rows + ours.stats.seen_counts,
            one.stats.seen_rows + one.stats.seen_counts,
            strict=True,
        ):
            np.testing.assert_array_equal(mine, theirs)
        assert (ours.stats.num_inputs, ours.stats.num_sampled) == (
            one.stats.num_inputs,
            one.stats.num_sampled,
        )
        for field in ("rows", "owners", "num_inputs"):
            np.testing.assert_array_equal(
                getattr(ours.stats.holdout, field), getattr(one.stats.holdout, field)
            )
        for field in ("dense", "ids", "labels") if one.validation else ():
            np.testing.assert_array_equal(getattr(ours.validation, field), getattr(one.validation, field))
        assert _contents(tmp_path / f"{name}-{world_size}") == _contents(tmp_path / f"{name}-1"), name
        shares = json.loads((tmp_path / f"{name}-{world_size}" / "partition.json").read_text())["shares"]
        assert shares == [f"share-{r}" for r in range(world_size)], "each rank wrote files of its own"
        chosen, hot_set = pickle.loads((tmp_path / f"{name}-again.pkl").read_bytes())
        repartition(ours.partition, chosen, hot_set, tmp_path / f"{name}-again-{world_size}", **AGAIN)
        assert _contents(tmp_path / f"{name}-again-{world_size}") == _contents(
            tmp_path / f"{name}-again-1"
        ), name


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_profiles_and_partitions_its_share_as_one_process_would(tmp_path, world_size):
    """Two or three ranks, each profiling and partitioning its share of the data, make what one process
    makes of all of it: the same counts, holdout, validation set, hot set, and partition arrays byte for
    byte (label balance and inputs kept out of training included), each rank's share in files of its
    own; and so does a re-partition of a part of the inputs against another hot set."""
    (tmp_path / "data").mkdir()
    _write_days(tmp_path / "data")
    for name, (source, options) in _sources(tmp_path / "data").items():
        one = _prepared(source, tmp_path / f"{name}-1", options)
        assert (one.validation is None) == (options["val_every"] == 0), name
        assert len(one.partition.hot) > 0 < len(one.partition.cold), name
        kept = dataclasses.replace(one, partition=None)
        (tmp_path / f"{name}.pkl").write_bytes(pickle.dumps(kept))
        chosen = np.random.default_rng(1).random(len(one.partition.is_hot)) < 0.6  # as a re-plan's rest
        hot_set = one.stats.hot_set(4 << 10)
        repartition(one.partition, chosen, hot_set, tmp_path / f"{name}-again-1", **AGAIN)
        (tmp_path / f"{name}-again.pkl").write_bytes(pickle.dumps((chosen, hot_set)))
    run_on_ranks(_same_as_one_process, world_size, tmp_path, tmp_path)


def _prepare_small(rank: int, world_size: int, directory: Path) -> None:
    data = SyntheticCriteo(20_000, batch_size=1024, scale=0.0005, seed=3)  # a share for each of 2 ranks
    prepared = prepare_data(data, data.table_configs(8), directory, sample=0.2, batch_size=BATCH,
                            hot_budget=8 << 10, val_every=5)  # fmt: skip
    assert len(prepared.validation) == 4000


def _listed(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


def test_a_partition_written_again_by_another_number_of_ranks_leaves_none_of_the_earlier_files(tmp_path):
    """Each rank's share of a partition, and of the validation inputs, lies in files of its own; a
    partition written again, by one rank or several, replaces every file of the one before."""
    directory = tmp_path / "partition"
    _prepare_small(0, 1, directory)
    one = _listed(directory)
    assert "hot_ids.npy" in one and not any(name.startswith(("share-", "validation")) for name in one)
    before = _contents(directory)
    run_on_ranks(_prepare_small, 2, tmp_path, directory)
    two = _listed(directory)
    assert not any(name.endswith(".npy") and "/" not in name for name in two), "one process's files gone"
    for share in ("share-0", "share-1"):
        assert {f"{share}/hot_ids.npy", f"validation/{share}/ids.npy"} <= two
    assert _contents(directory) == before
    _prepare_small(0, 1, directory)
    assert _listed(directory) == one and _contents(directory) == before


def test_a_partition_whose_shares_disagree_is_refused_as_damaged(tmp_path):
    directory = tmp_path / "partition"
    run_on_ranks(_prepare_small, 2, tmp_path, directory)
    labels = directory / "share-1" / "cold_labels.npy"
    np.save(labels, np.load(labels).astype(np.float64))
    with pytest.raises(ValueError, match=r"partition: damaged partition: rows of float64 \(\) cannot follow"):
        HotColdPartition.open(directory)


def test_a_holdout_bound_that_does_not_hold_profiles_again_without_it(tmp_path, monkeypatch):
    """Where the holdout's bound keeps too few inputs (forced here by a margin far below 0), the
    profile is made again without it: the statistics and partition are those of a bound that holds."""
    _write_days(tmp_path)
    source, options = _sources(tmp_path)["synthetic"]
    held = _prepared(source, tmp_path / "held", options)
    assert held.stats.holdout.num_inputs > 6000, "more inputs than the forced bound below keeps (5,132)"
    monkeypatch.setattr("fae_torchrec.stats.profiler.HOLDOUT_MARGIN", -300.0)
    again = _prepared(source, tmp_path / "again", options)
    for field in ("rows", "owners", "num_inputs"):
        np.testing.assert_array_equal(getattr(again.stats.holdout, field), getattr(held.stats.holdout, field))
    assert _files(tmp_path / "again") == _files(tmp_path / "held")
