"""Peak memory of profiling Parquet files of 1, 2, 4 and 8 times ``--rows`` rows: it should follow the
chunk read at a time, not the file.

The script writes Avazu-like Parquet files: a 0/1 ``click`` label, 2 integer dense columns,
``--columns`` text columns of Zipf-distributed ids written as 8 hex digits (``--vocabulary`` distinct
ids a column) and a list column of 3 such ids an input, in row groups of ``--row-group`` rows. The
smaller files are the first rows of the largest; all are written a row group at a time, so that writing
them stays bounded too. Their schema hashes every table into ``--table-rows`` rows, so that no first pass
counts the values.

What is measured, each in a fresh child process, is that process's peak resident memory (``ru_maxrss``,
from ``wait4``):

* ``import only``: ``python -c "import fae_torchrec.cli"``, what the command holds before it reads a row
  (torch, torchrec, pyarrow, matplotlib);
* ``fae-torchrec profile --data parquet FILE --schema S.toml`` (``python -m fae_torchrec.cli``) on each
  file, which reads ``columnar_files.CHUNK_ROWS`` rows at a time;
* the chunk sweep: the same modules imported, then :class:`ColumnarSource` with ``chunk_rows`` set to each
  of ``--chunk-rows`` and :class:`AccessProfiler` as ``profile`` makes them (5% sample, ``--holdout``),
  on the smallest and the largest file.

``peak - import`` is a run's peak less the import-only peak: what reading and counting took. The
profiler's counts (``--table-rows`` int64s a table, paged in as rows are hit) are part of it and are
bounded by the tables, not the file. This script itself imports no numpy, pyarrow or torch (a child writes
the files): Linux carries a parent's peak over into a child's ``ru_maxrss`` at exec, so the script prints
its own peak, a floor under every figure.

    python benchmarks/bench_columnar.py                       # 250k to 2M rows: about 1.5 min on 2 cores
    python benchmarks/bench_columnar.py --rows 500k --chunk-rows 8192 65536 262144 --work /tmp/columnar
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 2**20


def _count(text: str) -> int:
    """A positive integer: ``250000``, ``250k`` or ``2M``."""
    scale = {"k": 10**3, "m": 10**6}.get(text[-1:].lower())
    try:
        value = float(text[:-1]) * scale if scale else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(value)


# --- in child processes -------------------------------------------------------------------------------


def _write_files(
    work: str,
    sizes: list[int],
    row_group: int,
    columns: int,
    vocabulary: int,
    zipf: float,
    table_rows: int,
    seed: int,
) -> None:
    """Write ``rows_N.parquet`` for each N of ``sizes`` (ascending; each the first rows of the next)
    and ``schema.toml`` into ``work``, a row group at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    weights = np.arange(1, vocabulary + 1, dtype=np.float64) ** -zipf
    cdf = np.cumsum(weights) / weights.sum()
    names = [f"C{i}" for i in range(1, columns + 1)]

    def hex_ids(salt: int) -> pa.Array:
        """``vocabulary`` distinct 8-hex-digit values (an odd multiplier is a bijection modulo 2^32)."""
        codes = (np.arange(vocabulary, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(salt)) % 2**32
        return pa.array([f"{code:08x}" for code in codes.tolist()], pa.string())

    values = [hex_ids(7919 * (i + 1)) for i in range(columns + 1)]  # the last one: the list column's

    def zipf_values(column: int, n: int) -> pa.Array:
        return values[column].take(pa.array(np.searchsorted(cdf, rng.random(n))))

    schema = pa.schema(
        [("click", pa.int8()), ("I1", pa.int32()), ("I2", pa.int64())]
        + [(name, pa.string()) for name in names]
        + [("tags", pa.list_(pa.string()))]
    )
    writers = [pq.ParquetWriter(os.path.join(work, f"rows_{n}.parquet"), schema) for n in sizes]
    for start in range(0, sizes[-1], row_group):
        n = min(row_group, sizes[-1] - start)
        offsets = pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32))
        table = pa.Table.from_arrays(
            [
                pa.array((rng.random(n) < 0.17).astype(np.int8)),
                pa.array(rng.poisson(3.0, n).astype(np.int32)),
                pa.array(rng.geometric(0.002, n).astype(np.int64)),
                *(zipf_values(i, n) for i in range(columns)),
                pa.ListArray.from_arrays(offsets, zipf_values(columns, 3 * n)),
            ],
            schema=schema,
        )
        for size, writer in zip(sizes, writers, strict=True):
            if start < size:
                writer.write_table(table.slice(0, min(n, size - start)), row_group_size=row_group)
    for writer in writers:
        writer.close()
    lines = ['label = "click"', 'dense = ["I1", "I2"]', 'dense_transform = "log"', ""]
    for name in names:
        lines += [f"[features.{name}]", f"rows = {table_rows}", ""]
    lines += ["[features.tags]", "length = 3", f"rows = {table_rows}", ""]
    Path(work, "schema.toml").write_text("\n".join(lines))


def _profile_directly(path: str, schema: str, chunk_rows: int, batch_size: int, holdout: int) -> None:
    """Profile ``path`` as ``fae-torchrec profile`` does, but reading ``chunk_rows`` rows at a time,
    having imported what the command imports."""
    import fae_torchrec.cli  # noqa: F401  (the modules the import-only figure counts)
    from fae_torchrec.command_line import PROFILE_SAMPLE
    from fae_torchrec.data.columnar import ColumnarSource
    from fae_torchrec.data.schema import load_schema
    from fae_torchrec.stats.profiler import AccessProfiler

    source = ColumnarSource("parquet", path, load_schema(schema), batch_size, chunk_rows=chunk_rows)
    stats = AccessProfiler(source.table_configs(16), PROFILE_SAMPLE["dlrm"], 0, holdout).profile(source)
    print(f"profiled {stats.num_sampled:,} of {stats.num_inputs:,} inputs")


# --- in this process ----------------------------------------------------------------------------------


def _measured(command: list[str], log: Path) -> tuple[float, float, str]:
    """Run ``command``; return its peak RSS in MiB, its wall seconds and its output (kept in ``log``)."""
    with open(log, "w") as out:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    output = log.read_text()
    if child.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited with status {child.returncode}:\n{output[-3000:]}")
    return usage.ru_maxrss * 1024 / MIB, seconds, output  # Linux counts ru_maxrss in KiB


def _this_script(function: str, **arguments: object) -> list[str]:
    """This script running ``function`` (``write`` or ``profile``) on ``arguments`` in a child process."""
    arguments = {k: str(v) if isinstance(v, Path) else v for k, v in arguments.items()}
    return [sys.executable, os.path.abspath(__file__), "_child", function, json.dumps(arguments)]


def _training_inputs(rows: int) -> int:
    """The inputs ``fae-torchrec profile`` counts of ``rows``: every ``--val-every``-th is the examples'
    validation, which it leaves out."""
    from fae_torchrec.defaults import DEFAULTS  # here, not in the children whose imports are measured

    return rows - rows // DEFAULTS["dlrm"].val_every


def _check_inputs(output: str, rows: int, command: str) -> None:
    """Stop unless ``output`` says that every one of ``rows`` inputs was read."""
    found = re.search(r"^profiled [\d,]+ of ([\d,]+) inputs", output, re.M)
    if not found or int(found[1].replace(",", "")) != rows:
        raise SystemExit(f"{command}: expected to read {rows:,} inputs:\n{output[-3000:]}")


def main() -> None:
    if sys.argv[1:2] == ["_child"]:
        function, arguments = sys.argv[2:]
        {"write": _write_files, "profile": _profile_directly}[function](**json.loads(arguments))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=_count, default=250_000, help="rows of the smallest file")
    parser.add_argument(
        "--multiples", type=_count, nargs="+", default=[1, 2, 4, 8], help="the files' rows, times --rows"
    )
    parser.add_argument("--row-group", type=_count, default=65_536, help="rows of a Parquet row group")
    parser.add_argument("--columns", type=_count, default=20, help="categorical text columns")
    parser.add_argument("--vocabulary", type=_count, default=100_000, help="distinct ids of a column")
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent of the ids' Zipf distribution")
    parser.add_argument("--table-rows", type=_count, default=2**17, help="rows every feature hashes into")
    parser.add_argument("--batch-size", type=_count, default=8192)
    parser.add_argument("--holdout", type=int, default=0, help="inputs the profile holds out (0: none)")
    parser.add_argument(
        "--chunk-rows", type=_count, nargs="+", default=[16_384, 65_536, 131_072],
        help="Parquet rows read at a time in the chunk sweep",
    )  # fmt: skip
    parser.add_argument("--work", help="folder for the files (default: a temporary one, removed after)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true",
        help="a smoke run: files of 10k and 20k rows in row groups of 2,048, a chunk sweep at 1,024",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.rows, args.multiples, args.row_group, args.chunk_rows = 10_000, [1, 2], 2048, [1024]
        args.vocabulary, args.table_rows = 5000, 4096
    if args.holdout < 0:
        parser.error(f"--holdout: must be at least 0, got {args.holdout}")
    args.multiples = sorted(set(args.multiples))
    if args.work is None:
        with tempfile.TemporaryDirectory(prefix="bench_columnar_") as work:
            _run(args, Path(work))
    else:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        _run(args, Path(args.work))


def _run(args: argparse.Namespace, work: Path) -> None:
    start = time.perf_counter()
    sizes = [m * args.rows for m in args.multiples]
    _, written, _ = _measured(
        _this_script("write", work=work, sizes=sizes, row_group=args.row_group, columns=args.columns,
                     vocabulary=args.vocabulary, zipf=args.zipf, table_rows=args.table_rows, seed=args.seed),
        work / "write.log",
    )  # fmt: skip
    files = [work / f"rows_{n}.parquet" for n in sizes]
    schema = work / "schema.toml"
    print(
        f"files: {', '.join(f'{n:,}' for n in sizes)} rows (each the first rows of the next) in row groups "
        f"of {args.row_group:,}; click, 2 integer columns, {args.columns} text columns of 8 hex digits "
        f"(Zipf {args.zipf} over {args.vocabulary:,} ids each), a list of 3; every table hashed into "
        f"{args.table_rows:,} rows; written in {written:.1f} s"
    )
    imported, _, chunk = _measured(
        [sys.executable, "-c", "import fae_torchrec.cli\n"
         "from fae_torchrec.data.columnar_files import CHUNK_ROWS\nprint(CHUNK_ROWS)"],
        work / "import.log",
    )  # fmt: skip
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB
    print(
        "measured here: the peak resident memory (ru_maxrss) of each child process, in MiB; 'peak - import' "
        f"is it less the peak of a child that only imports fae_torchrec.cli: {imported:.1f} MiB "
        f"(this script's own peak, a floor under every figure: {own:.1f} MiB)"
    )
    print(
        f"\nfae-torchrec profile --data parquet FILE --schema S.toml --holdout {args.holdout} --batch-size "
        f"{args.batch_size}, reading {int(chunk):,} rows at a time (columnar_files.CHUNK_ROWS)"
    )
    print(f"{'rows':>12}{'file MiB':>11}{'peak MiB':>11}{'peak - import':>15}{'seconds':>9}")
    peaks = []
    for n, path in zip(sizes, files, strict=True):
        command = [
            sys.executable, "-m", "fae_torchrec.cli", "profile", "--data", "parquet", str(path),
            "--schema", str(schema), "--out", str(work / f"stats_{n}.npz"), "--holdout", str(args.holdout),
            "--batch-size", str(args.batch_size),
        ]  # fmt: skip
        peak, seconds, output = _measured(command, work / f"profile_{n}.log")
        _check_inputs(output, _training_inputs(n), shlex.join(command))
        peaks.append(peak)
        print(
            f"{n:>12,}{path.stat().st_size / MIB:>11.1f}{peak:>11.1f}{peak - imported:>15.1f}{seconds:>9.1f}"
        )
    bytes_ratio = files[-1].stat().st_size / files[0].stat().st_size
    print(
        f"ratio of peaks, {sizes[-1]:,} rows / {sizes[0]:,} ({sizes[-1] / sizes[0]:g}x the rows, "
        f"{bytes_ratio:.1f}x the bytes): {peaks[-1] / peaks[0]:.2f}x; "
        f"peak - import: {(peaks[-1] - imported) / max(peaks[0] - imported, 1e-3):.2f}x"
    )

    print(
        f"\nchunk sweep: ColumnarSource(chunk_rows=X) + AccessProfiler (5% sample, holdout {args.holdout}, "
        f"batch {args.batch_size:,}) in a child process that imported fae_torchrec.cli"
    )
    print(f"{'chunk rows':>12}{'file rows':>12}{'peak MiB':>11}{'peak - import':>15}{'seconds':>9}")
    ends = [(sizes[0], files[0]), (sizes[-1], files[-1])] if len(sizes) > 1 else [(sizes[0], files[0])]
    for chunk_rows in args.chunk_rows:
        for n, path in ends:
            command = _this_script(
                "profile", path=path, schema=schema, chunk_rows=chunk_rows, batch_size=args.batch_size,
                holdout=args.holdout,
            )  # fmt: skip
            peak, seconds, output = _measured(command, work / f"sweep_{chunk_rows}_{n}.log")
            _check_inputs(output, n, shlex.join(command))
            print(f"{chunk_rows:>12,}{n:>12,}{peak:>11.1f}{peak - imported:>15.1f}{seconds:>9.1f}")
    print(f"\nin all {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
