"""Parquet and CSV click logs described by a schema (``--data parquet|csv FILE... --schema S``): ids
against an independent reference, the same training from Parquet, CSV and ``SampleBlock``s, profile ->
plan -> the DLRM example at 1 and 2 ranks, and every bad input refused with exit status 2 naming it."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import AccessStats
from fae_torchrec.cli import main
from fae_torchrec.data import SampleBlock, rebatch
from fae_torchrec.data.columnar import ColumnarSource
from fae_torchrec.data.hashing import fnv1a, hashed_rows
from fae_torchrec.data.schema import load_schema
from tests.columnar_data import (
    AVAZU_COLUMNS,
    FEATURES,
    SCHEMA,
    avazu_layout,
    avazu_like,
    reference,
    write_csv,
    write_parquet,
    write_schema,
)
from tests.columnar_data import (
    fnv1a as reference_fnv1a,
)
from tests.conftest import exits_2, realdata
from tests.distributed import run_launched

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_dlrm_fae.py"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """600 Avazu-like inputs as one Parquet file (row groups of 128), the same split in two Parquet
    files, as CSV, and their schema."""
    folder = tmp_path_factory.mktemp("avazu")
    table = avazu_like(600)
    return {
        "table": table,
        "parquet": write_parquet(table, folder / "train.parquet"),
        "parts": [write_parquet(table.slice(0, 250), folder / "a.parquet"),
                  write_parquet(table.slice(250), folder / "b.parquet")],
        "csv": write_csv(table, folder / "train.csv"),
        "schema": write_schema(folder / "avazu.toml"),
    }  # fmt: skip


def _read(kind, paths, schema, **chunks) -> SampleBlock:
    return SampleBlock.concat(list(ColumnarSource(kind, paths, load_schema(schema), 64, **chunks).blocks()))


def test_fnv1a_is_the_published_hash_in_every_process():
    """FNV-1a's published 64-bit values; and the same rows in a process with another hash seed (Python's
    own ``hash`` of text changes with it)."""
    assert fnv1a(pa.array(["", "a", "foobar"])).tolist() == [
        0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8
    ]  # fmt: skip
    assert fnv1a(pa.array([12, -3])).tolist() == fnv1a(pa.array(["12", "-3"])).tolist()
    words = [f"w{i:x}" * (i % 5) for i in range(200)]
    assert fnv1a(pa.array(words)).tolist() == [reference_fnv1a(w) for w in words]
    code = "import pyarrow as pa; from fae_torchrec.data.hashing import hashed_rows; "
    code += "print(hashed_rows(pa.array(['site', 'é', '00a1']), 1000).tolist())"
    runs = {
        seed: subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert runs["1"] == runs["2"] == f"{hashed_rows(pa.array(['site', 'é', '00a1']), 1000).tolist()}\n"


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_ids_labels_and_dense_equal_an_independent_reference(files, kind, caplog):
    caplog.set_level("INFO", "fae_torchrec.data")
    source = ColumnarSource(kind, files[kind], load_schema(files["schema"]), 64, chunk_rows=100)
    expected = reference(files["table"])
    assert {c.name: c.num_embeddings for c in source.table_configs()} == expected["tables"]
    assert [c.feature_names for c in source.table_configs() if c.name == "domain"] == [
        list(("site_domain", "app_domain"))
    ]
    assert "table site_category: " in caplog.text and " distinct values in 1 file(s) -> " in caplog.text
    block = SampleBlock.concat(list(source.blocks()))
    assert block.ids_per_feature == tuple(3 if f == "tags" else 1 for f in FEATURES)
    np.testing.assert_array_equal(block.labels, expected["labels"])
    np.testing.assert_array_equal(block.dense, expected["dense"].astype(np.float32))
    for feature, ids in block.feature_ids(FEATURES).items():
        np.testing.assert_array_equal(ids, expected["ids"][feature], err_msg=feature)


def test_files_in_order_and_any_chunk_size_read_alike(files):
    whole = _read("parquet", files["parquet"], files["schema"])
    for other in (
        _read("parquet", files["parts"], files["schema"]),
        _read("parquet", files["parquet"], files["schema"], chunk_rows=7),
        _read("csv", files["csv"], files["schema"], chunk_bytes=4096),
    ):
        for name in ("dense", "ids", "labels"):
            np.testing.assert_array_equal(getattr(other, name), getattr(whole, name))


def _trained(batches, tables) -> dict[str, torch.Tensor]:
    """TorchRec's DLRM (unsharded) after SGD on ``batches``, from the same initial state."""
    torch.manual_seed(0)
    model = DLRMTrain(DLRM(EmbeddingBagCollection(tables), dense_in_features=2,
                           dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1]))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in batches:
        model(batch)[0].backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_parquet_csv_and_sample_blocks_train_to_the_same_parameters(files):
    schema = load_schema(files["schema"])
    parquet = ColumnarSource("parquet", files["parquet"], schema, 64, chunk_rows=50)
    tables = parquet.table_configs(4)
    expected = reference(files["table"])
    blocks = SampleBlock(
        dense=expected["dense"].astype(np.float32),
        ids=np.concatenate([expected["ids"][f] for f in FEATURES], axis=1),
        labels=expected["labels"].astype(np.int32),
        ids_per_feature=parquet.blocks().__next__().ids_per_feature,
    )
    trained = [
        _trained(iter(parquet), tables),
        _trained(iter(ColumnarSource("csv", files["csv"], schema, 64)), tables),
        _trained((b.to_batch(FEATURES) for b in rebatch([blocks], 64)), tables),
    ]
    untrained = _trained([], tables)
    for name, value in trained[0].items():
        assert not torch.equal(value, untrained[name]), f"{name} trained"
        for other in trained[1:]:
            assert torch.equal(other[name], value), name


@pytest.mark.slow
def test_profile_plan_and_the_example_at_one_and_two_ranks(files, tmp_path, capsys):
    """``profile`` and ``plan`` on the Parquet file, then the DLRM example on CSV and Parquet (1 rank,
    the same losses and AUCs) and on Parquet at 2 ranks under torchrun: the model has the schema's
    tables and dense width, and trains."""
    stats_file = tmp_path / "stats.npz"
    main(["profile", "--data", "parquet", str(files["parquet"]), "--schema", str(files["schema"]),
          "--budget", "4KiB", "--holdout", "100", "--out", str(stats_file)])  # fmt: skip
    profiled = capsys.readouterr().out
    assert "profiled " in profiled and "\ndomain " in profiled and "\ntag " in profiled, profiled
    stats = AccessStats.load(stats_file)
    assert {t.name: t.num_embeddings for t in stats.tables} == reference(files["table"])["tables"]
    main(["plan", "--stats", str(stats_file), "--world-size", "2", "--hbm-cap", "1MiB", "--batch-size",
          "64", "--candidates", "2", "--processes", "1"])  # fmt: skip
    assert "predicted step ratio" in capsys.readouterr().out
    launchers = {
        1: [sys.executable],
        2: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    }
    options = ["--schema", str(files["schema"]), "--batch-size", "32", "--budget", "4KiB", "--sample", "0.5"]
    trained = {}
    for kind, world in (("csv", 1), ("parquet", 1), ("parquet", 2)):
        out = tmp_path / f"{kind}{world}"
        data = ["--data", kind, str(files[kind]), "--val-every", "5"]
        run = run_launched(
            [*launchers[world], str(EXAMPLE), *data, *options, "--out", str(out)], outputs=[out]
        )
        assert run.returncode == 0, run.stderr[-4000:]
        metrics = trained[kind, world] = json.loads((out / "metrics.json").read_text())
        assert metrics["world_size"] == world and metrics["train_inputs"] == 480
        assert metrics["hot_steps"] > 0 and metrics["cold_steps"] > 0, metrics
        assert "DLRM fae_torchrec.data.columnar: table site_category: " in run.stderr
    # the same inputs from CSV and Parquet: the same run, step for step
    assert trained["csv", 1]["history"] == trained["parquet", 1]["history"]


def _exits_2(argv, capsys, caplog) -> str:
    """``fae-torchrec profile`` on ``argv`` (its ``--out`` never written): exit status 2, and what it said."""
    return exits_2(
        ["profile", *argv, "--out", str(Path(tempfile.gettempdir()) / "never-written.npz")], capsys, caplog
    )


def _bad_schema(tmp_path, old, new) -> Path:
    assert old in SCHEMA
    return write_schema(tmp_path / "bad.toml", SCHEMA.replace(old, new, 1))


def _damaged(files, tmp_path, column, row, value, kind="parquet"):
    """The data with ``column`` at ``row`` replaced by ``value`` (of the column's type, or null)."""
    table = files["table"]
    values = table.column(column).to_pylist()
    if isinstance(value, str):  # CSV text in a column of numbers
        values = [str(v) for v in values]
    values[row] = value
    arrow_type = pa.uint64() if isinstance(value, int) and value >= 2**63 else None  # past int64
    changed = table.set_column(table.schema.get_field_index(column), column, pa.array(values, arrow_type))
    write = write_parquet if kind == "parquet" else write_csv
    return write(changed, tmp_path / f"damaged.{kind}")


def test_a_misspelt_column_is_named_with_its_likely_meaning(files, tmp_path, capsys, caplog):
    schema = _bad_schema(tmp_path, "[features.site_id]", "[features.site_idd]")
    for kind in ("parquet", "csv"):
        reported = _exits_2(["--data", kind, str(files[kind]), "--schema", str(schema)], capsys, caplog)
        assert (
            f"{files[kind]}: no column 'site_idd' (feature site_idd, {schema}); did you mean 'site_id'?"
            in reported
        )


def test_a_column_of_the_wrong_type_is_named(files, tmp_path, capsys, caplog):
    schema = _bad_schema(tmp_path, 'dense = ["hour", "banner_pos"]', 'dense = ["site_id"]')
    reported = _exits_2(["--data", "parquet", str(files["parquet"]), "--schema", str(schema)], capsys, caplog)
    expected = (
        f"{files['parquet']}: column 'site_id' (dense) holds string, which is not a number or a boolean"
    )
    assert expected in reported
    schema = _bad_schema(tmp_path, "[features.site_id]", '[features.site_id]\nids = "offset"')
    reported = _exits_2(["--data", "parquet", str(files["parquet"]), "--schema", str(schema)], capsys, caplog)
    assert (
        "column 'site_id' (feature site_id) holds string, which is not an integer (ids = \"offset\")"
        in reported
    )


def _row(row: int, group: int) -> str:
    return f"row {row} (counted from 0, in row group {group})"


@pytest.mark.parametrize(
    ("column", "row", "value", "kind", "where", "problem"),
    [
        ("click", 300, None, "parquet", _row(300, 2), "no value (null)"),
        ("click", 7, 2, "parquet", _row(7, 0), "2 is not a label (0 or 1)"),
        ("click", 7, 2, "csv", "line 9", "'2' is not a label (0 or 1)"),
        ("hour", 11, "x", "csv", "line 13", "'x' is not a number"),
        ("device_type", 5, 0, "parquet", _row(5, 0), "id 0 is below the offset 1"),
        ("device_type", 5, -4, "csv", "line 7", "id -4 is below the offset 1"),
        ("device_type", 1, "one", "csv", "line 3", "'one' is not an integer id"),
        ("device_type", 5, 2**64 - 1, "parquet", _row(5, 0), f"id {2**64 - 1} is beyond the largest table"),
        ("tags", 9, ["a", "b"], "parquet", _row(9, 0), "a list of 2 values; the schema's length is 3"),
        ("site_id", 400, None, "parquet", _row(400, 3), "no value (null)"),
        ("hour", 11, float("nan"), "parquet", _row(11, 0), "nan is not a finite number"),
    ],
)
def test_a_bad_value_is_named_with_its_file_column_and_row(
    files, tmp_path, capsys, caplog, column, row, value, kind, where, problem
):
    path = _damaged(files, tmp_path, column, row, value, kind)
    reported = _exits_2(["--data", kind, str(path), "--schema", str(files["schema"])], capsys, caplog)
    role = {"click": "label", "hour": "dense"}.get(column, f"feature {column}")
    assert f"{path}: column {column!r} ({role}), {where}: {problem}" in reported


@pytest.mark.parametrize("transform", ["log", "none"])
@pytest.mark.parametrize("kind", ["parquet", "csv"])
@pytest.mark.parametrize("value", [1e300, 3.5e38])
def test_a_dense_value_beyond_float32_is_named_whatever_the_transform(
    files, tmp_path, capsys, caplog, transform, kind, value
):
    """Dense inputs are float32: a finite float64 beyond its range is refused, not made infinite (nor
    taken in range by the log transform: no click log holds such a number, a damaged file can)."""
    path = _damaged(files, tmp_path, "hour", 5, repr(value) if kind == "csv" else value, kind)
    schema = _bad_schema(tmp_path, 'dense_transform = "log"', f'dense_transform = "{transform}"')
    reported = _exits_2(["--data", kind, str(path), "--schema", str(schema)], capsys, caplog)
    where = "line 7" if kind == "csv" else _row(5, 0)
    assert f"{path}: column 'hour' (dense), {where}: {value!r} is beyond float32's range" in reported


def test_a_damaged_page_is_refused_by_its_checksum(files, tmp_path, capsys, caplog):
    """Row 383's dense value overwritten in a file written with page checksums (uncompressed, plain
    doubles, so that the damage still decodes): read unverified it is a plausible number; the reader
    verifies the checksum and names the file."""
    table = files["table"]
    hour = table.schema.get_field_index("hour")
    table = table.set_column(hour, "hour", table.column(hour).cast(pa.float64()))
    path = write_parquet(table, tmp_path / "damaged.parquet", compression="none", use_dictionary=False)
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(hour)
    end = chunk.data_page_offset + chunk.total_compressed_size  # the chunk's last value: row 383's
    data = bytearray(path.read_bytes())
    data[end - 8 : end] = np.float64(7.5).tobytes()
    path.write_bytes(data)
    assert pq.read_table(path).column("hour")[383].as_py() == 7.5 != table.column("hour")[383].as_py()
    reported = _exits_2(["--data", "parquet", str(path), "--schema", str(files["schema"])], capsys, caplog)
    assert f"{path}: damaged after row " in reported and "CRC checksum verification failed" in reported


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("rows = 499\n[features.app_category]", "rows = 500\n[features.app_category]",
         "table 'domain' is given 499 rows by features.site_domain and 500 by features.app_domain"),
        ("offset = 1", "ofset = 1", "unknown key features.device_type.ofset; the keys there are"),
        ('ids = "offset"', 'ids = "vocab"', "features.device_type.ids: 'vocab' is not one of vocabulary"),
        ("[features.tags]", '[features.tags]\nids = "hash"', 'features.tags.rows: ids = "hash" needs'),
        ("length = 3", 'length = 3\nrows = 9\nids = "vocabulary"', "features.tags.rows: not with ids"),
        ("length = 3", "length = 0", "features.tags.length: expected an integer in [1, 65,536], got 0"),
        ('dense = ["hour", "banner_pos"]', 'dense = ["click"]', "dense: the label column 'click' would be"),
        ("[features.tags]", '[features.tags]\ncolumn = "click"', "features.tags.column: the label column"),
        ('label = "click"', 'label = "click', "not TOML: "),
        ('label = "click"', "", "missing key label"),
        ("[features.site_id]", '[features."site.id"]\ncolumn = "site_id"',
         "features.site.id: 'site.id' cannot name a feature: TorchRec splits its module"),
        ("[features.site_id]", '[features.site_id]\ntable = "site.id"',
         "features.site_id.table: 'site.id' cannot name a table: TorchRec splits"),
        ("[features.site_id]", '[features.keys]\ncolumn = "site_id"',
         "features.keys.table: 'keys' cannot name a table: it is an attribute of the ModuleDict"),
    ],
)  # fmt: skip
def test_a_bad_schema_is_named_with_its_key(files, tmp_path, capsys, caplog, old, new, message):
    schema = _bad_schema(tmp_path, old, new)
    reported = _exits_2(["--data", "parquet", str(files["parquet"]), "--schema", str(schema)], capsys, caplog)
    assert f"--schema {schema}: {message}" in reported


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--data parquet: needs --schema TOML naming its columns"),
        (
            ["--schema", "S", "--tables", "kaggle"],
            "--tables: not with --data parquet, whose tables --schema gives",
        ),
        (["--schema", "S", "--scale", "2"], "--scale: not with --data parquet, whose tables --schema gives"),
    ],
)
def test_options_that_do_not_apply_to_columnar_data_are_refused(files, capsys, caplog, extra, message):
    extra = [str(files["schema"]) if word == "S" else word for word in extra]
    assert message in _exits_2(["--data", "parquet", str(files["parquet"]), *extra], capsys, caplog)


def test_a_schema_with_other_data_and_a_damaged_parquet_file_are_refused(files, tmp_path, capsys, caplog):
    reported = _exits_2(["--data", "synthetic", "--schema", str(files["schema"])], capsys, caplog)
    assert "--schema: only with --data parquet or csv (--data synthetic has its own layout)" in reported
    damaged = tmp_path / "cut.parquet"
    damaged.write_bytes(files["parquet"].read_bytes()[:-100])
    reported = _exits_2(["--data", "parquet", str(damaged), "--schema", str(files["schema"])], capsys, caplog)
    assert f"{damaged}: not a readable Parquet file" in reported
    assert pq.ParquetFile(files["parquet"]).metadata.num_row_groups == 5


def test_the_avazu_schema_reads_avazu_s_layout_and_is_the_one_documented(tmp_path, capsys):
    """examples/schemas/avazu.toml, shown whole in docs/data.md, reads Avazu's 24 columns from CSV and
    Parquet alike: 22 tables, the two big ones hashed into 2^20 rows, the others sized by the data."""
    schema = Path(__file__).resolve().parents[1] / "examples" / "schemas" / "avazu.toml"
    docs = (schema.parents[2] / "docs" / "data.md").read_text()
    assert f"```toml\n{schema.read_text()}```" in docs
    table = avazu_layout(2000)
    assert table.column_names == list(AVAZU_COLUMNS)
    blocks = [
        _read("csv", write_csv(table, tmp_path / "train.csv"), schema),
        _read("parquet", write_parquet(table, tmp_path / "train.parquet"), schema),
    ]
    for name in ("dense", "ids", "labels"):
        np.testing.assert_array_equal(getattr(blocks[0], name), getattr(blocks[1], name))
    configs = ColumnarSource("csv", tmp_path / "train.csv", load_schema(schema), 64).table_configs()
    rows = {config.name: config.num_embeddings for config in configs}
    assert len(rows) == 22 and rows["device_id"] == rows["device_ip"] == 2**20
    assert rows["hour"] == len(set(table.column("hour").to_pylist())) and blocks[0].dense.shape == (2000, 0)
    main(["profile", "--data", "csv", str(tmp_path / "train.csv"), "--schema", str(schema), "--sample", "0.5",
          "--out", str(tmp_path / "stats.npz")])  # fmt: skip
    assert "\ndevice_ip " in capsys.readouterr().out


@pytest.mark.slow
def test_the_example_refuses_a_bad_file_with_exit_status_2(files, tmp_path):
    path = _damaged(files, tmp_path, "click", 30, 3, "csv")
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--data", "csv", str(path), "--schema", str(files["schema"]),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"{path}: column 'click' (label), line 32: '3' is not a label (0 or 1)" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_real_avazu_rows_profile_and_train_with_the_avazu_schema(tmp_path, capsys):
    """Avazu's first 9,999 training rows (../shared/realdata, research-only) through the documented
    schema: a vocabulary table per column with as many rows as its PROVENANCE.md distinct count, and the
    example trains on them."""
    path = realdata("avazu_head10k/avazu_10k.csv")
    schema = EXAMPLE.parent / "schemas" / "avazu.toml"
    main(["profile", "--data", "csv", str(path), "--schema", str(schema), "--out", str(tmp_path / "s.npz")])
    assert "profiled " in capsys.readouterr().out
    rows = {t.name: t.num_embeddings for t in AccessStats.load(tmp_path / "s.npz").tables}
    assert {k: rows[k] for k in ("hour", "site_id", "app_domain", "device_model", "C14")} == {
        "hour": 1, "site_id": 381, "app_domain": 31, "device_model": 1168, "C14": 271
    }  # fmt: skip
    out = tmp_path / "run"
    data = ["--data", "csv", str(path), "--schema", str(schema)]
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), *data, "--budget", "1MiB", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_inputs"] == 9000 and metrics["hot_steps"] > 0 and 0.5 < metrics["final_auc"] <= 1


def test_damaged_csv_and_parquet_layouts_are_named(files, tmp_path, capsys, caplog):
    """A CSV line with a field too many (found past the parser's block), a blank line (refused: its
    fields are empty), a byte-order mark (read as Excel writes it), a byte that is not UTF-8 (found past
    the parser's block), a Parquet column named twice."""
    lines = files["csv"].read_text().splitlines()
    lines[250] += ",extra"
    damaged = tmp_path / "extra.csv"
    damaged.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(damaged))}:251: CSV parse error: (Row #251: )?Expected 25 columns",
    ):
        ColumnarSource("csv", damaged, load_schema(files["schema"]), 64, chunk_bytes=4096)  # its first pass
    blank = tmp_path / "blank.csv"
    blank.write_text("\n".join([*lines[:10], "", *lines[11:20]]) + "\n")
    reported = _exits_2(["--data", "csv", str(blank), "--schema", str(files["schema"])], capsys, caplog)
    assert (
        f"{blank}: column 'device_type' (feature device_type), line 11: '' is not an integer id" in reported
    )
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + files["csv"].read_bytes())
    np.testing.assert_array_equal(
        _read("csv", marked, files["schema"]).ids, _read("csv", files["csv"], files["schema"]).ids
    )
    not_utf8 = tmp_path / "not_utf8.csv"
    lines = files["csv"].read_text().splitlines()
    assert lines[499].endswith('"')  # line 500, far past 4 KiB: a byte that is not UTF-8 in its last field
    lines[499] = lines[499][:-1] + '\udcff"'
    not_utf8.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(not_utf8))}:500: .*invalid UTF8"):
        ColumnarSource("csv", not_utf8, load_schema(files["schema"]), 64, chunk_bytes=4096)
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.table([pa.array([0, 1]), pa.array([1, 2])], names=["click", "click"]), twice)
    reported = _exits_2(["--data", "parquet", str(twice), "--schema", str(files["schema"])], capsys, caplog)
    assert f"{twice}: column 'click' is named twice in the file's schema" in reported
