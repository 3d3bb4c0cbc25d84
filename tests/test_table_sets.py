"""Table sizes chosen by ``--tables`` (Kaggle, Terabyte, MLPerf's 40M cap, a file) times ``--scale``,
defaulting by the data's name; unlabelled data refused where training and evaluation need labels."""

import argparse
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from fae_torchrec import AccessStats
from fae_torchrec.cli import main
from fae_torchrec.command_line import add_data_arguments
from fae_torchrec.data import CriteoNpyReader, CriteoTsvReader, npy_paths
from fae_torchrec.data.criteo import (
    KAGGLE_TABLE_SIZES,
    MLPERF_MAX_ROWS,
    TABLE_SETS,
    TERABYTE_TABLE_SIZES,
    read_table_sizes,
    scaled_table_sizes,
)
from fae_torchrec.recipes.sources import default_tables, open_source
from tests.conftest import realdata

DAY0_HEAD = "criteo_1tb_day0_head1k/criteoTab.csv"
KAGGLE_TEST = "criteo_kaggle_head10k/test_head10000.txt"
#: Terabyte tables of at least a million rows: 1,000 lines' values should not collide in them.
LARGE = [f for f, size in enumerate(TERABYTE_TABLE_SIZES) if size >= 1_000_000]


def _ids(reader) -> np.ndarray:
    return np.concatenate([b.ids for b in reader.raw_blocks()])


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_data_arguments(parser, num_samples=100, scale=1.0)
    return parser.parse_args(list(argv))


def test_terabyte_sizes_are_torchrecs_and_the_cap_is_mlperfs():
    packager = Path(importlib.util.find_spec("torchrec").origin).parent / "inference" / "dlrm_packager.py"
    listed = re.search(r'default="(45833188,[0-9,"\s]*)"', packager.read_text()).group(1)
    assert TERABYTE_TABLE_SIZES == tuple(int(s) for s in re.sub(r'["\s]', "", listed).split(","))
    assert sum(TERABYTE_TABLE_SIZES) == 177_944_275 and TERABYTE_TABLE_SIZES[19] == 48_937_457
    capped = TABLE_SETS["terabyte-40m"]
    assert max(capped) == MLPERF_MAX_ROWS
    assert [f for f in range(26) if capped[f] != TERABYTE_TABLE_SIZES[f]] == [0, 19, 21]


def test_terabyte_tables_keep_real_day0_values_apart():
    path = realdata(DAY0_HEAD)
    raw = _ids(CriteoTsvReader(path, table_sizes=(2**62,) * 26))  # no hashing: the raw values
    kaggle = _ids(CriteoTsvReader(path, table_sizes=KAGGLE_TABLE_SIZES))
    distinct = [len(np.unique(raw[:, f])) for f in range(26)]
    assert distinct[19] == 307 and len(np.unique(kaggle[:, 19])) == 4, "C20 on Kaggle's 4 rows"
    for tables in ("terabyte", "terabyte-40m"):
        ids = _ids(CriteoTsvReader(path, table_sizes=TABLE_SETS[tables]))
        assert [len(np.unique(ids[:, f])) for f in LARGE] == [distinct[f] for f in LARGE], tables
        assert np.array_equal(ids, raw % np.asarray(TABLE_SETS[tables]))


def test_tables_default_by_the_data_name_and_scale_multiplies(tmp_path):
    day = tmp_path / "day_0"
    day.symlink_to(realdata(DAY0_HEAD))
    assert default_tables(["criteo-tsv", str(day)]) == "terabyte"
    assert default_tables(["criteo-npy", str(tmp_path / "day_12"), str(tmp_path / "day_3/")]) == "terabyte"
    assert default_tables(["criteo-tsv", str(day), str(tmp_path / "train.txt")]) == "kaggle"
    assert default_tables(["criteo-tsv", str(tmp_path / "today_0")]) == "kaggle"
    assert default_tables(["synthetic"]) == "kaggle"
    source, _ = open_source(_args("--data", "criteo-tsv", str(day), "--scale", "0.5"), batch_size=64)
    assert source.table_sizes == scaled_table_sizes(0.5, TERABYTE_TABLE_SIZES)
    assert [t.num_embeddings for t in source.table_configs(8)] == list(source.table_sizes)
    source, _ = open_source(_args("--data", "criteo-tsv", str(day), "--tables", "kaggle"), batch_size=64)
    assert source.table_sizes == KAGGLE_TABLE_SIZES
    source, _ = open_source(_args("--tables", "terabyte-40m", "--scale", "0.001"), batch_size=64)
    assert source.table_sizes == scaled_table_sizes(0.001, TABLE_SETS["terabyte-40m"])
    assert next(iter(source)).sparse_features["cat_0"].values().max() < source.table_sizes[0]


def test_table_sizes_from_a_file(tmp_path):
    sizes = tmp_path / "sizes.txt"
    sizes.write_text(
        "# C1..C26\n" + ",".join(str(s) for s in range(1, 14)) + "\n" + " ".join("7" * 13) + "\n"
    )
    assert read_table_sizes(sizes) == (*range(1, 14), *(7,) * 13)
    source, _ = open_source(_args("--tables", str(sizes), "--scale", "2"), batch_size=8)
    assert source.table_sizes == (*range(2, 28, 2), *(14,) * 13)
    sizes.write_text("5\n" * 25)
    with pytest.raises(ValueError, match=r"sizes\.txt: 25 table sizes, expected 26"):
        read_table_sizes(sizes)
    sizes.write_text("5\n" * 3 + "12x\n" + "5\n" * 22)
    with pytest.raises(ValueError, match=r"sizes.txt:4: '12x' is not a table size"):
        open_source(_args("--tables", str(sizes)), batch_size=8)
    sizes.write_text("0\n" * 26)
    with pytest.raises(ValueError, match=r"--tables: .*sizes.txt:1: '0' is not a table size"):
        open_source(_args("--tables", str(sizes)), batch_size=8)


def test_profile_a_terabyte_day_with_terabyte_tables(tmp_path, capsys):
    day = tmp_path / "day_0"
    day.symlink_to(realdata(DAY0_HEAD))
    out = tmp_path / "stats.npz"
    main(["profile", "--data", "criteo-tsv", str(day), "--scale", "0.01", "--sample", "0.5",
          "--holdout", "200", "--budget", "64KiB", "--out", str(out)])  # fmt: skip
    stats = AccessStats.load(out)
    assert [t.num_embeddings for t in stats.tables] == list(scaled_table_sizes(0.01, TERABYTE_TABLE_SIZES))
    assert stats.num_inputs == 900, "the training inputs (--val-every 10)"
    assert "489,375" in capsys.readouterr().out, "C20's table, 0.01 x 48,937,457 rows, is printed"


def test_unlabelled_tsv_is_refused_for_training_but_profiled(tmp_path):
    path = realdata(KAGGLE_TEST)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: unlabelled data (39 fields per line")):
        next(CriteoTsvReader(path, require_labels=True).raw_blocks())
    source, _ = open_source(_args("--data", "criteo-tsv", str(path)), batch_size=4096, require_labels=True)
    with pytest.raises(ValueError, match="training and evaluation need labelled lines"):
        next(iter(source))
    main(["profile", "--data", "criteo-tsv", str(path), "--scale", "0.01", "--out", str(tmp_path / "s.npz")])
    assert AccessStats.load(tmp_path / "s.npz").num_inputs == 9_000, "every 10th held out (--val-every)"


def test_npy_labels_other_than_0_or_1_are_refused_for_training(tmp_path):
    prefix = tmp_path / "day_1"
    dense, sparse, labels = npy_paths(prefix)
    np.save(dense, np.zeros((10, 13), np.float32))
    np.save(sparse, np.arange(260, dtype=np.int64).reshape(10, 26))
    np.save(labels, np.array([[0], [1], [1], [0], [0], [0], [0], [-1], [0], [1]], np.int32))
    assert len(np.concatenate([b.labels for b in CriteoNpyReader(prefix).raw_blocks()])) == 10
    with pytest.raises(ValueError, match=r"day_1_labels\.npy: row 7 has label -1"):
        list(CriteoNpyReader(prefix, chunk_rows=4, require_labels=True).raw_blocks())
