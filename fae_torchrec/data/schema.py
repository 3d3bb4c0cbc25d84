"""A columnar data set's schema: which column is the label, which are dense features, and for each sparse
feature (a ``KeyedJaggedTensor`` key) its column, how its values become rows of its table, and the table
(an ``EmbeddingBagConfig``; features naming one table share it, as TorchRec allows). Read from TOML:

.. code-block:: toml

    label = "click"
    dense = ["hour_of_day"]       # numeric columns, in order (may be empty)
    dense_transform = "log"       # sign(x) * log(1 + |x|), as for Criteo; "none" (default) keeps x

    [features.site_id]            # a feature, named as its KeyedJaggedTensor key
    rows = 100_000                # hash the values into this many rows

    [features.site_category]      # no rows: a row per distinct value (a vocabulary from a first pass)

    [features.tags]
    length = 3                    # a list column of 3 ids an input (CSV: "a|b|c")
    table = "tag"                 # default: the feature's name

    [features.user]
    ids = "offset"                # integer ids already dense: row = value - offset
    offset = 1                    # default 0; rows omitted: the largest row + 1

docs/data.md has the full reference.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from fae_torchrec.data.paths import file_problem

#: How values become rows: a row per distinct value (sorted), hashed (:mod:`fae_torchrec.data.hashing`)
#: into ``rows``, or integer ids minus an offset.
ID_KINDS = ("vocabulary", "hash", "offset")
DENSE_TRANSFORMS = ("none", "log")
#: Largest table (the ids are int64).
MAX_ROWS = 2**62
_TOP_KEYS = {"label", "dense", "dense_transform", "features"}
_FEATURE_KEYS = {"column", "table", "ids", "rows", "offset", "length", "separator"}
#: Why a feature or table name cannot hold a '.' (a feature names its table by default).
_DOTTED = "TorchRec splits its module and state-dict paths at '.' (embedding_bags.TABLE.weight)"
#: Names a table cannot take: attributes of the ``ModuleDict`` in which TorchRec's
#: ``EmbeddingBagCollection`` keeps a module per table (``keys``, ``update``, ``training`` ...).
_TAKEN_TABLE_NAMES = frozenset(dir(nn.ModuleDict()))


@dataclass(frozen=True)
class SparseFeature:
    """A sparse feature: ``column``'s values become rows of ``table`` (``ids``: ``vocabulary``, the
    value's place among the table's distinct values, sorted; ``hash`` into ``rows``; or ``offset``:
    value - ``offset``); ``length`` ids an input from a list column (CSV: the field split at
    ``separator``), or one from a scalar column when ``length`` is None. ``rows`` None: counted from
    the data (:class:`~fae_torchrec.data.columnar.ColumnarSource`)."""

    name: str
    column: str
    table: str
    ids: str = "vocabulary"
    rows: int | None = None
    offset: int = 0
    length: int | None = None
    separator: str = "|"

    @property
    def ids_per_input(self) -> int:
        return 1 if self.length is None else self.length


@dataclass(frozen=True)
class Schema:
    """A data set's columns: ``label``, ``dense`` (in order) and ``features`` (in order, the keys of the
    ``KeyedJaggedTensor``s). ``path``: the file it was read from, named in errors."""

    path: str
    label: str
    dense: tuple[str, ...]
    features: tuple[SparseFeature, ...]
    dense_transform: str = "none"

    @property
    def columns(self) -> list[str]:
        """Every column the schema reads, each once, label first."""
        names = [self.label, *self.dense, *(f.column for f in self.features)]
        return list(dict.fromkeys(names))

    @property
    def tables(self) -> dict[str, list[SparseFeature]]:
        """The features of each table, tables in the order their first feature comes."""
        tables: dict[str, list[SparseFeature]] = {}
        for feature in self.features:
            tables.setdefault(feature.table, []).append(feature)
        return tables

    def table_rows(self) -> dict[str, int | None]:
        """Rows of each table the schema gives (None: to be counted from the data)."""
        return {
            table: next((f.rows for f in features if f.rows is not None), None)
            for table, features in self.tables.items()
        }


def load_schema(path: str | os.PathLike) -> Schema:
    """The schema in the TOML file ``path``. Raises ``ValueError`` naming the file and the key for an
    unreadable file, a missing, unknown or mistyped key, a feature or table name TorchRec cannot take, a
    table given two sizes, or the label column as an input of the model."""
    path = os.fspath(path)
    problem = file_problem(path)
    if problem is not None:
        raise ValueError(f"--schema {path}: {problem}")
    try:
        with open(path, "rb") as file:
            text = tomllib.load(file)
    except OSError as error:
        raise ValueError(f"--schema {path}: cannot read: {error.strerror or error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"--schema {path}: not TOML: {error}") from error
    return parse_schema(text, path)


def parse_schema(text: Mapping, path: str) -> Schema:
    """A schema from the parsed TOML ``text`` of the file ``path`` (:func:`load_schema`)."""
    where = f"--schema {path}"
    _no_unknown_keys(text, _TOP_KEYS, where, "")
    label = _string(text, "label", where)
    dense = text.get("dense", [])
    if not isinstance(dense, list) or not all(isinstance(c, str) and c for c in dense):
        raise ValueError(f"{where}: dense: expected a list of column names, got {dense!r}")
    transform = text.get("dense_transform", "none")
    if transform not in DENSE_TRANSFORMS:
        raise ValueError(
            f"{where}: dense_transform: {transform!r} is not one of {', '.join(DENSE_TRANSFORMS)}"
        )
    features = text.get("features")
    if not isinstance(features, dict) or not features:
        raise ValueError(f"{where}: no [features.NAME] table: the schema needs at least one sparse feature")
    schema = Schema(
        path, label, tuple(dense), tuple(_feature(name, spec, where) for name, spec in features.items()),
        transform,
    )  # fmt: skip
    _check_shared_tables(schema, where)
    reading_label = [f"features.{f.name}" for f in schema.features if f.column == label]
    if label in dense or reading_label:
        key = "dense" if label in dense else f"{reading_label[0]}.column"
        raise ValueError(f"{where}: {key}: the label column {label!r} would be an input of the model")
    return schema


def _feature(name: str, spec: object, where: str) -> SparseFeature:
    key = f"features.{name}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: {key}: expected a table of options, got {spec!r}")
    _no_unknown_keys(spec, _FEATURE_KEYS, where, key + ".")
    if "." in name:
        raise ValueError(
            f"{where}: {key}: {name!r} cannot name a feature: {_DOTTED}; name the feature otherwise "
            f"(column = {name!r} reads the column of that name)"
        )
    column = _string(spec, "column", where, key, default=name)
    table = _string(spec, "table", where, key, default=name)
    if "." in table or table in _TAKEN_TABLE_NAMES:
        why = (
            _DOTTED
            if "." in table
            else "it is an attribute of the ModuleDict holding an EmbeddingBagCollection's tables"
        )
        raise ValueError(
            f"{where}: {key}.table: {table!r} cannot name a table: {why}; set table to another name"
        )
    rows = _integer(spec, "rows", where, key, 1, MAX_ROWS)
    ids = spec.get("ids", "vocabulary" if rows is None else "hash")
    if ids not in ID_KINDS:
        raise ValueError(f"{where}: {key}.ids: {ids!r} is not one of {', '.join(ID_KINDS)}")
    if ids == "hash" and rows is None:
        raise ValueError(f'{where}: {key}.rows: ids = "hash" needs the rows to hash into')
    if ids == "vocabulary" and rows is not None:
        raise ValueError(
            f'{where}: {key}.rows: not with ids = "vocabulary", whose rows are the distinct values'
        )
    offset = _integer(spec, "offset", where, key, -MAX_ROWS, MAX_ROWS)
    if offset is not None and ids != "offset":
        raise ValueError(f'{where}: {key}.offset: only with ids = "offset"')
    length = _integer(spec, "length", where, key, 1, 1 << 16)
    separator = _string(spec, "separator", where, key, default="|")
    return SparseFeature(name, column, table, ids, rows, offset or 0, length, separator)


def _check_shared_tables(schema: Schema, where: str) -> None:
    """Features sharing a table take their rows alike (``ids``, ``offset``), and those that give its
    rows give the same (the others may leave them out)."""
    for table, features in schema.tables.items():
        unlike = next(
            (f for f in features if (f.ids, f.offset) != (features[0].ids, features[0].offset)), None
        )
        if unlike is not None:
            raise ValueError(
                f"{where}: table {table!r}: features.{features[0].name} and features.{unlike.name} share it "
                "but take their rows differently (ids, offset): features sharing a table must take them alike"
            )
        sized = [f for f in features if f.rows is not None]
        other = next((f for f in sized if f.rows != sized[0].rows), None)
        if other is not None:
            raise ValueError(
                f"{where}: table {table!r} is given {sized[0].rows} rows by features.{sized[0].name} and "
                f"{other.rows} by features.{other.name}: features sharing a table must give it one size"
            )


def _no_unknown_keys(spec: Mapping, known: set[str], where: str, prefix: str) -> None:
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {prefix}{unknown[0]}; the keys there are {', '.join(sorted(known))}"
        )


def _string(spec: Mapping, key: str, where: str, table: str = "", default: str | None = None) -> str:
    name = f"{table}.{key}" if table else key
    value = spec.get(key, default)
    if value is None:
        raise ValueError(f"{where}: missing key {name}")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: {name}: expected a non-empty string, got {value!r}")
    return value


def _integer(spec: Mapping, key: str, where: str, table: str, low: int, high: int) -> int | None:
    value = spec.get(key)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
    ):
        raise ValueError(f"{where}: {table}.{key}: expected an integer in [{low}, {high:,}], got {value!r}")
    return value
