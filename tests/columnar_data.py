"""Avazu-like click logs for the columnar tests: a label, integer columns, 20 categorical text columns and
a multi-hot list column, written as Parquet and CSV, with their schema and the ids a reference computes
independently of the library (FNV-1a in plain Python, vocabularies as sorted Python sets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

#: Avazu's categorical columns, C1 and C14..C21 as text, and the connection type: 20 text columns.
TEXT_COLUMNS = (
    "site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category", "device_id",
    "device_ip", "device_model", "C1", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
    "device_conn_type", "hour_of_week",
)  # fmt: skip
#: Rows given per text column in the schema, which hashes them (the others take a vocabulary).
GIVEN_ROWS = {
    c: 97 + 10 * i for i, c in enumerate(TEXT_COLUMNS) if c not in ("site_category", "app_category")
}
#: site_domain and app_domain share the table ``domain`` of 499 rows.
SHARED = ("site_domain", "app_domain")
DOMAIN_ROWS = 499
TAGS = 3

SCHEMA = "\n".join(
    [
        'label = "click"',
        'dense = ["hour", "banner_pos"]',
        'dense_transform = "log"',
        "[features.device_type]",
        'ids = "offset"',
        "offset = 1",
        "[features.tags]",
        f"length = {TAGS}",
        'table = "tag"',
        *(
            f'[features.{c}]\ntable = "domain"\nrows = {DOMAIN_ROWS}'
            if c in SHARED
            else f"[features.{c}]" + (f"\nrows = {GIVEN_ROWS[c]}" if c in GIVEN_ROWS else "")
            for c in TEXT_COLUMNS
        ),
    ]
)
#: Features in schema order.
FEATURES = ("device_type", "tags", *TEXT_COLUMNS)


def avazu_like(n: int, seed: int = 0) -> pa.Table:
    """``n`` inputs: ``click``, integer ``hour``, ``banner_pos`` and ``device_type`` (1..5), the text
    columns (skewed hex ids, some decimal), and ``tags``, a list of 3 words."""
    rng = np.random.default_rng(seed)
    columns = {
        "click": rng.integers(0, 2, n),
        "hour": rng.integers(0, 24, n),
        "banner_pos": rng.integers(-1, 7, n),
        "device_type": rng.integers(1, 6, n),
    }
    for i, column in enumerate(TEXT_COLUMNS):
        ids = rng.zipf(3.0, n) % (50 + 300 * (i % 4))
        columns[column] = [f"{v:08x}" for v in ids] if i % 2 else [str(v) for v in ids]
    words = rng.zipf(2.5, (n, TAGS)) % 40
    columns["tags"] = [[f"w{v}" for v in row] for row in words]
    return pa.table(columns)


def write_parquet(table: pa.Table, path: Path, row_group: int = 128, **options) -> Path:
    """The table as Parquet, its pages checksummed (as docs/data.md advises), with pyarrow's ``options``."""
    pq.write_table(table, path, row_group_size=row_group, write_page_checksum=True, **options)
    return path


def write_csv(table: pa.Table, path: Path) -> Path:
    """The table as CSV with a header; a list column as its words joined by ``|``."""
    for index, field in enumerate(table.schema):
        if pa.types.is_list(field.type):
            joined = pa.array(["|".join(words) for words in table.column(index).to_pylist()])
            table = table.set_column(index, field.name, joined)
    pa_csv.write_csv(table, path)
    return path


def write_schema(path: Path, text: str = SCHEMA) -> Path:
    path.write_text(text + "\n")
    return path


def fnv1a(text: str) -> int:
    """64-bit FNV-1a of the UTF-8 text, one byte at a time (the reference)."""
    value = 0xCBF29CE484222325
    for byte in text.encode():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


def reference(table: pa.Table) -> dict:
    """What the reader should make of ``table``, computed here: labels, dense, each feature's ids
    ``(n, ids_per_input)`` and each table's rows."""
    data = table.to_pydict()
    rows = {c: GIVEN_ROWS.get(c, len(set(data[c]))) for c in TEXT_COLUMNS}
    rows.update(dict.fromkeys(SHARED, DOMAIN_ROWS))
    ids = {c: np.array([[fnv1a(str(v)) % rows[c]] for v in data[c]]) for c in rows}
    for column in set(TEXT_COLUMNS) - set(GIVEN_ROWS) - set(SHARED):  # no rows given: a vocabulary
        places = {value: place for place, value in enumerate(sorted(set(data[column])))}
        ids[column] = np.array([[places[v]] for v in data[column]])
    vocabulary = sorted({w for words in data["tags"] for w in words})
    ids["tags"] = np.array([[vocabulary.index(w) for w in words] for words in data["tags"]])
    ids["device_type"] = np.array(data["device_type"])[:, None] - 1
    dense = np.array([data["hour"], data["banner_pos"]], dtype=np.float64).T
    tables = {"device_type": max(data["device_type"]), "tag": len(vocabulary), "domain": DOMAIN_ROWS}
    tables.update({c: rows[c] for c in TEXT_COLUMNS if c not in SHARED})
    return {
        "labels": np.array(data["click"]),
        "dense": np.sign(dense) * np.log1p(np.abs(dense)),
        "ids": ids,
        "tables": tables,
    }


#: Avazu's 24 columns, in its order.
AVAZU_COLUMNS = (
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
    "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
    "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
)  # fmt: skip
_AVAZU_HEX = {"site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category",
              "device_id", "device_ip", "device_model"}  # fmt: skip


def avazu_layout(n: int, seed: int = 0) -> pa.Table:
    """``n`` rows in Avazu's layout: a 19-digit ``id``, ``click``, ``hour`` as YYMMDDHH, hex-string
    categories and integer ones."""
    rng = np.random.default_rng(seed)
    columns = {
        "id": [str(v) for v in rng.integers(10**18, 10**19 - 1, n, dtype=np.uint64)],
        "click": rng.integers(0, 2, n),
        "hour": 14102100 + 100 * rng.integers(0, 10, n) + rng.integers(0, 24, n),
    }
    for column in AVAZU_COLUMNS[3:]:
        ids = rng.zipf(1.5, n) % 1000
        columns[column] = [f"{v * 2654435761 % 2**32:08x}" for v in ids] if column in _AVAZU_HEX else ids
    return pa.table(columns)
