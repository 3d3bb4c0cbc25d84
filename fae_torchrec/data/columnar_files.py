"""Parquet files (pyarrow) and CSV files with a header, read as Arrow record batches of chosen columns in
bounded memory, with the place of a row in the file as errors name it."""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

#: Rows of a Parquet file read at a time (at most; a row group is read whole).
CHUNK_ROWS = 1 << 16
#: Bytes of a CSV file parsed at a time.
CHUNK_BYTES = 1 << 24
#: Bytes a Parquet column chunk is streamed in.
READ_BUFFER = 1 << 20
#: A byte that is not UTF-8, as ``errors="surrogateescape"`` decodes it.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


class ColumnarFile:
    """One data file: its columns' Arrow types (``types``; CSV: all text) and its rows in record
    batches. ``typed``: whether the columns carry types (Parquet) or are text to parse (CSV)."""

    typed: bool

    def __init__(
        self, path: str, names: Sequence[str], types: Sequence[pa.DataType], named_in: tuple[str, str]
    ) -> None:
        """``names`` and ``types`` of the columns, in order; a name given twice is refused, the message
        naming where the names are (``named_in``: the place in the file, and what holds them)."""
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise ValueError(f"{path}{named_in[0]}: column {repeated!r} is named twice in {named_in[1]}")
        self.path = path
        self.types = dict(zip(names, types, strict=True))

    def batches(self, columns: Sequence[str]) -> Iterator[tuple[pa.RecordBatch, int]]:
        """``columns`` of the file in record batches, each with the index of its first row."""
        raise NotImplementedError

    def where(self, row: int) -> str:
        """Where row ``row`` (counted from 0) is, in the file's own terms."""
        raise NotImplementedError


class ParquetColumns(ColumnarFile):
    """A Parquet file, read ``chunk_rows`` rows at a time within its row groups; open only while read
    (a data set of more files than the open-file limit reads one at a time)."""

    typed = True

    def __init__(self, path: str, chunk_rows: int = CHUNK_ROWS) -> None:
        with self._opened(path) as file:
            schema = file.schema_arrow
            super().__init__(path, schema.names, schema.types, ("", "the file's schema"))
            metadata = file.metadata
            self.group_ends = np.cumsum(
                [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
            )
        self.chunk_rows = chunk_rows

    @staticmethod
    def _opened(path: str) -> pq.ParquetFile:
        try:
            # pre_buffer off: its read cache would keep every column chunk read until the file is closed,
            # so that memory would grow with the file instead of the chunk (benchmarks/bench_columnar.py);
            # a read buffer: a column chunk is streamed, not read whole, so a large row group costs less;
            # pages that carry a checksum (written with write_page_checksum=True) are verified
            return pq.ParquetFile(
                path, pre_buffer=False, buffer_size=READ_BUFFER, page_checksum_verification=True
            )
        except (pa.ArrowException, OSError) as error:
            raise ValueError(f"{path}: not a readable Parquet file: {error}") from error

    def batches(self, columns: Sequence[str]) -> Iterator[tuple[pa.RecordBatch, int]]:
        first = 0
        with self._opened(self.path) as file:
            try:
                for batch in file.iter_batches(batch_size=self.chunk_rows, columns=list(columns)):
                    yield batch, first
                    first += batch.num_rows
            except (pa.ArrowException, OSError) as error:
                raise ValueError(f"{self.path}: damaged after row {first}: {error}") from error

    def where(self, row: int) -> str:
        group = int(np.searchsorted(self.group_ends, row, side="right"))
        return f"row {row} (counted from 0, in row group {group})"


class CsvColumns(ColumnarFile):
    """A CSV file whose first line names its columns, parsed ``chunk_bytes`` at a time; every field is
    text (an empty field, or a blank line's, is the empty text), which the reader checks and converts.
    Lines are counted one a row: a quoted value spanning lines shifts the numbers errors give."""

    typed = False

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES) -> None:
        try:
            with open(path, "rb") as file:
                first_line = file.readline().decode("utf-8-sig")  # pyarrow skips a byte-order mark too
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}:1: cannot read a CSV header: {error}") from error
        header = next(csv.reader([first_line]), None)
        if not header:
            raise ValueError(f"{path}:1: no header line naming the columns")
        super().__init__(path, header, [pa.string()] * len(header), (":1", "the header"))
        self.chunk_bytes = chunk_bytes

    def batches(self, columns: Sequence[str]) -> Iterator[tuple[pa.RecordBatch, int]]:
        convert = pa_csv.ConvertOptions(
            include_columns=list(columns),
            column_types=dict.fromkeys(columns, pa.string()),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )
        first = 0
        try:
            reader = pa_csv.open_csv(
                self.path,
                read_options=pa_csv.ReadOptions(block_size=self.chunk_bytes),
                parse_options=pa_csv.ParseOptions(ignore_empty_lines=False),  # counted, and refused
                convert_options=convert,
            )
            for batch in reader:
                yield batch, first
                first += batch.num_rows
        except (pa.ArrowException, OSError) as error:
            raise ValueError(f"{self.path}:{self._bad_line(first, columns)}: {error}") from error

    def _bad_line(self, first: int, columns: Sequence[str]) -> int:
        """The first line after data row ``first`` whose fields are not the header's, or with bytes that
        are not UTF-8 in one of ``columns``, where pyarrow's parser stopped (its streaming reader names no
        row), or the line of row ``first``."""
        read = [index for index, name in enumerate(self.types) if name in columns]
        with open(self.path, newline="", encoding="utf-8", errors="surrogateescape") as file:
            lines = csv.reader(file)
            fields = len(next(lines, []))
            for row in lines:
                if (
                    lines.line_num > first + 1
                    and row
                    and (len(row) != fields or any(_NOT_UTF8.search(row[index]) for index in read))
                ):
                    return lines.line_num
        return first + 2

    def where(self, row: int) -> str:
        return f"line {row + 2}"


#: The ``--data`` kinds of columnar files.
FORMATS = ("parquet", "csv")


def open_columns(
    kind: str, path: str | os.PathLike, chunk_rows: int = CHUNK_ROWS, chunk_bytes: int = CHUNK_BYTES
) -> ColumnarFile:
    """The file ``path`` read as ``kind`` (``parquet``, ``chunk_rows`` rows at a time, or ``csv``,
    ``chunk_bytes`` at a time)."""
    if kind == "parquet":
        return ParquetColumns(os.fspath(path), chunk_rows)
    return CsvColumns(os.fspath(path), chunk_bytes)
