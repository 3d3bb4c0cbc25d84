"""Any click log in Parquet or CSV files, described by a :class:`~fae_torchrec.data.schema.Schema`: its
rows as ``SampleBlock``s (and so TorchRec ``Batch``es) and its tables as ``EmbeddingBagConfig``s.

Files are read in order, a chunk at a time (:mod:`fae_torchrec.data.columnar_files`), so memory is
bounded by the chunk, not the file. Every value is checked before it is used: a null, a label other
than 0 or 1, text that is not a number, a dense value that is not a finite float32, a negative or too
large integer id, a list of the wrong length or a column of the wrong type raises ``ValueError`` naming
the file, the column and the row.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.data.block import SampleBlock, dense_problem, float32_dense
from fae_torchrec.data.columnar_files import CHUNK_BYTES, CHUNK_ROWS, ColumnarFile, open_columns
from fae_torchrec.data.hashing import as_text, hashed_rows
from fae_torchrec.data.paths import as_paths
from fae_torchrec.data.schema import MAX_ROWS, Schema, SparseFeature
from fae_torchrec.data.source import BlockSource

logger = logging.getLogger(__name__)

_INTEGER = r"^-?[0-9]{1,18}$"
_NUMBER = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
#: Distinct-value arrays a first pass holds before it merges them.
_MERGE_EVERY = 32


class ColumnarSource(BlockSource):
    """The inputs of Parquet (``kind`` ``parquet``) or CSV (``csv``) files, read in order as ``schema``
    describes them.

    Tables the schema gives no size get one from a first pass over the files, which logs what it found:
    a vocabulary table has a row per distinct value of its features (``vocabularies``: the values,
    sorted, a value's row its place among them), an offset table the largest row + 1.

    Args:
        kind: ``parquet`` or ``csv``.
        paths: one file or several, read in order.
        schema: the columns and how they become features.
        batch_size: inputs per ``Batch`` (the last one may be smaller).
        chunk_rows: Parquet rows read at a time (a row group is read whole).
        chunk_bytes: CSV bytes parsed at a time.
    """

    def __init__(
        self,
        kind: str,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        schema: Schema,
        batch_size: int = 2048,
        chunk_rows: int = CHUNK_ROWS,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        super().__init__(batch_size, [f.name for f in schema.features])
        self.schema = schema
        self.files = [open_columns(kind, p, chunk_rows, chunk_bytes) for p in as_paths(paths)]
        for file in self.files:
            _check_columns(file, schema)
        rows = schema.table_rows()
        missing = [table for table, size in rows.items() if size is None]
        self.vocabularies: dict[str, pa.Array] = {}
        counted = self._first_pass(missing) if missing else {}
        self.table_rows = {table: counted[table] if size is None else size for table, size in rows.items()}
        self.num_dense = len(self.schema.dense)

    def table_configs(self, embedding_dim: int = 16) -> list[EmbeddingBagConfig]:
        return [
            EmbeddingBagConfig(
                name=table,
                embedding_dim=embedding_dim,
                num_embeddings=self.table_rows[table],
                feature_names=[f.name for f in features],
            )
            for table, features in self.schema.tables.items()
        ]

    def raw_blocks(self) -> Iterator[SampleBlock]:
        """A block per chunk of each file."""
        for file in self.files:
            for batch, first in file.batches(self.schema.columns):
                yield self._block(_Chunk(file, batch, first))

    def _block(self, chunk: _Chunk) -> SampleBlock:
        schema = self.schema
        labels = chunk.labels(schema.label)
        dense = np.zeros((len(labels), len(schema.dense)), dtype=np.float64)
        for j, column in enumerate(schema.dense):
            dense[:, j] = chunk.dense(column)
        if schema.dense_transform == "log":
            dense = np.sign(dense) * np.log1p(np.abs(dense))
        ids = [
            chunk.rows(f, self.table_rows[f.table], self.vocabularies.get(f.table)) for f in schema.features
        ]
        return SampleBlock(
            dense=dense.astype(np.float32),
            ids=np.concatenate(ids, axis=1),
            labels=labels,
            ids_per_feature=tuple(f.ids_per_input for f in schema.features),
        )

    def _first_pass(self, tables: Sequence[str]) -> dict[str, int]:
        """Rows of ``tables`` from a pass over the files (a row per distinct value, kept in
        ``vocabularies``, or the largest offset row + 1), logged."""
        features = [f for t in tables for f in self.schema.tables[t]]
        columns = list(dict.fromkeys(f.column for f in features))
        seen: dict[str, list] = {t: [] for t in tables}
        for file in self.files:
            for batch, first in file.batches(columns):
                chunk = _Chunk(file, batch, first)
                for feature in features:
                    found = seen[feature.table]
                    if feature.ids == "offset":
                        found.append(int(chunk.rows(feature, None).max(initial=-1)) + 1)
                    else:
                        found.append(pc.unique(as_text(chunk.values(feature))))
                        if len(found) > _MERGE_EVERY:
                            found[:] = [pc.unique(pa.concat_arrays(found))]
        counted = {}
        for table, found in seen.items():
            listed = self.schema.tables[table][0].ids == "vocabulary"
            if listed and found:
                self.vocabularies[table] = pc.unique(pa.concat_arrays(found)).sort()
            count = len(self.vocabularies[table]) if listed and found else max(found, default=0)
            if count == 0:
                raise ValueError(
                    f"{self.schema.path}: table {table!r}: the data holds no value to size it by"
                )
            counted[table] = count
            logger.info(
                "table %s: %s in %d file(s) -> %d rows",
                table, f"{count:,} distinct values" if listed else f"largest row {count - 1:,}",
                len(self.files), count,
            )  # fmt: skip
        return counted


class _Chunk:
    """A record batch of a file, its columns checked and converted, errors naming file, column and row."""

    def __init__(self, file: ColumnarFile, batch: pa.RecordBatch, first: int) -> None:
        self.file, self.batch, self.first = file, batch, first

    def fail(self, column: str, role: str, row: int, problem: str) -> None:
        raise ValueError(
            f"{self.file.path}: column {column!r} ({role}), {self.file.where(self.first + row)}: {problem}"
        )

    def column(self, column: str, role: str) -> pa.Array:
        """The column, refused with its first null."""
        values = self.batch.column(column)
        if values.null_count:
            self.fail(column, role, _first(pc.is_null(values)), "no value (null)")
        return values

    def labels(self, column: str) -> np.ndarray:
        """0/1 labels as ``int32`` (CSV: the text 0 or 1)."""
        values = self.column(column, "label")
        if _is_text(values.type):
            numbers = np.where(pc.equal(values, "1").to_numpy(zero_copy_only=False), 1.0, 0.0)
            bad = ~pc.is_in(values, value_set=pa.array(["0", "1"])).to_numpy(zero_copy_only=False)
        else:
            numbers = pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            bad = (numbers != 0) & (numbers != 1)
        if bad.any():
            row = _first(bad)
            self.fail(column, "label", row, f"{values[row].as_py()!r} is not a label (0 or 1)")
        return numbers.astype(np.int32)

    def dense(self, column: str) -> np.ndarray:
        """A dense column (CSV: text that is a number) as ``float64``, each a finite float32 (the type
        the model reads; ``dense_transform`` maps that range into itself: ``log`` into ±89)."""
        values = self.column(column, "dense")
        if _is_text(values.type):
            values = self._parsed(values, column, "dense", _NUMBER, "a number")
        # integers past 2^53 round to the nearest float, as any dense input does
        numbers = pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        bad = float32_dense(numbers)[1]
        if bad.any():
            row = _first(bad)
            self.fail(column, "dense", row, dense_problem(numbers[row]))
        return numbers

    def values(self, feature: SparseFeature) -> pa.Array:
        """A feature's values, ``ids_per_input`` an input in input order: a list column's flattened,
        each list checked to hold ``length`` values."""
        values = self.column(feature.column, f"feature {feature.name}")
        if feature.length is None:
            return values
        if _is_text(values.type):
            values = pc.split_pattern(values, feature.separator)
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != feature.length)
        if len(wrong):
            self.fail(
                feature.column, f"feature {feature.name}", int(wrong[0]),
                f"a list of {lengths[wrong[0]]} values; the schema's length is {feature.length}",
            )  # fmt: skip
        flat = pc.list_flatten(values)
        if flat.null_count:
            self.fail(
                feature.column,
                f"feature {feature.name}",
                _first(pc.is_null(flat)) // feature.length,
                "a null in the list",
            )
        return flat

    def rows(
        self, feature: SparseFeature, rows: int | None, vocabulary: pa.Array | None = None
    ) -> np.ndarray:
        """The feature's rows ``(inputs, ids_per_input)``: places in the sorted ``vocabulary``, hashed into
        ``rows``, or integer ids less the offset, each in ``[0, rows)`` (``rows`` None, offset ids only:
        the largest table's rows, for a first pass)."""
        values = self.values(feature)
        role = f"feature {feature.name}"
        if feature.ids == "vocabulary":
            found = pc.index_in(as_text(values), value_set=vocabulary)
            if found.null_count:
                index = _first(pc.is_null(found))
                self.fail(
                    feature.column, role, index // feature.ids_per_input,
                    f"{values[index].as_py()!r} is not among the values of the first pass (files changed?)",
                )  # fmt: skip
            ids = found.to_numpy(zero_copy_only=False).astype(np.int64)
        elif feature.ids == "hash":
            assert rows is not None, feature.name  # a hashed feature's table has its rows (Schema)
            ids = hashed_rows(values, rows)
        else:
            if _is_text(values.type):
                values = self._parsed(values, feature.column, role, _INTEGER, "an integer id", feature.length)
            elif values.type == pa.uint64():  # ids past int64's range would not cast
                huge = np.flatnonzero(values.to_numpy(zero_copy_only=False) > MAX_ROWS)
                if len(huge):
                    problem = f"id {values[huge[0]].as_py()} is beyond the largest table ({MAX_ROWS:,} rows)"
                    self.fail(feature.column, role, int(huge[0]) // feature.ids_per_input, problem)
            raw = pc.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
            limit = MAX_ROWS if rows is None else rows  # compared before the offset is taken: no overflow
            bad = np.flatnonzero((raw < feature.offset) | (raw >= feature.offset + limit))
            if len(bad):
                value = int(raw[bad[0]])
                problem = (
                    f'id {value} is below the offset {feature.offset}; hash such values with ids = "hash"'
                    if value < feature.offset
                    else f"id {value} is beyond table {feature.table!r}'s {limit:,} rows"
                    f" (offset {feature.offset})"
                )
                self.fail(feature.column, role, int(bad[0]) // feature.ids_per_input, problem)
            ids = raw - feature.offset
        return ids.reshape(-1, feature.ids_per_input)

    def _parsed(
        self, text: pa.Array, column: str, role: str, pattern: str, what: str, per_row: int | None = None
    ) -> pa.Array:
        """CSV text checked against ``pattern`` (refused at the first that is not ``what``)."""
        good = pc.match_substring_regex(text, pattern)
        if not pc.all(good).as_py():
            index = _first(pc.invert(good))
            self.fail(column, role, index // (per_row or 1), f"{text[index].as_py()!r} is not {what}")
        return text


def _first(mask: pa.Array | np.ndarray) -> int:
    """Index of the first true entry."""
    array = mask.to_numpy(zero_copy_only=False) if isinstance(mask, pa.Array | pa.ChunkedArray) else mask
    return int(np.argmax(array))


def _check_columns(file: ColumnarFile, schema: Schema) -> None:
    """Refuse a file that lacks a column the schema names, or (Parquet) holds one of the wrong type."""
    roles = [(schema.label, "label", _is_number), *((c, "dense", _is_number) for c in schema.dense)]
    for feature in schema.features:
        check = _is_integer if feature.ids == "offset" else _is_hashable
        roles.append((feature.column, f"feature {feature.name}", _listed(check) if feature.length else check))
    for column, role, accepts in roles:
        if column not in file.types:
            close = difflib.get_close_matches(column, list(file.types), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; its columns are {', '.join(file.types)}"
            raise ValueError(f"{file.path}: no column {column!r} ({role}, {schema.path}){hint}")
        if file.typed and not accepts(file.types[column]):
            raise ValueError(
                f"{file.path}: column {column!r} ({role}) holds {file.types[column]}, which is not "
                f"{accepts.__doc__}"
            )


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_number(kind: pa.DataType) -> bool:
    """a number or a boolean"""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _is_integer(kind: pa.DataType) -> bool:
    """an integer (ids = "offset")"""
    return pa.types.is_integer(kind)


def _is_hashable(kind: pa.DataType) -> bool:
    """text or an integer (hashed values)"""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return _is_text(kind) or pa.types.is_integer(kind)


def _listed(accepts):
    """``accepts`` for the values of a list column (or of text split at the separator)."""

    def check(kind: pa.DataType) -> bool:
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return accepts(kind.value_type)
        return _is_text(kind)

    check.__doc__ = f"a list column of {accepts.__doc__}, or text to split"
    return check
