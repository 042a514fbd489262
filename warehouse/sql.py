"""Read-only SQL over the warehouse, and rendering results as an aligned table, CSV or JSON.

`nkb sql` sees the warehouse's tables and views and nothing else. Two walls keep it so:
- statements are checked before DuckDB runs them: only SELECT (WITH, DESCRIBE, SHOW, SUMMARIZE, VALUES, ...)
  and EXPLAIN of a SELECT; EXPLAIN ANALYZE executes what it explains, so it counts as what it wraps;
- the query runs in a sandbox: an in-memory DuckDB with the warehouse file attached read-only and the
  Parquet tables handed over as Arrow datasets, after which file access is switched off and the
  configuration locked. No path reaches DuckDB's file system, so neither a table function that reads or
  lists files (read_csv, read_text, glob, ...), nor COPY, nor ATTACH can touch anything. The plain
  `duckdb` CLI stays the tool for anything beyond the warehouse.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import io
import json
import math
import re
import sys
import threading
import textwrap
import time
from typing import Iterable, Iterator, TextIO

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from warehouse.parquet import CHECKED_PARQUET
from warehouse.schemas import DERIVED_VIEWS, NATIVE_TABLES, PARQUET_TABLES
from warehouse.store import DAMAGED_HINT, DamagedFileError, Warehouse
from warehouse.views import failing_select

_LEADING_COMMENTS = re.compile(r"^(\s|--[^\n]*(\n|$)|/\*.*?\*/)*", re.S)
_EXPLAIN = re.compile(r"^EXPLAIN\b", re.I)
_PIVOT = re.compile(r"^PIVOT\b", re.I)
_MISSING_FILE_TABLE = re.compile(r"Table with name (\S*[/\\.]\S*) does not exist")
_FAILED_STREAM = re.compile(r"reading the stream registered as '(\w+)' failed")  # a page failed its checksum


class ReadOnlyError(ValueError):
    """The query would write, attach, copy, configure or read something beyond the warehouse's tables."""


def _refuse(kind: str, statement: str) -> ReadOnlyError:
    return ReadOnlyError(f"refused: `nkb sql` is read-only and this is a {kind} statement "
                         f"({' '.join(statement.split())[:60]!r}). Only SELECT (incl. WITH, DESCRIBE, SHOW, "
                         "SUMMARIZE) and EXPLAIN of a SELECT are allowed; stages write the warehouse.")


def check_read_only(query: str) -> list[str]:
    """The query's statements, if every one only reads; else ReadOnlyError naming the first that does not."""
    try:
        statements = duckdb.extract_statements(query)
    except (duckdb.Error, ValueError) as exc:
        raise ValueError(f"SQL does not parse: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise ValueError("no SQL statement given")
    for st in statements:
        if st.type == duckdb.StatementType.EXPLAIN:
            # EXPLAIN ANALYZE runs what it explains: allow EXPLAIN only of what parses as one SELECT.
            explained = _EXPLAIN.sub("", _LEADING_COMMENTS.sub("", st.query), count=1)
            try:
                inner = duckdb.extract_statements(explained)
            except (duckdb.Error, ValueError):
                inner = []
            if len(inner) != 1 or inner[0].type != duckdb.StatementType.SELECT:
                raise _refuse("EXPLAIN ANALYZE or EXPLAIN of a non-SELECT", st.query)
        elif st.type == duckdb.StatementType.MULTI and _PIVOT.match(_LEADING_COMMENTS.sub("", st.query)):
            continue  # a PIVOT without an IN list: DuckDB finds the columns with a query first
        elif st.type != duckdb.StatementType.SELECT:
            raise _refuse(st.type.name, st.query)
    return [st.query for st in statements]


@contextlib.contextmanager
def sandbox(wh: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection that sees the warehouse's tables and views and cannot reach any file: an in-memory database
    given the Parquet tables as Arrow datasets and the native tables as Arrow tables (the warehouse file is not
    attached, so not even its path shows), with file access, spill folder and secrets switched off."""
    wh.registry()  # a warehouse made before the partition registry gets it now (if it can be written)
    with wh.read_connection() as native:  # small tables, read whole: runs, metrics, partitions
        present = {r[0] for r in native.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        copies = {name: native.sql(f'SELECT * FROM "{name}"').to_arrow_table() for name in NATIVE_TABLES
                  if name in present}
    with wh.lock(exclusive=False):
        con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                                 "autoload_known_extensions": False})
        try:
            for name, table in copies.items():
                con.register(name, table)
            for name, schema in PARQUET_TABLES.items():  # a foreign file is reported and left out
                files, damaged = wh.table_files(name)
                if damaged:  # the table fails in one line when read (and only then)
                    con.execute(f'CREATE TEMP VIEW "{name}" AS {failing_select(schema, str(damaged[0]))}')
                else:
                    con.register(name, ds.dataset([str(f) for f in files], schema=schema, format=CHECKED_PARQUET)
                                 if files else schema.empty_table())
            for name, body in DERIVED_VIEWS.items():
                con.execute(f'CREATE TEMP VIEW "{name}" AS {body}')
            for setting in ("temp_directory", "secret_directory", "home_directory", "extension_directory"):
                con.execute(f"SET {setting} = ''")  # no folder to spill to or read from, none shown
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con
        finally:
            con.close()


def row_counts(wh: Warehouse) -> list[tuple[str, str, int | None]]:
    """(table, kind, rows) for every table: Parquet, native, and derived views. A table that cannot be read (a
    damaged or missing file) has None rows, and its one line goes to standard error."""
    kinds = [(PARQUET_TABLES, "parquet"), (NATIVE_TABLES, "native"), (DERIVED_VIEWS, "view")]
    counts = []
    with sandbox(wh) as con:
        for names, kind in kinds:
            for name in names:
                try:
                    rows = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
                except duckdb.InvalidInputException as exc:
                    if DAMAGED_HINT not in str(exc):
                        raise
                    print(f"warning: {name}: {_damaged_line(exc)}", file=sys.stderr)
                    rows = None
                counts.append((name, kind, rows))
    return counts


def _damaged_line(exc: BaseException) -> str:
    """The DamagedFileError text inside DuckDB's error for a table that fails when read."""
    return str(exc).split("Error: ", 1)[-1]


def query(wh: Warehouse, sql: str, timeout: float | None = None) -> pa.Table:
    """Run read-only SQL against the warehouse; the last statement's result as an Arrow table."""
    with query_stream(wh, sql, timeout) as (schema, batches):
        return pa.Table.from_batches(list(batches), schema)


@contextlib.contextmanager
def query_stream(wh: Warehouse, sql: str, timeout: float | None = None,
                 batch_rows: int = 10_000) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """Run read-only SQL against the warehouse; the last statement's result as its schema and a stream of record
    batches, fetched as they are asked for, so that memory does not grow with the result.

    Each fetch runs on a worker thread while this one waits, so that Ctrl-C (KeyboardInterrupt) and `timeout`
    (seconds, for the whole query) stop it at once: DuckDB does not see a signal while it computes."""
    statements = check_read_only(sql)
    deadline = time.monotonic() + timeout if timeout else None
    with sandbox(wh) as con:
        def fetched(work):
            try:
                return _interruptible(con, work, deadline, timeout)
            except duckdb.Error as exc:
                raise _named(wh, exc) from None

        reader = fetched(lambda: _run_statements(con, statements, batch_rows))
        pending = iter(reader)

        def batches() -> Iterator[pa.RecordBatch]:
            while (batch := fetched(lambda: next(pending, None))) is not None:
                yield batch

        yield reader.schema, batches()


def _named(wh: Warehouse, exc: duckdb.Error) -> Exception:
    """What a failed query says: a refusal in the sandbox's words, or the damaged file it met, named; else DuckDB's
    own error."""
    if isinstance(exc, duckdb.PermissionException):
        return ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, no other files "
                             f"({str(exc).splitlines()[0]})")
    if isinstance(exc, duckdb.CatalogException):
        path = _MISSING_FILE_TABLE.search(str(exc))
        if path:  # FROM 'file.csv': with file access off DuckDB looks for a table of that name
            return ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, and "
                                 f"{path.group(1)!r} is a file")
        return exc
    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException, duckdb.InternalException)):
        if DAMAGED_HINT in str(exc):  # a table whose file was found damaged or missing before the query
            return DamagedFileError(_damaged_line(exc))
        stream = _FAILED_STREAM.search(str(exc))
        if stream:  # a page that failed its checksum: the table's file that differs, by digest
            table = stream.group(1)
            error = wh.read_error(table, wh.partition_files(table, strict=False), exc)
            return error if isinstance(error, Exception) else exc
        damaged = next(((path, why, rec) for path, why, rec in wh.check_files() if rec is not None), None)
        if damaged:
            return wh.damaged(*damaged)
    return exc


def _run_statements(con: duckdb.DuckDBPyConnection, statements: list[str], batch_rows: int) -> pa.RecordBatchReader:
    for st in statements[:-1]:
        con.execute(st).fetchall()  # finished, so that the connection takes the next one
    return con.sql(statements[-1]).to_arrow_reader(batch_rows)


class QueryTimeout(ValueError):
    """The query ran longer than its --timeout."""


def _interruptible(con: duckdb.DuckDBPyConnection, work, deadline: float | None, timeout: float | None):
    done = threading.Event()
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="nkb-sql", daemon=True).start()
    try:
        # Event.wait, not Thread.join: a KeyboardInterrupt inside join() can leave the thread marked as ended.
        while not done.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                con.interrupt()
                done.wait()
                raise QueryTimeout(f"the query ran longer than its timeout of {timeout:g} s and was stopped "
                                   "(--timeout sets it; 0 for none)")
    except KeyboardInterrupt:
        con.interrupt()
        done.wait()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _plain(value):
    """A JSON-ready Python value: lists stay lists, times become ISO strings, a whole DECIMAL (HUGEINT) an exact
    integer."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# JSON has no number for these; ProtoBuf's JSON mapping writes them as these strings, which is what readers expect.
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _json_ready(value):
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[str(value)]
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    return value


def _rows(batch: pa.RecordBatch) -> Iterator[tuple]:
    """A batch's rows as tuples, column by position (two columns of one name both kept)."""
    return zip(*(column.to_pylist() for column in batch.columns))


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_json(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: TextIO) -> None:
    """An array of row objects, a row at a time; list columns are JSON arrays. Strict JSON: NaN and the infinities
    are the strings "NaN", "Infinity" and "-Infinity"."""
    out.write("[")
    first = True
    for batch in batches:
        for row in _rows(batch):
            item = {name: _json_ready(_plain(v)) for name, v in zip(schema.names, row)}
            text = json.dumps(item, ensure_ascii=False, indent=1, allow_nan=False)
            out.write(("\n" if first else ",\n") + textwrap.indent(text, " "))
            first = False
    out.write("]\n" if first else "\n]\n")


def write_csv(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(schema.names)
    for batch in batches:
        writer.writerows([_cell(v) for v in row] for row in _rows(batch))


def write_text_table(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: TextIO, max_width: int = 60) -> None:
    """An aligned plain-text table; cells wider than `max_width` are cut with '…'. Columns take the widths of the
    first batch, so that rows stream out: a wider cell later on pushes its row's next cells along."""
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in schema.types]

    def cells(row) -> list[str]:
        texts = [_cell(v).replace("\n", " ") for v in row]
        return [t if len(t) <= max_width else t[: max_width - 1] + "…" for t in texts]

    widths, rows = None, 0
    for batch in batches:
        lines = [cells(row) for row in _rows(batch)]
        if widths is None:
            widths = _widths(schema.names, lines)
            out.write(_line(schema.names, widths, numeric) + "\n" + _line(["-" * w for w in widths], widths, numeric)
                      + "\n")
        out.writelines(_line(line, widths, numeric) + "\n" for line in lines)
        rows += len(lines)
    if widths is None:
        widths = _widths(schema.names, [])
        out.write(_line(schema.names, widths, numeric) + "\n" + _line(["-" * w for w in widths], widths, numeric) + "\n")
    out.write(f"({rows} row{'s' if rows != 1 else ''})\n")


def _widths(names: list[str], lines: list[list[str]]) -> list[int]:
    return [max([len(n)] + [len(line[i]) for line in lines]) for i, n in enumerate(names)]


def _line(cells: list[str], widths: list[int], numeric: list[bool]) -> str:
    return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()


WRITERS = {"table": write_text_table, "csv": write_csv, "json": write_json}


def _as_text(writer):
    def render(table: pa.Table, **options) -> str:
        out = io.StringIO()
        writer(table.schema, table.to_batches(), out, **options)
        return out.getvalue()
    render.__doc__ = f"A whole table as {writer.__name__} writes it, as text."
    return render


to_json, to_csv, to_text_table = (_as_text(WRITERS[fmt]) for fmt in ("json", "csv", "table"))
FORMATTERS = {fmt: _as_text(writer) for fmt, writer in WRITERS.items()}
