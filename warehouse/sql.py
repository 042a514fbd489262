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
import re
import sys
import threading
import time
from typing import Iterator

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from warehouse.parquet import CHECKED_PARQUET
from warehouse.schemas import DERIVED_VIEWS, NATIVE_TABLES, PARQUET_TABLES, empty_select
from warehouse.store import DAMAGED_HINT, DamagedFileError, Warehouse

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
                    con.execute(f'CREATE TEMP VIEW "{name}" AS {empty_select(schema, failing_with=str(damaged[0]))}')
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
    """Run read-only SQL against the warehouse; the last statement's result as an Arrow table.

    The query runs on a worker thread while this one waits, so that Ctrl-C (KeyboardInterrupt) and `timeout`
    (seconds) stop it at once: DuckDB does not see a signal while it computes."""
    statements = check_read_only(sql)
    with sandbox(wh) as con:
        try:
            return _interruptible(con, lambda: _run_statements(con, statements), timeout)
        except duckdb.PermissionException as exc:
            raise ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, no other files "
                                f"({str(exc).splitlines()[0]})") from None
        except duckdb.CatalogException as exc:
            path = _MISSING_FILE_TABLE.search(str(exc))
            if path:  # FROM 'file.csv': with file access off DuckDB looks for a table of that name
                raise ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, and "
                                    f"{path.group(1)!r} is a file") from None
            raise
        except (duckdb.IOException, duckdb.InvalidInputException, duckdb.InternalException) as exc:
            if DAMAGED_HINT in str(exc):  # a table whose file was found damaged or missing before the query
                raise DamagedFileError(_damaged_line(exc)) from None
            stream = _FAILED_STREAM.search(str(exc))
            if stream:  # a page that failed its checksum: the table's file that differs, by digest
                table = stream.group(1)
                raise wh.read_error(table, wh.partition_files(table, strict=False), exc) from None
            damaged = next(((path, why, rec) for path, why, rec in wh.check_files() if rec is not None), None)
            if damaged:
                raise wh.damaged(*damaged) from None
            raise


def _run_statements(con: duckdb.DuckDBPyConnection, statements: list[str]) -> pa.Table:
    for st in statements[:-1]:
        con.execute(st).fetchall()  # finished, so that the connection takes the next one
    return con.sql(statements[-1]).to_arrow_table()


class QueryTimeout(ValueError):
    """The query ran longer than its --timeout."""


def _interruptible(con: duckdb.DuckDBPyConnection, work, timeout: float | None):
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
    deadline = None if not timeout else time.monotonic() + timeout
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
    """A JSON-ready Python value: lists stay lists, times become ISO strings."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_json(table: pa.Table) -> str:
    """An array of row objects; list columns are JSON arrays."""
    rows = [{k: _plain(v) for k, v in row.items()} for row in table.to_pylist()]
    return json.dumps(rows, ensure_ascii=False, indent=1)


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def to_csv(table: pa.Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow([_cell(row[c]) for c in table.column_names])
    return buf.getvalue()


def to_text_table(table: pa.Table, max_width: int = 60) -> str:
    """An aligned plain-text table; cells wider than `max_width` are cut with '…'."""
    names = table.column_names
    rows = []
    for row in table.to_pylist():
        cells = []
        for c in names:
            text = _cell(row[c]).replace("\n", " ")
            cells.append(text if len(text) <= max_width else text[: max_width - 1] + "…")
        rows.append(cells)
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [line(names), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(out)


FORMATTERS = {"table": to_text_table, "csv": to_csv, "json": to_json}
